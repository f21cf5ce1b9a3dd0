"""Exact partitioning of one exploration into shards, and the merge that gives the one-process result.

A shard explores the initial configurations `ci` with `ci % count == index` (round robin: the cached sets, or
the lookup's decision-tree leaves with the lazy initial state). Every state carries its configuration (`cf`),
so no state belongs to two shards: the shards' distinct states add up to the one-process count.

The merged violation is the one a single process finds first. The breadth-first search meets violations in
the order of `Search._key`: set-up before search, then by the level being expanded, then by the configuration
of the state (within a level the frontier is ordered by configuration: the initial frontier is, and a state's
successors keep its configuration). Restricted to one shard's configurations the order is the same, so the
least key over the shards' first violations is the one-process first violation, and its counterexample is the
same `Case`. One process stops there; its state count is each shard's count of the states it had discovered
before that point, which each shard records: its initial states by configuration, and per level the number of
states discovered before the level and a histogram of the new ones by configuration.
"""
from __future__ import annotations

import resource
import time
from typing import Any, Callable

import attrs

from model.cases import others_from_json
from model.harness import run_case
from model.outcome import Case, Violation
from runtime import registry

from checking.explore.bfs import Search
from checking.explore.result import ExploreError, ExploreResult

__all__ = ["ShardSpec", "ShardResult", "resolve_protocol", "run_shard", "merge", "incomplete", "explore_sharded"]


@attrs.frozen(kw_only=True)
class ShardSpec:
    """One exploration, as the shards of every worker run it: the protocol by short name or `MOD:ATTR` (each
    worker resolves it) and the options of `checking.explore.explore`."""

    protocol: str
    n_ranks: int
    n_chunks: int
    cached: tuple[int, ...] | None = None
    max_faults: int = 1
    reduction: bool = True
    lazy: bool = False
    properties: tuple[str, ...] | None = None
    step_bound: int | None = None
    salt: str = "s0"
    #: Other prompts in the tier, as `config.others` entries of a trace (`model.cases.others_to_json`).
    others: tuple[dict, ...] = ()


@attrs.define(kw_only=True)
class ShardResult:
    """What one shard found, with what the merge needs to count states up to another shard's violation."""

    index: int
    count: int
    verdict: str
    states: int
    transitions: int
    depth: int
    seconds: float
    configs: int
    peak_rss_mb: float
    cpu_seconds: float = 0.0
    key: tuple[int, int, int] | None = None
    case: Case | None = None
    violation: Violation | None = None
    init_added: list[int] = attrs.field(factory=list)
    level_start: list[int] = attrs.field(factory=list)
    level_hist: list[list[tuple[int, int]]] = attrs.field(factory=list)

    def states_before(self, key: tuple[int, int, int]) -> int:
        """The states this shard had discovered when one process meets the violation at `key`."""
        if key == self.key:
            return self.states
        phase, level, cfg = key
        if phase == 0:
            return sum(1 for c in self.init_added if c < cfg)
        if level >= len(self.level_start):  # this shard ran out of states before that level
            return self.states
        return self.level_start[level] + sum(k for c, k in self.level_hist[level] if c < cfg)


def resolve_protocol(ref: str) -> Any:
    """A short name or `MOD:ATTR` -> a protocol instance (`runtime.registry`); ExploreError naming what is wrong."""
    try:
        return registry.resolve_protocol(ref).obj
    except registry.ResolveError as exc:
        raise ExploreError(str(exc)) from None


