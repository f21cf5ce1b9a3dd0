"""Unit tests of the simulator: collectives, desync, deadlock, hang, step bound, schedules."""
import pytest

from model.effects import AllGather, AllReduceMin, Broadcast, Get, GetAsync, Put, TIMED_OUT, Wait
from model.faults import NEVER
from model.sim import ScheduleError, seeded_chooser, simulate
from model.store import memory_factory


def _run(programs, **kw):
    return simulate(programs, memory_factory(len(programs)), phase="load", **kw)


def test_collectives_match_by_call_order():
    """AllReduceMin, AllGather and Broadcast deliver the NCCL results to every rank."""
    def prog(r):
        m = yield AllReduceMin(10 - r)
        g = yield AllGather(r * 2)
        b = yield Broadcast(f"from{r}", root=1)
        return (m, g, b)

    res = _run([prog(r) for r in range(3)])
    assert not res.violations
    assert res.results == {r: (8, [0, 2, 4], "from1") for r in range(3)}


def test_desync_is_named():
    """Ranks entering different kinds of k-th collective are a desync naming both."""
    def a():
        yield AllReduceMin(1)

    def b():
        yield AllGather(1)

    res = _run([a(), b()])
    assert [v.property for v in res.violations] == ["desync"]
    assert "AllReduceMin" in res.violations[0].summary and "AllGather" in res.violations[0].summary


def test_broadcast_root_mismatch_is_desync():
    """Broadcasts from different roots at the same call index are a desync."""
    def p(root):
        yield Broadcast(0, root=root)

    res = _run([p(0), p(1)])
    assert res.violations[0].property == "desync"


def test_deadlock_reports_wait_for_graph():
    """A rank finishing while another waits in a collective is a deadlock naming who waits for whom."""
    def waits():
        yield AllGather(0)

    def leaves():
        return {}
        yield  # pragma: no cover - makes this a generator

    res = _run([waits(), leaves()])
    [v] = res.violations
    assert v.property == "deadlock"
    assert v.detail["waits_for"] == {0: [1]} and v.detail["finished"] == [1]


def test_hang_on_lost_completion_without_timeout():
    """Waiting with timeout=None on a lost completion is a hang naming the key."""
    def p():
        h = yield GetAsync("k")
        return (yield Wait(h, None))

    res = _run([p()], late={(0, 0): NEVER})
    [v] = res.violations
    assert v.property == "hang" and "'k'" in v.summary


def test_bounded_wait_times_out_in_logical_time():
    """A bounded Wait on a lost or late completion returns TIMED_OUT and advances the clock."""
    def p():
        h1 = yield GetAsync("a")
        h2 = yield GetAsync("b")
        return [(yield Wait(h1, 1.5)), (yield Wait(h2, 1.0))]

    res = _run([p()], late={(0, 0): NEVER, (0, 1): 3.0})
    assert res.results[0] == [TIMED_OUT, TIMED_OUT]
    assert res.events[-1].time == 2.5


def test_delayed_completion_within_timeout_delivers():
    """A completion delayed less than the timeout delivers its value at issue time + delay."""
    stores = memory_factory(1)
    stores[0].put("a", b"x")

    def p():
        h = yield GetAsync("a")
        return (yield Wait(h, 5.0))

    res = simulate([p()], stores, phase="load", late={(0, 0): 2.0})
    assert res.results[0] == b"x" and res.events[-1].time == 2.0


def test_step_bound_exhaustion_is_termination():
    """A program that never stops is cut at the step bound and reported."""
    def forever():
        while True:
            yield Get("k")

    res = _run([forever()], step_bound=50)
    assert res.violations[0].property == "termination" and res.steps == 50


def test_explicit_schedule_is_followed_and_checked():
    """An explicit schedule decides who moves; naming a blocked rank is a ScheduleError."""
    def p(r):
        yield Put(f"k{r}", b"v")
        yield AllReduceMin(r)

    res = _run([p(0), p(1)], schedule=[1, 0, 1, 0])
    assert res.schedule == [1, 0, 1, 0] and not res.violations
    with pytest.raises(ScheduleError, match="step 2"):
        _run([p(0), p(1)], schedule=[0, 0, 0])


def test_same_seed_same_schedule():
    """A seeded scheduler is deterministic: the same seed gives the same trace."""
    def p(r):
        for i in range(4):
            yield Put(f"k{r}{i}", b"v")

    a = _run([p(r) for r in range(3)], chooser=seeded_chooser(7)).schedule
    b = _run([p(r) for r in range(3)], chooser=seeded_chooser(7)).schedule
    c = _run([p(r) for r in range(3)], chooser=seeded_chooser(8)).schedule
    assert a == b and a != c


def test_rank_program_exception_is_reported():
    """A rank program that raises is a termination violation naming the exception."""
    def bad():
        yield Get("k")
        raise KeyError("boom")

    res = _run([bad()])
    assert res.violations[0].property == "termination" and "KeyError" in res.violations[0].summary


def test_non_effect_yield_is_reported():
    """Yielding something that is not an effect is reported, not crashed on."""
    def bad():
        yield "not an effect"

    res = _run([bad()])
    assert res.violations[0].property == "termination" and "not an effect" in res.violations[0].summary


def test_wait_timeout_counts_from_the_wait_not_the_issue():
    """A completion that arrived while the rank waited on another handle is delivered, not TIMED_OUT."""
    stores = memory_factory(1)
    stores[0].put("a", b"A")

    def p():
        ha = yield GetAsync("a")
        hb = yield GetAsync("b")
        first = yield Wait(hb, 5.0)   # lost: times out at t=5
        second = yield Wait(ha, 1.0)  # arrived at t=3, before this wait began
        return [first, second]

    res = simulate([p()], stores, phase="load", late={(0, 1): NEVER, (0, 0): 3.0})
    assert res.results[0] == [TIMED_OUT, b"A"]


def test_negative_wait_timeout_is_reported():
    """A negative Wait timeout is a protocol error, not a clock that runs backwards."""
    def p():
        h = yield GetAsync("a")
        yield Wait(h, -3)

    res = _run([p()])
    assert res.violations[0].property == "termination" and "timeout" in res.violations[0].summary
