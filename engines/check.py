"""`check` as a function: the search engines in turn within the budget, the first finding minimised, measured on fresh
stores and saved; the verdict with every engine's coverage (`CheckResult`).

The schedule per kind of target is `runtime.registry.CHECK_SCHEDULE`: engines with no share run first to their end
(their time counts in the budget); the others split what is left by their shares, the last taking the rest. A finding
is minimised and measured (`CONFIRM_RUNS` runs on fresh stores, one when the run is deterministic) by
`finish_by = max(deadline, found at) + FINISH_GRACE`, so `check` ends within its budget plus a few seconds.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, ContextManager

import attrs

from engines.api import DEFAULT_RETENTION, Coverage, Runner, SearchContext, Target, target_kind
from engines.replay import ReplayOn, measure
from model.finding import Finding, Rate
from runtime.registry import CHECK_SCHEDULE, resolve_engine
from runtime.watchdog import forget

__all__ = ["FINISH_GRACE", "CONFIRM_RUNS", "MINIMISE_SHARE", "CheckResult", "run_check"]

#: Seconds past the budget (or past the moment of the finding, when later) that minimising and measuring may take.
FINISH_GRACE = 5.0
#: Runs on fresh stores that measure a finding's rate before it is saved (one when deterministic).
CONFIRM_RUNS = 10
#: The share of the time left for a finding that minimising may take; measuring it has the rest.
MINIMISE_SHARE = 0.6


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

    @property
    def verdict(self) -> str:
        return "held" if self.finding is None else "violated"

    def to_json(self) -> dict:
        """The contract's JSON of `check`."""
        t = self.target
        out: dict[str, Any] = {
            "protocol": t.protocol.name, "client": t.client.name, "verdict": self.verdict, "violations": [],
            "stats": {"cases": self.coverage.cases(), "seconds": round(self.seconds, 3), "budget": self.budget,
                      "seed": self.seed, "runner": t.runner, "coverage": self.coverage.to_json()}}
        if t.engine is not None:
            out["engine"] = t.engine.name
        f = self.finding
        if f is not None:
            seen = set()
            for v in f.violations:
                if v.property not in seen:
                    seen.add(v.property)
                    out["violations"].append({"property": v.property, "counterexample": str(self.path),
                                              "summary": v.summary})
            out["stats"]["counterexample"] = {"engine": f.engine, "kind": f.trace.kind, "notes": list(f.notes),
                                              "rate": f.rate.to_json() if f.rate else None}
            if f.case is not None:
                out["stats"]["counterexample"].update(n_ranks=f.case.n_ranks, n_chunks=f.case.n_chunks,
                                                      faults=f.case.faults.size())
            if f.trace.kind in ("store-ops", "concurrent"):
                out["stats"]["counterexample"]["ops"] = len(f.trace.ops)
        return out


def run_check(target: Target, *, run: Runner, fresh_runner: Callable[[], ContextManager[Runner]], budget: float,
              seed: int = 0, out_dir: str | Path = "counterexamples/found", op_timeout: float = 2.0,
              explore_workers: int = 1, until_exhausted: tuple[int, int] | None = None,
              on_progress: Callable[[Coverage], None] = lambda coverage: None,
              note: Callable[[str], None] = lambda text: None, retention: float = DEFAULT_RETENTION,
              nemesis: Any = None) -> CheckResult:
    """Search `target` within `budget` seconds (see the module doc). `run` runs a protocol case over the target's
    client (kept for the whole check); `fresh_runner()` a context giving one over fresh stores (the measurement)."""
    t0 = time.monotonic()
    forget()  # every stall the engines find is judged at the full limit (the shortcut serves minimising only)
    coverage = Coverage()
    ctx = SearchContext(target=target, run=run, seed=seed, op_timeout=op_timeout, coverage=coverage,
                        explore_workers=explore_workers, note=note, retention=retention, nemesis=nemesis)
    if until_exhausted is not None:  # the enumeration first, to the size asked, whatever the budget
        finding = _exhaust(ctx, until_exhausted, on_progress)
        start = time.monotonic()
    else:
        finding, start = None, t0
    ctx.deadline = start + budget
    try:
        if finding is None:
            finding = _schedule(ctx, on_progress)
    finally:
        for job in ctx.later:
            job.close()
    path = None
    if finding is not None:
        now = time.monotonic()
        finish_by = max(ctx.deadline, now) + FINISH_GRACE
        finding = _minimised(ctx, finding, now + MINIMISE_SHARE * (finish_by - now))
        finding = _measured(ctx, finding, fresh_runner, finish_by)
        try:
            path = finding.trace.save_unique(out_dir, target.protocol.name if finding.trace.kind == "protocol"
                                             else target.engine.name if target.engine is not None
                                             else target.client.name, finding.property)
        except OSError as exc:
            raise OSError(f"cannot write the counterexample under {out_dir}: {exc}") from None
    return CheckResult(target=target, finding=finding, path=path, coverage=coverage,
                       seconds=time.monotonic() - t0, budget=budget, seed=seed)


