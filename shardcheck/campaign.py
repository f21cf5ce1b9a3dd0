"""The engines of `shardcheck check`, run in turn inside the budget.

An in-memory client: exhaustive enumeration, the exhaustive explorer, the Hypothesis state machines, then seeded
random cases. Real clients: the concurrent layer (`engines.racy.search`: many ops at once on one store), the
Hypothesis machines (store layer, then protocol layer over real stores), enumeration, then random cases (the
explorer runs its own store model, so it is model-only).
"""
from __future__ import annotations

import time
from typing import Any, Callable

from engines.retention import DEFAULT_RETENTION, RetentionRun
from engines.search import LEVELS, Found, SearchStats, search

__all__ = ["MODEL_PHASES", "REAL_PHASES", "EXPLORE_SIZES", "run_engines"]

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


def run_engines(protocol: Any, client: Any, run: Callable, *, start: float, budget: float,
                should_stop: Callable[[], bool], stats: SearchStats, seed: int, op_timeout: float,
                multi_prompt: bool = True, explore_workers: int = 1, protocol_ref: str | None = None,
                retention: float = DEFAULT_RETENTION) -> Any:
    """The first violation: a `Found` (a protocol case), a store-ops `Trace`, or None. `client` is a
    `runtime.registry.Client`: an in-memory one gets the explorer (it runs its own store model), a real one the
    store layer first. `multi_prompt=False`: no case with other prompts in the tier (a runner that cannot run them).
    `explore_workers > 1`: the explorer's configurations run in that many local processes (by `protocol_ref`).
    After the scenarios a retention sample is planted (`engines.retention`, ageing `retention` seconds) and read
    back when due, while the engines run or at the end, within the budget."""
    end = start + budget
    stats.phase = "scenarios"  # the store client's fixed scenarios first: a client that fails one fails at once
    from engines.scenarios import run_scenarios
    notes: list[str] = []
    failed = run_scenarios(client, op_timeout=op_timeout, notes=notes)
    stats.by_engine["scenarios"] = len(failed)
    stats.store["shared_tier"] = "; ".join(notes) or "2 clients per server ran the shared-tier scenarios"
    if failed:
        return failed[0]
    aged = RetentionRun(client, retention=retention, op_timeout=op_timeout)
    try:
        def stop() -> bool:
            return aged.poll() is not None or should_stop()

        found = _phases(protocol, client, run, budget=end - time.monotonic(), should_stop=stop, stats=stats,
                        seed=seed, op_timeout=op_timeout, multi_prompt=multi_prompt, explore_workers=explore_workers,
                        protocol_ref=protocol_ref)
        if aged.found is not None:
            return aged.found
        return found if found is not None else aged.finish(end)
    finally:
        aged.close()
        stats.store["retention"] = aged.note


def _phases(protocol: Any, client: Any, run: Callable, *, budget: float, should_stop: Callable[[], bool],
            stats: SearchStats, seed: int, op_timeout: float, multi_prompt: bool, explore_workers: int,
            protocol_ref: str | None) -> Any:
    """The engines in turn, each in its share of `budget` (`MODEL_PHASES`, `REAL_PHASES`), then random cases."""
    levels = LEVELS if multi_prompt else tuple(level for level in LEVELS if level != "prompts")
    phases = MODEL_PHASES if client.in_memory else REAL_PHASES
    start = time.monotonic()
    phase_end = [start]

    def phase_over() -> bool:
        return should_stop() or time.monotonic() >= phase_end[0]

    for phase, share in phases.items():
        phase_end[0] = start + share * budget
        if phase_over():
            continue
        stats.phase = phase
        if phase == "enumerate":
            found = search(protocol, runner=run, should_stop=phase_over, seed=seed, stats=stats, random_cases=False,
                           swarm=True, levels=levels, others=multi_prompt)
        elif phase == "explore":
            found = _explore(protocol, run, phase_over, stats, workers=explore_workers, ref=protocol_ref,
                             phase_end=phase_end[0])
        elif phase == "concurrency":
            # a run is never cut short (a pending op would read as lost): start one only if it fits the phase
            margin = CONCURRENT_BOUND["lmcache" if client.self_bounded else "model"]
            found = _concurrency(client, lambda: phase_over() or time.monotonic() + margin >= phase_end[0],
                                 stats, seed, budget_end=start + budget - margin)
        else:
            found = _hypothesis(protocol, client, run, phase_over, stats, seed, op_timeout, multi_prompt)
        if found is not None:
            return found
    stats.phase = "random"
    return search(protocol, runner=run, should_stop=should_stop, seed=seed, stats=stats, levels=(),
                  random_cases=True, others=multi_prompt)


