"""`shardcheck regen engine`: the findings of the engine properties on stock LMCache 0.5.6, as `engine` traces
under `counterexamples/engine/`, each with its measured rate and its expectation on both engines.

For each lookup mode, the engine search (`checking.serving.engine_search.engine_search`: the enumeration, then seeded
random cases) runs on `lmcache` for `budget` seconds collecting one finding per property and kind of case; each is
minimised (up to `MINIMISE_SECONDS`), measured (`MEASURE_RUNS` runs, up to `FIRM_RUNS` while its rate asks a replay
for more than `ENGINE_MAX_RUNS` clean runs; one that still does is not saved), written with `expect.lmcache =
reproduces`, and replayed on `lmcache-patched` (`checking.replay.judge`, by its rate) for that engine's expectation. A
trace already saved for the same property and kind of case is kept when its rate asks for fewer clean runs (a race
re-recorded by hand with its interleaving forced). Real Valkey servers and real engines: a quarter of an hour.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from runtime.registry import by_verdict
from shardcheck.tables import SERVING_ENGINES

__all__ = ["ENGINE_CORPUS", "build", "FIRM_RUNS", "MEASURE_RUNS", "MINIMISE_SECONDS", "STOCK", "FIXED"]

#: The stock engine the findings are searched for on, and the fixed one they are judged on (the registry's
#: `expect`: "violated", "held").
_DEPLOYMENTS = {name: e for name, e in SERVING_ENGINES.items() if e.seam == "deployment"}
(STOCK,), (FIXED,) = by_verdict(_DEPLOYMENTS, "violated"), by_verdict(_DEPLOYMENTS, "held")

ENGINE_CORPUS = Path(__file__).resolve().parents[1] / "counterexamples" / "engine"
MEASURE_RUNS = 10
MINIMISE_SECONDS = 45.0
#: The most runs a finding is measured for when its rate asks a replay for more than `ENGINE_MAX_RUNS` clean runs.
FIRM_RUNS = 40


def build(*, budget: float = 600.0, progress: Callable[[str], None] = lambda text: None,
          modes: tuple[str, ...] = ("sync", "async")) -> list[Path]:
    """Search, minimise, measure and write the engine findings (see the module docstring); the files written."""
    from checking.serving.engine_search import EngineStats, TraceSubject, call_of, deployment_source, engine_search, \
        engine_target
    from checking.layers import ReplayOn
    from checking.replay import judge

    written = []
    ENGINE_CORPUS.mkdir(parents=True, exist_ok=True)
    for mode in modes:
        stock, patched = (engine_target(STOCK, lookup=mode, engines=SERVING_ENGINES),
                          engine_target(FIXED, lookup=mode, engines=SERVING_ENGINES))
        stats = EngineStats()
        end = time.monotonic() + budget
        progress(f"engine findings, {mode} lookups: {budget:g} s of search on {STOCK} ...")
        subject = TraceSubject(engine=STOCK, expect={STOCK: "reproduces"})
        findings = engine_search(deployment_source(stock.make, subject=subject, lookups=(mode,), max_ranks=3),
                                 strategy="regen engine", seed=0, stats=stats, by_origin=True, should_stop=lambda: time.monotonic() >= end,
                                 minimise_seconds=MINIMISE_SECONDS, measure_runs=MEASURE_RUNS)
        progress(f"  {len(findings)} findings in {stats.cases} cases: " + ", ".join(
            f"{f.property} ({f.rate.k}/{f.rate.n})" for f in findings))
        for f in findings:
            f = _firm_rate(f, stock.make, subject, progress)
            if f is None:
                continue
            trace = f.trace
            origin = trace.origin.removeprefix("check:engine:")
            what = call_of(f.violations[0]) or origin.split("@")[0].split(":")[0]  # the call, else the kind of case
            path = ENGINE_CORPUS / f"{STOCK}-{mode}-{f.property}-{what}.json"
            kept = _better_on_disk(path, trace)
            if kept:
                progress(f"  kept {path.name}: {kept}")
                written.append(path)
                continue
            trace.save(path, overwrite=True)
            progress(f"  judging {path.name} ({f.rate.k}/{f.rate.n} on {STOCK}) on {FIXED} ...")
            verdict = judge(trace, ReplayOn(engine=patched))
            trace.expect[FIXED] = verdict.outcome
            trace.save(path, overwrite=True)
            written.append(path)
            progress(f"wrote {path} ({verdict.outcome} on {FIXED}: {verdict.why})")
    return written


def _firm_rate(finding: Any, make: Callable, subject: Any, progress: Callable[[str], None]) -> Any:
    """`finding` measured until its rate asks a replay for at most `ENGINE_MAX_RUNS` clean runs (up to `FIRM_RUNS`
    runs in all), or None, said in `progress`, when it still asks for more: a rare race is not saved (its `fixed`
    would take a replay of hundreds of real deployments; make its case force the interleaving instead)."""
    from checking.serving.engine_run import run_engine_case
    from checking.serving.engine_search import call_of, engine_finding, measure_rate
    from checking.replay import ENGINE_MAX_RUNS
    from model.finding import Rate
    k, n = finding.rate.k, finding.rate.n
    while k < n and Rate(k, n).runs_to_clear() > ENGINE_MAX_RUNS and n < FIRM_RUNS:
        more_k, more_n, _ = measure_rate(lambda case: run_engine_case(make, case), finding.case, finding.property,
                                         min(10, FIRM_RUNS - n), call=call_of(finding.violations[0]))
        k, n = k + more_k, n + more_n
    if k < n and Rate(k, n).runs_to_clear() > ENGINE_MAX_RUNS:
        progress(f"  not saved: {finding.property} ({finding.trace.origin}) showed in {k} of {n} runs, so a replay "
                 f"would need {Rate(k, n).runs_to_clear()} clean runs (at most {ENGINE_MAX_RUNS})")
        return None
    if (k, n) == (finding.rate.k, finding.rate.n):
        return finding
    return engine_finding(subject, finding.strategy, finding.case, finding.outcome, finding.violations,
                          Rate.now(k, n), finding.trace.origin.removeprefix("check:engine:"), notes=finding.notes)


def _better_on_disk(path: Path, new: Any) -> str:
    """Why the trace saved at `path` is kept instead of `new` (same property, a rate asking for fewer clean runs),
    or "" to write `new`."""
    from checking.layers import ReplayOn
    from checking.replay import clean_runs
    from model.trace import Trace, TraceError
    if not path.exists():
        return ""
    try:
        old = Trace.load(path)
    except TraceError:
        return ""
    on = ReplayOn()
    (old_need, _), (new_need, _) = clean_runs(old, on), clean_runs(new, on)
    if old.property != new.property or old_need >= new_need:
        return ""
    rate = lambda t: f"{t.config['rate']['k']}/{t.config['rate']['n']}"  # noqa: E731
    return (f"its rate ({rate(old)}) asks a replay for {old_need} clean runs, the new finding's ({rate(new)}) "
            f"for {new_need}")
