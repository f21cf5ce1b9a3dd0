"""The explorer's public functions: `explore`, `bench`, and the test hooks over terminal states."""
from __future__ import annotations

import time
from typing import Any, Callable, Iterable

from model.outcome import Outcome

from checking.explore.bfs import Search
from checking.explore.result import ExploreError, ExploreResult
from checking.explore.tries import freeze

__all__ = ["explore", "bench", "terminal_signatures", "terminal_outcomes", "outcome_summary"]


def explore(protocol: Any, n_ranks: int, n_chunks: int, *, cached: Iterable[int] | str | None = None,
            max_faults: int = 1, reduction: bool = True, should_stop: Callable[[], bool] | None = None,
            progress: Callable[[dict], None] | None = None, salt: str = "s0",
            step_bound: int | None = None, properties: Iterable[str] | None = None, lazy: bool = False,
            others: Iterable[Any] = ()) -> ExploreResult:
    """Breadth-first search of every interleaving and fault choice of `protocol`'s load (see the module doc).

    `cached`: None or "all" = every cached set (every subset of the store phase's (rank, chunk) units
    evicted before lookup), or the chunks cached at lookup. `max_faults`: faults after lookup per run.
    `reduction`: lazy eviction placement + partial-order reduction (sound; see the module doc).
    `should_stop()`: polled periodically; True stops with verdict "incomplete". `progress(stats)`:
    called periodically with a dict of counters. `properties`: only violations of these count (the
    search goes on past others, as TLC checks only the invariants it is given); None = every property.
    `lazy`: with every cached set, decide each unit's presence when first observed (`checking.explore.lazy`):
    the same verdicts from fewer states; counterexamples still name a concrete cached set. `others`: other prompts
    (`model.outcome.OtherPrompt`) in the same tier, stored, overwriting and evicted as the harness does (with the
    eager initial state only: the lazy one decides presence bits, and another prompt's bytes are no such bit).
    """
    if isinstance(cached, str) and cached != "all":
        raise ExploreError(f"cached must be 'all', None or chunk indices, got {cached!r}")
    search = Search(protocol, n_ranks, n_chunks, cached=None if cached in (None, "all") else frozenset(cached),
                    max_faults=max_faults, reduction=reduction, salt=salt, step_bound=step_bound,
                    properties=None if properties is None else frozenset(properties), lazy=lazy,
                    others=tuple(others))
    return search.run(should_stop, progress)


def bench(seconds: float = 5.0, *, protocol: Any = None, n_ranks: int = 5, n_chunks: int = 10, max_faults: int = 2,
          reduction: bool = False, max_states: int = 6_000_000) -> dict:
    """Distinct states per second of the explorer on the reference protocol, over about `seconds`.

    Default configuration: `PaperProtocol`, 5 ranks, 10 chunks, every cached set, at most 2 faults, no
    reduction: the full interleaving space (millions of states), stopped after `seconds` (or `max_states`,
    to bound memory). `states_per_s` is over wall-clock time; `cpu_seconds` tells whether the machine was shared.
    """
    from model.protocols import PaperProtocol
    protocol = PaperProtocol() if protocol is None else protocol
    holder: dict = {}
    deadline = time.perf_counter() + seconds
    c0 = time.process_time()
    res = explore(protocol, n_ranks, n_chunks, max_faults=max_faults, reduction=reduction,
                  progress=lambda stats: holder.update(stats),
                  should_stop=lambda: time.perf_counter() >= deadline or holder.get("states", 0) >= max_states)
    cpu = time.process_time() - c0
    return {"states_per_s": res.states / res.seconds if res.seconds else 0.0, "states": res.states,
            "seconds": res.seconds, "cpu_seconds": cpu, "transitions": res.transitions, "verdict": res.verdict,
            "config": {"protocol": getattr(protocol, "name", type(protocol).__name__), "n_ranks": n_ranks,
                       "n_chunks": n_chunks, "cached": "all", "max_faults": max_faults, "reduction": reduction}}


def terminal_signatures(protocol: Any, n_ranks: int, n_chunks: int, *, reduction: bool, max_faults: int = 1,
                        cached: Iterable[int] | str | None = None) -> set:
    """Every reachable terminal state's signature (initial configuration, each rank's received results and
    status, whether a fault happened), ignoring violations (a test hook). The reduced set must be a subset
    of the unreduced one, equal to it once the fault flag is dropped (lazy eviction only drops evictions
    nobody observes)."""
    search = Search(protocol, n_ranks, n_chunks, cached=None if cached in (None, "all") else frozenset(cached),
                    max_faults=max_faults, reduction=reduction, properties=frozenset(), record_terminals=True)
    search.run(None, None)
    return search.terminal_signatures


def terminal_outcomes(protocol: Any, n_ranks: int, n_chunks: int, *, reduction: bool = True,
                      max_faults: int = 1) -> set:
    """Every reachable terminal state as (cached set, planned, per rank its frozen result or None, violated
    properties): what a simulator run that ends with no rank able to move can produce (a test hook)."""
    search = Search(protocol, n_ranks, n_chunks, max_faults=max_faults, reduction=reduction, properties=frozenset(),
                    record_outcomes=True)
    search.run(None, None)
    return search.outcome_summaries


def outcome_summary(outcome: Outcome) -> tuple:
    """The same summary of a `run_case` outcome."""
    n = outcome.case.n_ranks
    results = tuple(freeze(outcome.results[r]) if r in outcome.results else None for r in range(n))
    return outcome.cached, outcome.planned, results, tuple(outcome.violated())