def _concurrency(client: Any, stop: Callable[[], bool], stats: SearchStats, seed: int, *,
                 budget_end: float) -> Any:
    """A `concurrent` trace from the concurrent layer on one fresh store of the client, or None. A finding is
    minimised and measured within the rest of the budget. A self-bounded (real) client gets its per-call timeout
    and a longer run bound."""
    from engines.racy import search, targets
    real = client.self_bounded
    options = {"op_timeout": CONCURRENT_OP_TIMEOUT} if real else {}
    bound = CONCURRENT_BOUND["lmcache" if real else "model"]
    fresh, note = targets(client, **options)
    stats.store["concurrency"] = f"one client per server ({note})" if note else "2 clients of one server"
    target = fresh()
    try:
        trace = search(target, client=client.name, seed=seed, should_stop=stop, bound=bound, stats=stats.by_engine,
                       minimise_stop=lambda: time.monotonic() >= budget_end, fresh=fresh)
    finally:
        target.close()
    if trace is not None:
        trace.config.update(options)
    return trace


def _explore(protocol: Any, run: Callable, stop: Callable[[], bool], stats: SearchStats, *, workers: int = 1,
             ref: str | None = None, phase_end: float = float("inf")) -> Found | None:
    from engines.explore import ExploreError, explore
    from model.calls import Stalled
    from runtime.watchdog import forget
    for n, k, faults in EXPLORE_SIZES:
        if stop():
            break
        try:
            if workers > 1 and ref is not None:  # the configurations shared out to local worker processes
                from engines.explore.shards import ShardSpec
                from engines.explore.workers import explore_workers
                left = phase_end - time.monotonic()
                if left <= 0:
                    break
                res = explore_workers(ShardSpec(protocol=ref, n_ranks=n, n_chunks=k, max_faults=faults), workers,
                                      timeout=left)
                if res.verdict == "incomplete":
                    break
            else:
                res = explore(protocol, n, k, max_faults=faults, should_stop=stop)
        except ExploreError as exc:  # a configuration the explorer cannot handle (too big, not deterministic)
            stats.by_engine["explore_refused"] = str(exc)
            return None
        except Stalled as exc:  # in the explorer's set-up (its store phase or lookups): no case to report;
            stats.by_engine["explore_stalled"] = str(exc)  # the case engines after it find the stall as a case,
            forget()  # judged at the full limit
            return None
        stats.by_engine["explore_states"] = stats.by_engine.get("explore_states", 0) + res.states
        stats.largest["explore"] = [n, k, faults]
        if res.verdict == "held":
            stats.explored.append({"ranks": n, "chunks": k, "faults": faults, "states": res.states})
        if res.verdict == "violated":
            out = run(protocol, res.counterexample)
            if out.violations:  # (a runner other than the simulator may not show it: the other engines go on)
                return Found(res.counterexample, out, "explore")
    return None


def _hypothesis(protocol: Any, client: Any, run: Callable, stop: Callable[[], bool],
                stats: SearchStats, seed: int, op_timeout: float, multi_prompt: bool = True) -> Any:
    """A protocol-layer failure is re-run as a `Case` (so it is minimised like the others); a store-layer
    failure is its store-ops `Trace`."""
    from properties.engine import hypothesis_search
    from properties.machines import PATH_CALLS
    before = dict(PATH_CALLS)
    traces, steps = hypothesis_search(protocol, client, should_stop=stop, seed=seed,
                                     store_layer=not client.in_memory, op_timeout=op_timeout)
    stats.by_engine["hypothesis_steps"] = stats.by_engine.get("hypothesis_steps", 0) + steps
    for path, count in PATH_CALLS.items():
        if count > before.get(path, 0):
            stats.paths[path] = stats.paths.get(path, 0) + count - before.get(path, 0)
    for trace in traces:
        if trace.kind == "store-ops":
            trace.client, trace.expect = client.name, {client.name: "reproduces"}
            return trace
        case = trace.case()
        if case.others and not multi_prompt:
            continue
        outcome = run(protocol, case)
        if outcome.violations:
            return Found(case, outcome, "hypothesis")
    return None
