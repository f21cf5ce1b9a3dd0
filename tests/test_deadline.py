"""`check`'s one deadline, on a fake clock (no test here waits on real time): the budget split from its end
(`checking.check.Deadlines`), the schedule handing each phase what is left, no unit of work started that would end
past its phase, a finding's minimising and measuring within the budget, and Hypothesis batches sized to fit."""
from __future__ import annotations

import sys
import types

import attrs
import pytest

from adapters.catalogue import CLIENTS
from checking import check
from checking.api import Target
from checking.check import FINISH_GRACE, FINISH_SHARE, MIN_SEARCH_SHARE, TEARDOWN_SECONDS, Deadlines
from model.finding import Finding, Rate
from model.outcome import Violation
from model.trace import Trace
from properties.machine_search import BATCH, batch_size
from runtime.registry import CHECK_SCHEDULE, resolve_client, resolve_protocol


class Clock:
    """A monotonic clock that moves only when told."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(check, "time", types.SimpleNamespace(monotonic=c.monotonic))
    return c


#: What each fake strategy saw and did: (name, phase_end - now at its start, deadline, when it returned).
SEEN: list[tuple[str, float, float, float]] = []


def _engine(name: str, unit: float, *, units: int | None = None, finds: bool = False) -> type:
    """A fake strategy: units of work of `unit` seconds until its phase says stop (or `units` of them, ignoring the
    stop: a phase with no share runs to its end); `finds`: a finding when it stops."""
    def search(self, ctx):
        start = CLOCK[0].monotonic()
        done = 0
        while (done < units) if units is not None else not ctx.should_stop():
            CLOCK[0].advance(unit)
            done += 1
        SEEN.append((name, ctx.phase_end - start, ctx.deadline, CLOCK[0].monotonic()))
        if finds:
            trace = Trace(kind="store-ops", property="store-roundtrip", summary="a fake finding", protocol={},
                          client="fake", config={})
            return Finding(strategy=name, violations=[Violation("store-roundtrip", "a fake finding")], trace=trace,
                           rate=Rate(1, 1), minimal=True)
        return None
    return type(f"Fake_{name}", (), {"name": name, "search": search})


CLOCK: list[Clock] = []


@pytest.fixture
def fake_schedule(monkeypatch, clock):
    """A real-client schedule of fake strategies: `setup` (no share, 3 s), `a` (share 0.5, 1 s units), `b` (the rest,
    3 s units)."""
    SEEN.clear()
    CLOCK[:] = [clock]
    module = types.ModuleType("fake_strategies")
    module.Setup, module.A, module.B = _engine("setup", 3.0, units=1), _engine("a", 1.0), _engine("b", 3.0)
    monkeypatch.setitem(sys.modules, "fake_strategies", module)
    monkeypatch.setitem(CHECK_SCHEDULE, "real", (("setup", None), ("a", 0.5), ("b", "rest")))
    return module


def _target() -> Target:
    return Target(protocol=resolve_protocol("paper"),
                  client=resolve_client("properties.bad_stores:jitter_factory", CLIENTS))


#: The table of strategies the check is handed: the fake strategies.
FAKE_STRATEGIES = {name: f"fake_strategies:{attr}" for name, attr in (("setup", "Setup"), ("a", "A"), ("b", "B"))}


def _run(clock: Clock, budget: float, started: float) -> check.CheckResult:
    plan = check.CheckPlan(budget=budget, strategies=FAKE_STRATEGIES, started=started,
                           out_dir="/nonexistent-never-written")
    return check.run_check(_target(), plan, run=lambda protocol, case: None, fresh_runner=lambda: None)


def test_the_budget_is_split_from_its_end():
    """Teardown last, a finding's minimising and measuring before it, the search before that; the search keeps at
    least MIN_SEARCH_SHARE of the budget after a slow set-up (and the check then ends late by the difference)."""
    d = Deadlines.of(100.0, 60.0, "real")
    assert d.end == 160.0 and d.finish == 160.0 - TEARDOWN_SECONDS["real"]
    assert d.search == d.finish - min(FINISH_GRACE, FINISH_SHARE * 60)
    tiny = Deadlines.of(100.0, 2.0, "deployment")
    assert tiny.end == 102.0 and tiny.end - tiny.finish == pytest.approx(FINISH_SHARE * 2)
    slow = Deadlines.of(100.0, 10.0, "in-memory", ready=108.0)
    assert slow.search == 108.0 + MIN_SEARCH_SHARE * 10 and slow.end > 110.0
    assert Deadlines.of(100.0, 10.0, "in-memory", ready=101.0) == Deadlines.of(100.0, 10.0, "in-memory")


def test_the_schedule_hands_each_phase_what_is_left_and_ends_by_the_budget(fake_schedule, clock):
    """Set-up before the check (2 s) counts; the unshared engine runs to its end; `a` gets half of what it left and
    stops before a unit would pass its phase; `b` gets the rest; nothing ends past the search's deadline."""
    started = clock.now
    clock.advance(2.0)  # building the target: within the budget
    result = _run(clock, 30.0, started)
    ends = Deadlines.of(started, 30.0, "real")
    (setup, a, b) = SEEN
    assert setup[2] == ends.search and setup[3] == started + 5.0
    left = ends.search - setup[3]
    assert a[1] == pytest.approx(0.5 * left) and a[3] <= setup[3] + 0.5 * left
    assert a[3] >= setup[3] + 0.5 * left - 1.0  # (it used its share: it stopped only when a unit no longer fitted)
    assert b[1] == pytest.approx(ends.search - a[3]) and ends.search - 3.0 < b[3] <= ends.search
    assert result.verdict == "held" and result.seconds <= 30.0


