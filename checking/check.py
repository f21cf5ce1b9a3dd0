"""`check` as a function: the strategies in turn within the budget, the first finding minimised, measured on fresh
stores and saved; the verdict with every strategy's coverage (`CheckResult`).

One deadline: the whole check ends `budget` seconds after it `started` (the command's start: setting up the target,
its clients and servers counts), and `Deadlines` splits that time from its end: the last `teardown` seconds close
what the check opened and end the process, the `finish` seconds before them minimise and measure a finding (a
finding made earlier has all the time up to `Deadlines.finish`), and the strategies search until `Deadlines.search`
(but for at least `MIN_SEARCH_SHARE` of the budget once the target is set up: a set-up slower than the rest of the
budget makes the check end late by the difference).
The schedule per kind of target is `runtime.registry.CHECK_SCHEDULE`, its names looked up in the table of strategies
`run_check` is handed (its `CheckPlan`'s `strategies`: `shardcheck.tables.STRATEGIES`): strategies with no share run first to their end
(their time counts in the budget); the others split what is left by their shares, the last taking the rest. No
strategy starts a unit of its work (a case, a run, a batch) that its longest unit so far says would end past its
phase (`_stopper`); a finding is measured by `CONFIRM_RUNS` runs on fresh stores (one when the run is
deterministic), none started that would end past `Deadlines.finish`. An
strategy the machine starved past its reruns (`model.timing.HarnessOutcome`) judged nothing: its reason is kept, the
strategies after it still run, and with no finding the verdict is `undecided`; nothing is saved for it.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, ContextManager, Mapping

import attrs

from checking.api import DEFAULT_RETENTION, Coverage, Runner, SearchContext, Target, target_kind
from checking.layers import ReplayOn, layer_of
from checking.replay import measure
from model.finding import Finding, Rate
from model.timing import HarnessOutcome
from runtime.registry import CHECK_SCHEDULE, resolve_strategy
from runtime.watchdog import forget

__all__ = ["ASKED_NEMESIS_SHARE", "FINISH_GRACE", "FINISH_SHARE", "TEARDOWN_SECONDS", "MIN_SEARCH_SHARE", "CONFIRM_RUNS", "MINIMISE_SHARE",
           "Deadlines", "CheckPlan", "CheckResult", "SaveError", "run_check"]

#: The most seconds kept at the end of the budget for minimising and measuring a finding made at the last moment ...
FINISH_GRACE = 5.0
#: ... and the share of the budget they may be at most.
FINISH_SHARE = 0.1
#: Seconds kept at the very end for closing what the check opened (clients, servers, deployments) and ending the
#: process, per kind of target (`checking.api.target_kind`); at most `FINISH_SHARE` of the budget.
TEARDOWN_SECONDS = {"in-memory": 0.3, "real": 2.0, "deployment": 1.5, "stack": 15.0}
#: The least share of the budget the search has after the set-up, however long that took (a machine so slow that
#: setting up takes more than the rest ends late by the difference, rather than search for nothing).
MIN_SEARCH_SHARE = 0.5
#: The share of the budget of the nemesis when real faults were asked for (`--nemesis KINDS`: it runs first); a
#: quarter (its share in the schedule) left a 15 s check no room for one 0.75 s pause and its three 0.5 s op timeouts.
ASKED_NEMESIS_SHARE = 0.5
#: Runs on fresh stores that measure a finding's rate before it is saved (one when deterministic).
CONFIRM_RUNS = 10
#: The share of the time left for a finding that minimising may take; measuring it has the rest.
MINIMISE_SHARE = 0.6


class SaveError(OSError):
    """The counterexample could not be written under `--out` (and nothing else: a client's own OSErrors, e.g. a
    `ConnectionError`, are not this)."""


@attrs.frozen
class Deadlines:
    """The one deadline of a check, split from its end (see the module doc): `search` (the strategies stop), `finish`
    (a finding's minimising and measuring stop) and `end` (`started + budget`: everything is closed)."""

    search: float
    finish: float
    end: float

    @classmethod
    def of(cls, started: float, budget: float, kind: str, ready: float | None = None) -> "Deadlines":
        """Those of a check of `budget` seconds from `started` on a target of `kind`, set up at `ready` (default:
        `started`); the search has at least `MIN_SEARCH_SHARE` of the budget from `ready` on."""
        teardown = min(TEARDOWN_SECONDS.get(kind, max(TEARDOWN_SECONDS.values())), FINISH_SHARE * budget)
        finish = min(FINISH_GRACE, FINISH_SHARE * budget)
        search = max(started + budget - teardown - finish, (started if ready is None else ready) +
                     MIN_SEARCH_SHARE * budget)
        return cls(search=search, finish=search + finish, end=search + finish + teardown)


@attrs.define(kw_only=True)
class CheckResult:
    """What one `check` found: the finding (or None: every property held), where its trace went, the coverage."""

    target: Target
    finding: Finding | None
    path: Path | None
    coverage: Coverage
    seconds: float
    budget: float
    seed: int
    #: Why the harness could not judge some of it (`model.timing.HarnessOutcome`s that stayed after their reruns).
    undecided: list[str] = attrs.field(factory=list)

    @property
    def verdict(self) -> str:
        """`violated` (a finding), else `undecided` (the harness could not judge all it ran), else `held`."""
        return "violated" if self.finding is not None else "undecided" if self.undecided else "held"

    def to_json(self) -> dict:
        """The contract's JSON of `check`."""
        t = self.target
        out: dict[str, Any] = {
            "protocol": _name(t.protocol), "client": _name(t.client), "verdict": self.verdict, "violations": [],
            "stats": {"cases": self.coverage.cases(), "seconds": round(self.seconds, 3), "budget": self.budget,
                      "seed": self.seed, "runner": t.runner, "coverage": self.coverage.to_json()}}
        if t.engine is not None:
            out["engine"] = t.engine.name
            if getattr(t.engine, "connector", None) is not None:
                out["connector"] = t.engine.connector
        if self.verdict == "undecided":
            out["undecided"] = list(self.undecided)
        f = self.finding
        if f is not None:
            seen = set()
            for v in f.violations:
                if v.property not in seen:
                    seen.add(v.property)
                    out["violations"].append({"property": v.property, "counterexample": str(self.path),
                                              "summary": v.summary})
            out["stats"]["counterexample"] = {"strategy": f.strategy, "kind": f.trace.kind, "notes": list(f.notes),
                                              "rate": f.rate.to_json() if f.rate else None,
                                              **layer_of(f.trace).stats(f)}
        return out


@attrs.frozen(kw_only=True)
class CheckPlan:
    """What one check is asked (the command line's options): `budget` seconds from `started` (monotonic; default:
    when `run_check` is called), the table of `strategies` (name -> `MOD:ATTR`, `shardcheck.tables.STRATEGIES`), the
    `seed`, where a finding is saved (`out_dir`), the store calls' bound (`op_timeout`), the explorer's workers,
    the enumeration to run first whatever the budget (`until_exhausted`: ranks, chunks) and `--retention`."""

    budget: float
    strategies: Mapping[str, str]
    seed: int = 0
    out_dir: str | Path = "counterexamples/found"
    op_timeout: float = 2.0
    explore_workers: int = 1
    until_exhausted: tuple[int, int] | None = None
    retention: float = DEFAULT_RETENTION
    started: float | None = None


def run_check(target: Target, plan: CheckPlan, *, run: Runner | None = None,
              fresh_runner: Callable[[], ContextManager[Runner]] | None = None, nemesis: Any = None,
              on_progress: Callable[[Coverage], None] = lambda coverage: None,
              note: Callable[[str], None] = lambda text: None) -> CheckResult:
    """Search `target` as `plan` asks, see the module doc. `run` runs a protocol case over the target's client (kept
    for the whole check); `fresh_runner()` a context giving one over fresh stores (the measurement); both None for a
    serving engine (its rows measure what they minimise). `nemesis`: the real faults it strikes
    (`checking.nemesis_strategy.NemesisPlan`); `on_progress` and `note`: where progress goes."""
    if target.engine is None and (run is None or fresh_runner is None):
        raise ValueError("a protocol-and-client target needs run and fresh_runner")
    budget, seed, out_dir = plan.budget, plan.seed, plan.out_dir
    t0 = time.monotonic() if plan.started is None else min(plan.started, time.monotonic())
    forget()  # every stall the strategies find is judged at the full limit (the shortcut serves minimising only)
    coverage = Coverage()
    ctx = SearchContext(target=target, run=run, seed=seed, op_timeout=plan.op_timeout, coverage=coverage,
                        explore_workers=plan.explore_workers, note=note, retention=plan.retention, nemesis=nemesis)
    if plan.until_exhausted is not None:  # the enumeration first, to the size asked, whatever the budget
        finding = _exhaust(ctx, plan.until_exhausted, on_progress)
        start = time.monotonic()
    else:
        finding, start = None, t0
    # (importing the strategies is set-up too: Hypothesis takes seconds on a loaded machine)
    schedule = _resolved(ctx, plan.strategies)
    ends = Deadlines.of(start, budget, target_kind(target), ready=time.monotonic())
    ctx.deadline, ctx.finish_by = ends.search, ends.finish
    try:
        if finding is None:
            finding = _schedule(ctx, on_progress, schedule)
    finally:
        for job in ctx.later:
            job.close()
    path = None
    if finding is not None:
        now = time.monotonic()
        finish_by = max(ends.finish, now)  # (past it: nothing is minimised, and one run measures)
        try:
            finding = _minimised(ctx, finding, now + MINIMISE_SHARE * (finish_by - now))
        except HarnessOutcome as exc:  # the finding stands (it was judged); only its minimising stopped
            finding.notes.append(f"minimising stopped: {exc.reason}")
        try:
            finding = _measured(ctx, finding, fresh_runner, finish_by)
        except HarnessOutcome as exc:
            finding.notes.append(f"measuring stopped: {exc.reason}")
            if finding.rate is None:
                finding.measured(Rate(1, 1))
        layer = layer_of(finding.trace)
        source = layer.source(client=target.client, protocol=target.protocol, engine=target.engine)
        if source is not None:  # (a replay on the unchanged subject never says `fixed`: checking.replay.judge)
            finding.trace.config["source"] = source
        try:
            path = finding.trace.save_unique(out_dir, layer.saved_under(target), finding.property)
        except OSError as exc:
            raise SaveError(f"cannot write the counterexample under {out_dir}: {exc}") from None
    return CheckResult(target=target, finding=finding, path=path, coverage=coverage,
                       seconds=time.monotonic() - t0, budget=budget, seed=seed, undecided=ctx.undecided)


def _name(part: Any) -> str:
    """A target's protocol or client in the verdict: `-` when the subject is a serving engine."""
    return "-" if part is None else part.name


def _resolved(ctx: SearchContext, strategies: Mapping[str, str]) -> list[tuple[str, float | str | None, Any]]:
    """The target's schedule: (name, share, strategy) in order, every strategy made from `strategies` (its module
    imported)."""
    schedule = CHECK_SCHEDULE.get(target_kind(ctx.target))
    if schedule is None:
        raise ValueError(f"no check schedule for a {target_kind(ctx.target)} target")
    if getattr(ctx.nemesis, "first", False):  # real faults asked for explicitly (--nemesis KINDS): they go first,
        schedule = tuple(sorted(((name, ASKED_NEMESIS_SHARE if name == "nemesis" else share)  # with half the budget
                                 for name, share in schedule), key=lambda step: step[0] != "nemesis"))
    return [(name, share, resolve_strategy(name, strategies)) for name, share in schedule]


def _schedule(ctx: SearchContext, on_progress: Callable[[Coverage], None],
              schedule: list[tuple[str, float | str | None, Any]]) -> Finding | None:
    """Every strategy of the target's schedule (`_resolved`) in turn; the first finding."""
    budgeted_from = None
    share_so_far = 0.0
    for name, share, strategy in schedule:
        now = time.monotonic()
        if now >= ctx.deadline:
            ctx.coverage.skip(name, "the budget ended first")
            continue
        if share is None:
            phase_end = ctx.deadline
        else:
            if budgeted_from is None:  # the budgeted strategies share what the unbudgeted ones left
                budgeted_from, left = now, ctx.deadline - now
            if share == "rest":
                phase_end = ctx.deadline
            else:
                share_so_far += float(share)
                phase_end = min(ctx.deadline, budgeted_from + share_so_far * left)
            if now >= phase_end:
                ctx.coverage.skip(name, "its share of the budget was spent before it")
                continue
        ctx.coverage.phase = name
        ctx.phase_end = phase_end
        late: list[Finding] = []
        ctx.should_stop = _stopper(ctx, phase_end, on_progress, late)
        try:
            finding = strategy.search(ctx)
        except HarnessOutcome as exc:  # nothing of it is judged; the strategies after it still run
            ctx.undecided.append(f"{name}: {exc.reason}")
            ctx.coverage.skip(name, f"undecided: {exc.reason}")
            continue
        if finding is not None or late:
            return finding if finding is not None else late[0]
    for job in ctx.later:  # what came due after the strategies that started it: waited for if it fits the budget
        try:
            finding = job.finish(ctx.deadline)
        except HarnessOutcome as exc:
            ctx.undecided.append(f"a check that came due later: {exc.reason}")
            continue
        if finding is not None:
            return finding
    return None


def _stopper(ctx: SearchContext, phase_end: float, on_progress: Callable[[Coverage], None],
             late: list[Finding]) -> Callable[[], bool]:
    """The phase's stop: a finding of a check that came due meanwhile (`ctx.later`, into `late`), or the phase's end
    as its strategy's longest unit of work so far foresees it: a strategy asks between two units (cases, runs,
    batches), so the longest time between two askings is the longest unit, and none is started that would end past
    `phase_end` (the first unit is not foreseen: strategies keep theirs small)."""
    asked = [None, 0.0]  # (when it was last asked, the longest time between two askings)

    def should_stop() -> bool:
        on_progress(ctx.coverage)
        if not late:
            late.extend(f for f in (job.poll() for job in ctx.later) if f is not None)
        now = time.monotonic()
        if asked[0] is not None:
            asked[1] = max(asked[1], now - asked[0])
        asked[0] = now
        return bool(late) or now + asked[1] >= phase_end
    return should_stop


def _exhaust(ctx: SearchContext, size: tuple[int, int], on_progress: Callable[[Coverage], None]) -> Finding | None:
    from checking.search import EnumerationCoverage, enumeration_sizes, search
    n, k = size
    ctx.coverage.phase = "exhaust"
    t = ctx.target
    return search(t.protocol.obj, runner=ctx.run, seed=ctx.seed, coverage=ctx.coverage.of("enumerate", EnumerationCoverage),
                  should_stop=lambda: on_progress(ctx.coverage) or False, finding_of=ctx.protocol_finding,
                  sizes=[s for s in enumeration_sizes() if s[0] <= n and s[1] <= k and t.allows(s[0])],
                  others=t.runner == "sim", swarm=False)


def _minimised(ctx: SearchContext, finding: Finding, finish_by: float) -> Finding:
    """The finding shrunk by its layer's minimiser (`checking.layers.Layer.minimise`), until `finish_by`."""
    return layer_of(finding.trace).minimise(ctx, finding, lambda: time.monotonic() >= finish_by)


def _measured(ctx: SearchContext, finding: Finding, fresh_runner: Callable[[], ContextManager[Runner]] | None,
              finish_by: float) -> Finding:
    """The finding with its rate: `CONFIRM_RUNS` runs on fresh stores (one when deterministic), unless its strategy
    measured it already. One that never shows again keeps the run that found it in its rate, and says so."""
    if finding.rate is not None:
        return finding
    if fresh_runner is None:
        raise ValueError(f"{finding.strategy} returned an unmeasured finding on a target with no runner")
    on = ReplayOn.of(ctx.target, runner=fresh_runner, op_timeout=ctx.op_timeout, nemesis=ctx.nemesis)
    last = [time.monotonic(), 0.0]  # (when the last run ended, how long the longest took)

    def stop() -> bool:  # no run is started that would end past finish_by
        now = time.monotonic()
        last[1], last[0] = max(last[1], now - last[0]), now
        return now + last[1] >= finish_by

    shown, made, _ = measure(finding.trace, on, runs=CONFIRM_RUNS, should_stop=stop)
    if not shown:
        finding.notes.append(f"did not show again on fresh stores in {made} run(s): racy, or left by earlier runs")
        return finding.measured(Rate.now(1, made + 1))
    return finding.measured(Rate.now(shown, made, deterministic=on.deterministic(finding.trace)))