def _schedule(ctx: SearchContext, on_progress: Callable[[Coverage], None]) -> Finding | None:
    """Every engine of the target's schedule in turn; the first finding."""
    schedule = CHECK_SCHEDULE.get(target_kind(ctx.target))
    if schedule is None:
        raise ValueError(f"no check schedule for a {target_kind(ctx.target)} target")
    if getattr(ctx.nemesis, "first", False):  # real faults asked for explicitly (--nemesis KINDS): they go first
        schedule = tuple(sorted(schedule, key=lambda step: step[0] != "nemesis"))
    budgeted_from = None
    share_so_far = 0.0
    for name, share in schedule:
        now = time.monotonic()
        if now >= ctx.deadline:
            ctx.coverage.skip(name, "the budget ended first")
            continue
        if share is None:
            phase_end = ctx.deadline
        else:
            if budgeted_from is None:  # the budgeted engines share what the unbudgeted ones left
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
        finding = resolve_engine(name).search(ctx)
        if finding is not None or late:
            return finding if finding is not None else late[0]
    for job in ctx.later:  # what came due after the engines that started it: waited for if it fits the budget
        finding = job.finish(ctx.deadline)
        if finding is not None:
            return finding
    return None


def _stopper(ctx: SearchContext, phase_end: float, on_progress: Callable[[Coverage], None],
             late: list[Finding]) -> Callable[[], bool]:
    """The phase's stop: its end, or a finding of a check that came due meanwhile (`ctx.later`, into `late`)."""
    def should_stop() -> bool:
        on_progress(ctx.coverage)
        if not late:
            late.extend(f for f in (job.poll() for job in ctx.later) if f is not None)
        return bool(late) or time.monotonic() >= phase_end
    return should_stop


def _exhaust(ctx: SearchContext, size: tuple[int, int], on_progress: Callable[[Coverage], None]) -> Finding | None:
    from engines.search import EnumerationCoverage, enumeration_sizes, search
    n, k = size
    ctx.coverage.phase = "exhaust"
    t = ctx.target
    return search(t.protocol.obj, runner=ctx.run, seed=ctx.seed, coverage=ctx.coverage.of("enumerate", EnumerationCoverage),
                  should_stop=lambda: on_progress(ctx.coverage) or False, finding_of=ctx.protocol_finding,
                  sizes=[s for s in enumeration_sizes() if s[0] <= n and s[1] <= k and t.allows(s[0])],
                  others=t.runner == "sim", swarm=False)


def _minimised(ctx: SearchContext, finding: Finding, finish_by: float) -> Finding:
    """The finding shrunk by what its kind shrinks by, until `finish_by`."""
    stop = lambda: time.monotonic() >= finish_by  # noqa: E731
    kind = finding.trace.kind
    if kind == "protocol" and finding.case is not None:
        from engines.minimise import minimise
        original = finding
        finding = minimise(ctx.target.protocol.obj, finding, runner=ctx.run, budget_runs=500, should_stop=stop)
        if any(v.detail.get("provisional") for v in finding.violations):  # a stall judged at the shortened limit
            forget()
            out = ctx.run(ctx.target.protocol.obj, finding.case)
            finding = finding.with_case(finding.case, out).lead_with(original.property) \
                if original.property in out.violated() else original
        return finding
    if kind == "store-ops" and not finding.minimal:
        from engines.storeops import minimise_store_ops
        before = len(finding.trace.ops)
        trace, minimal = minimise_store_ops(finding.trace, ctx.target.client, should_stop=stop,
                                            options=dict(ctx.target.client_options), progress=ctx.note,
                                            control_for=ctx.nemesis.control if ctx.nemesis is not None else None)
        from model.trace import violations_of
        finding = attrs.evolve(finding, trace=trace, violations=violations_of(trace) or finding.violations,
                               notes=list(finding.notes))
        finding.notes.append(f"minimised from {before} to {len(trace.ops)} ops"
                             f"{' (1-minimal)' if minimal else ' (stopped before it was 1-minimal)'}")
    return finding


def _measured(ctx: SearchContext, finding: Finding, fresh_runner: Callable[[], ContextManager[Runner]],
              finish_by: float) -> Finding:
    """The finding with its rate: `CONFIRM_RUNS` runs on fresh stores (one when deterministic), unless its engine
    measured it already. One that never shows again keeps the run that found it in its rate, and says so."""
    if finding.rate is not None:
        return finding
    t = ctx.target
    on = ReplayOn(client=t.client, protocol=t.protocol, runner=fresh_runner, runner_name=t.runner,
                  options=dict(t.client_options), op_timeout=ctx.op_timeout, nemesis=ctx.nemesis)
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