def test_a_unit_longer_than_the_rest_of_the_phase_is_not_started(clock):
    """The longest unit so far foresees the next: asked after units of 1, 3 and 1 s, the stop says stop once less
    than 3 s are left; the first unit is not foreseen (an engine keeps it small)."""
    ctx = check.SearchContext(target=_target(), run=lambda p, c: None)
    stop = check._stopper(ctx, clock.now + 10.0, lambda cov: None, [])
    answers = []
    for unit in (1.0, 3.0, 1.0, 1.0, 1.0, 1.0):
        answers.append(stop())
        clock.advance(unit)
    assert answers == [False] * 5 + [True]  # (asked at 0, 1, 4, 5, 6 and 7: 7 + 3 >= 10)


def test_a_finding_is_finished_within_the_budget(fake_schedule, clock, monkeypatch):
    """A finding made as the search ends is minimised by `finish` (its share) and the check's end stays within the
    budget: the reserve was kept from the search."""
    fake_schedule.B = _engine("b", 3.0, finds=True)
    seen = {}

    def minimised(ctx, finding, finish_by):
        seen["minimise_by"] = finish_by
        return finding

    def measured(ctx, finding, fresh_runner, finish_by):
        seen["measure_by"] = finish_by
        clock.advance(finish_by - clock.now)  # measuring takes all it is given
        return finding
    monkeypatch.setattr(check, "_minimised", minimised)
    monkeypatch.setattr(check, "_measured", measured)
    monkeypatch.setattr(Trace, "save_unique", lambda self, *a, **k: "/fake/path.json")
    started = clock.now
    result = _run(clock, 30.0, started)
    ends = Deadlines.of(started, 30.0, "real")
    assert result.verdict == "violated"
    assert seen["measure_by"] == ends.finish and SEEN[-1][3] <= seen["minimise_by"] < ends.finish
    assert result.seconds == pytest.approx(ends.finish - started) and result.seconds <= 30.0


@pytest.mark.parametrize("left, per_example, examples", [
    (float("inf"), None, BATCH.max_examples),  # (outside check: whole batches)
    (5.0, None, 1),                            # the first batch of a phase: one example tells how long one takes
    (5.0, 2.0, 2), (5.0, 0.01, BATCH.max_examples), (1.5, 2.0, 0), (0.0, 0.1, 0),
])
def test_a_hypothesis_batch_is_sized_to_fit_its_phase(left, per_example, examples):
    assert batch_size(left, per_example) == examples


def test_the_deadline_fields_reach_the_engines():
    """`finish_by` is the context's, next to `deadline` and `phase_end` (the engines that minimise read it)."""
    fields = {f.name for f in attrs.fields(check.SearchContext)}
    assert {"phase_end", "deadline", "finish_by"} <= fields


def test_a_supervised_child_counts_its_budget_from_the_commands_start(monkeypatch):
    """The child's budget counts from its supervisor's start (handed over in STARTED); a value that cannot be this
    command's (after the child's own start, or long before it) gives the child's own start; an in-process call
    (not a supervised child) counts from its own call (None)."""
    import time

    from shardcheck import supervise
    monkeypatch.delenv(supervise.SUPERVISED, raising=False)
    assert supervise.started() is None
    own = supervise._own_start()
    assert own <= time.monotonic() and own > time.monotonic() - 3600
    monkeypatch.setenv(supervise.SUPERVISED, "1")
    monkeypatch.setenv(supervise.STARTED, repr(own - 1.5))
    assert supervise.started() == own - 1.5
    for stale in (own - supervise.STARTED_SLACK - 10, own + 30, "soon"):
        monkeypatch.setenv(supervise.STARTED, str(stale))
        assert abs(supervise.started() - own) < 1.0