def run_shard(spec: ShardSpec, index: int, count: int, *, should_stop: Callable[[], bool] | None = None,
              progress: Callable[[dict], None] | None = None,
              stop_after: Callable[[], int | None] | None = None) -> ShardResult:
    """Explore shard `index` of `count` of `spec` in this process.

    `stop_after()`: the level of a violation another shard found (None: none yet); once every level up to it
    is expanded, this shard's count up to that violation is known, and it stops with verdict "cut".
    """
    if not 0 <= index < count:
        raise ExploreError(f"shard {index} is not one of 0..{count - 1}")
    search = Search(resolve_protocol(spec.protocol), spec.n_ranks, spec.n_chunks,
                    cached=None if spec.cached is None else frozenset(spec.cached), max_faults=spec.max_faults,
                    reduction=spec.reduction, salt=spec.salt, step_bound=spec.step_bound,
                    properties=None if spec.properties is None else frozenset(spec.properties), lazy=spec.lazy,
                    shard=(index, count), others=tuple(others_from_json(o) for o in spec.others))
    cut = [False]

    def stop() -> bool:
        level = stop_after() if stop_after is not None else None
        if level is not None and search.depth > level:
            cut[0] = True
            return True
        return should_stop is not None and should_stop()

    res = search.run(stop, progress)
    verdict = "cut" if res.verdict == "incomplete" and cut[0] else res.verdict
    return ShardResult(index=index, count=count, verdict=verdict, states=res.states,
                       transitions=res.transitions, depth=res.depth, seconds=res.seconds, configs=res.configs,
                       peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                       cpu_seconds=time.process_time(),
                       key=getattr(search, "found_key", None) if res.verdict == "violated" else None,
                       case=res.counterexample, violation=res.violation, init_added=search.init_added,
                       level_start=search.level_start, level_hist=search.level_hist)


def merge(spec: ShardSpec, results: list[ShardResult], *, seconds: float | None = None,
          workers: int = 1) -> ExploreResult:
    """The one-process result of `spec` from every shard's result (each shard index of one count, once)."""
    if not results:
        raise ExploreError("no shard results to merge")
    count = results[0].count
    if sorted(r.index for r in results) != list(range(count)) or any(r.count != count for r in results):
        raise ExploreError(f"shard results are not shards 0..{count - 1} of one partition: "
                           f"{sorted((r.index, r.count) for r in results)}")
    wall = seconds if seconds is not None else max(r.seconds for r in results)
    peak = max(r.peak_rss_mb for r in results)
    cpu = {"cpu_seconds": sum(r.cpu_seconds for r in results),
           "critical_cpu_seconds": max(r.cpu_seconds for r in results)}
    configs = max(r.configs for r in results)
    found = [r for r in results if r.verdict == "violated"]
    cut = [r for r in results if r.verdict == "cut"]
    if found:
        first = min(found, key=lambda r: (r.key, r.index))
        short = [r.index for r in cut if first.key[0] and len(r.level_hist) <= first.key[1]]
        if short:
            raise ExploreError(f"shards {short} stopped before level {first.key[1]}, where the violation is")
        states = sum(r.states_before(first.key) for r in results)
        outcome = run_case(resolve_protocol(spec.protocol), first.case)
        match = [v for v in outcome.violations if v.property == first.violation.property]
        if not match:
            raise ExploreError(f"shard {first.index}'s counterexample no longer shows {first.violation.property!r}")
        return ExploreResult(verdict="violated", states=states, transitions=sum(r.transitions for r in results),
                             depth=first.depth, seconds=wall, counterexample=first.case, violation=match[0],
                             outcome=outcome, configs=configs, workers=workers, peak_rss_mb=peak, **cpu)
    if cut:
        raise ExploreError(f"shards {[r.index for r in cut]} were cut short, but no shard found a violation")
    verdict = "incomplete" if any(r.verdict == "incomplete" for r in results) else "held"
    return ExploreResult(verdict=verdict, states=sum(r.states for r in results),
                         transitions=sum(r.transitions for r in results), depth=max(r.depth for r in results),
                         seconds=wall, configs=configs, workers=workers, peak_rss_mb=peak, **cpu)


def incomplete(done: list[ShardResult], failed: list[tuple[int, str]], *, seconds: float,
               workers: int) -> ExploreResult:
    """The result of a run where shards `failed` ((index, why), each named) kept failing: "incomplete"."""
    return ExploreResult(verdict="incomplete", states=sum(r.states for r in done),
                         transitions=sum(r.transitions for r in done), depth=max((r.depth for r in done), default=0),
                         seconds=seconds, workers=workers,
                         peak_rss_mb=max((r.peak_rss_mb for r in done), default=None), failed_shards=sorted(failed))


def explore_sharded(spec: ShardSpec, count: int) -> ExploreResult:
    """Every shard of `spec` one after the other in this process, merged (what the workers' merge must equal)."""
    t0 = time.perf_counter()
    return merge(spec, [run_shard(spec, i, count) for i in range(count)], seconds=time.perf_counter() - t0)
