"""The engines of `shardcheck check`, run in turn inside the budget.

model client: exhaustive enumeration, the exhaustive explorer, the Hypothesis state machines, then seeded
random cases. Real clients: the concurrent layer (`engines.racy.search`: many ops at once on one store), the
Hypothesis machines (store layer, then protocol layer over real stores), enumeration, then random cases (the
explorer runs its own store model, so it is model-only).
"""
from __future__ import annotations

import time
from typing import Any, Callable

from engines.search import Found, SearchStats, search

#: Cumulative ends of each phase, as shares of the budget; random cases take the rest.
MODEL_PHASES = {"enumerate": 0.4, "explore": 0.65, "hypothesis": 0.85}
REAL_PHASES = {"concurrency": 0.3, "hypothesis": 0.5, "enumerate": 0.85}
#: Concurrent layer: the bound of one run, and the per-call timeout given to the lmcache clients (seconds).
CONCURRENT_BOUND = {"model": 1.0, "lmcache": 3.0}
CONCURRENT_OP_TIMEOUT = 1.0
#: Explorer configurations (ranks, chunks, faults after lookup), every cached set, smallest first.
EXPLORE_SIZES = tuple((n, k, 1) for n, k in ((1, 1), (2, 1), (2, 2), (1, 3), (3, 2), (2, 3), (3, 3), (2, 4), (4, 3),
                                             (3, 4), (4, 4), (3, 5), (4, 5), (5, 5), (4, 6), (5, 6), (4, 7))) + \
    tuple((n, k, 2) for n, k in ((2, 2), (2, 3), (3, 3), (3, 4), (4, 4), (4, 5)))


def run_engines(protocol: Any, client: str, factory: Any, run: Callable, *, start: float, budget: float,
                should_stop: Callable[[], bool], stats: SearchStats, seed: int) -> Any:
    """The first violation: a `Found` (a protocol case), a store-ops `Trace`, or None."""
    phases = MODEL_PHASES if client == "model" else REAL_PHASES
    phase_end = [start]

    def phase_over() -> bool:
        return should_stop() or time.monotonic() >= phase_end[0]

    for phase, share in phases.items():
        phase_end[0] = start + share * budget
        if phase_over():
            continue
        if phase == "enumerate":
            found = search(protocol, runner=run, should_stop=phase_over, seed=seed, stats=stats, random_cases=False)
        elif phase == "explore":
            found = _explore(protocol, run, phase_over, stats)
        elif phase == "concurrency":
            # a run is never cut short (a pending op would read as lost): start one only if it fits the phase
            margin = CONCURRENT_BOUND["lmcache" if client.startswith("lmcache") else "model"]
            found = _concurrency(client, factory, lambda: phase_over() or time.monotonic() + margin >= phase_end[0],
                                 stats, seed, budget_end=start + budget - margin)
        else:
            found = _hypothesis(protocol, client, factory, run, phase_over, stats, seed)
        if found is not None:
            return found
    return search(protocol, runner=run, should_stop=should_stop, seed=seed, stats=stats, levels=(),
                  random_cases=True)


def _concurrency(client: str, factory: Any, stop: Callable[[], bool], stats: SearchStats, seed: int, *,
                 budget_end: float) -> Any:
    """A `concurrent` trace from the concurrent layer on one fresh store of the client, or None. A finding is
    minimised and measured within the rest of the budget."""
    from engines.racy import search
    real = client.startswith("lmcache")
    options = {"op_timeout": CONCURRENT_OP_TIMEOUT} if real else {}
    bound = CONCURRENT_BOUND["lmcache" if real else "model"]
    stores = factory(1, **options)
    try:
        trace = search(stores[0], client=client, seed=seed, should_stop=stop, bound=bound, stats=stats.by_engine,
                       minimise_stop=lambda: time.monotonic() >= budget_end, fresh=lambda: factory(1, **options))
    finally:
        for s in stores:
            s.close()
    if trace is not None:
        trace.config.update(options)
    return trace


def _explore(protocol: Any, run: Callable, stop: Callable[[], bool], stats: SearchStats) -> Found | None:
    from engines.explore import explore
    from model.calls import Stalled
    from runtime.watchdog import forget
    for n, k, faults in EXPLORE_SIZES:
        if stop():
            break
        try:
            res = explore(protocol, n, k, max_faults=faults, should_stop=stop)
        except Stalled as exc:  # in the explorer's set-up (its store phase or lookups): no case to report;
            stats.by_engine["explore_stalled"] = str(exc)  # the case engines after it find the stall as a case,
            forget()  # judged at the full limit
            return None
        stats.by_engine["explore_states"] = stats.by_engine.get("explore_states", 0) + res.states
        stats.largest["explore"] = [n, k, faults]
        if res.verdict == "violated":
            return Found(res.counterexample, run(protocol, res.counterexample), "explore")
    return None


def _hypothesis(protocol: Any, client: str, factory: Any, run: Callable, stop: Callable[[], bool],
                stats: SearchStats, seed: int) -> Any:
    """A protocol-layer failure is re-run as a `Case` (so it is minimised like the others); a store-layer
    failure is its store-ops `Trace`."""
    from properties.engine import hypothesis_search
    traces, steps = hypothesis_search(protocol, None if client == "model" else factory, should_stop=stop,
                                     seed=seed, store_layer=client != "model")
    stats.by_engine["hypothesis_steps"] = stats.by_engine.get("hypothesis_steps", 0) + steps
    for trace in traces:
        if trace.kind == "store-ops":
            trace.client, trace.expect = client, {client: "reproduces"}
            return trace
        case = trace.case()
        outcome = run(protocol, case)
        if outcome.violations:
            return Found(case, outcome, "hypothesis")
    return None
