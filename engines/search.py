"""The `check` engines: exhaustive enumeration of small configurations, seeded random simulation, and
minimisation of the first violation found. Pure: time and I/O come in through callables."""
from __future__ import annotations

import itertools
import random
from typing import Any, Callable, Iterator

import attrs

from model.faults import Eviction, FaultPlan
from model.harness import Case, Outcome, run_case
from model.protocols import DEFAULT_WAIT_TIMEOUT

Runner = Callable[[Any, Case], Outcome]
ENUM_RANKS = range(1, 5)
ENUM_CHUNKS = range(0, 11)


def _sizes() -> list[tuple[int, int]]:
    """Every (ranks, chunks) of the enumeration, smallest first."""
    return sorted(itertools.product(ENUM_RANKS, ENUM_CHUNKS), key=lambda nk: (nk[0] + nk[1], nk[0]))


def _evicted_sets(k: int) -> Iterator[tuple[Eviction, ...]]:
    for mask in range(1 << k):
        yield tuple(Eviction(c) for c in range(k) if mask >> c & 1)


def enumerate_cases(level: str, sizes: list[tuple[int, int]] | None = None) -> Iterator[Case]:
    """Every case of one enumeration level, smallest configurations first.

    Levels: `cached` (every cached set, no later fault), `after-lookup` (every cached set x every single
    eviction between lookup and load), `during-load` (x every single eviction before every load step),
    `completions` (x every single lost completion, and a completion delayed past the wait timeout).
    """
    for n, k in sizes or _sizes():
        for before in _evicted_sets(k):
            plan = FaultPlan(evict_before_lookup=before)
            if level == "cached":
                yield Case(n, k, faults=plan)
            elif level == "after-lookup":
                for c in range(k):
                    yield Case(n, k, faults=attrs.evolve(plan, evict_after_lookup=(Eviction(c),)))
            elif level == "during-load":
                for step in range(2 * k + 3 * n):
                    for c in range(k):
                        yield Case(n, k, faults=attrs.evolve(plan, evict_during_load=(Eviction(c, step=step),)))
            elif level == "completions":
                for r in range(n):
                    for i in range(-(-k // n)):
                        yield Case(n, k, faults=attrs.evolve(plan, lost=((r, i),)))
                        yield Case(n, k, faults=attrs.evolve(plan, delayed=((r, i, 2 * DEFAULT_WAIT_TIMEOUT),)))
            else:
                raise ValueError(f"unknown enumeration level {level!r}")


LEVELS = ("cached", "after-lookup", "completions", "during-load")


def random_case(rng: random.Random, *, max_ranks: int = 8, max_chunks: int = 32) -> Case:
    """A seeded random case beyond the enumerated sizes: random sizes, cached set, faults and schedule seed."""
    n, k = rng.randint(1, max_ranks), rng.randint(0, max_chunks)
    before = tuple(Eviction(c) for c in range(k) if rng.random() < 0.1)
    faults: dict[str, Any] = {"evict_before_lookup": before}
    if k and rng.random() < 0.4:
        faults["evict_after_lookup"] = (Eviction(rng.randrange(k)),)
    if k and rng.random() < 0.4:
        faults["evict_during_load"] = (Eviction(rng.randrange(k), step=rng.randrange(2 * k + 3 * n)),)
    if k and rng.random() < 0.3:
        faults["lost"] = ((rng.randrange(n), rng.randrange(-(-k // n))),)
    if k and rng.random() < 0.3:
        faults["delayed"] = ((rng.randrange(n), rng.randrange(-(-k // n)), rng.choice([0.5, 2.0])),)
    return Case(n, k, salt=f"r{rng.getrandbits(32):08x}", faults=FaultPlan(**faults), seed=rng.getrandbits(32))


@attrs.define
class Found:
    """The first violation an engine found: the case, its outcome, and which engine."""

    case: Case
    outcome: Outcome
    engine: str


@attrs.define
class SearchStats:
    """What the engines covered."""

    cases: int = 0
    by_engine: dict[str, int] = attrs.field(factory=dict)
    sizes_done: list[list[int]] = attrs.field(factory=list)
    largest: dict[str, list[int]] = attrs.field(factory=dict)

    def count(self, engine: str, case: Case) -> None:
        self.cases += 1
        self.by_engine[engine] = self.by_engine.get(engine, 0) + 1
        self.largest[engine] = [case.n_ranks, case.n_chunks]


def search(protocol: Any, *, runner: Runner = run_case, should_stop: Callable[[], bool] = lambda: False,
           seed: int = 0, stats: SearchStats | None = None, levels: tuple[str, ...] = LEVELS,
           random_cases: bool = True) -> Found | None:
    """Enumerate every level for each size, smallest sizes first, then simulate random cases until
    `should_stop()`; return the first violation."""
    stats = stats if stats is not None else SearchStats()
    for size in (_sizes() if levels else []):
        for level in levels:
            for case in enumerate_cases(level, [size]):
                if should_stop():
                    return None
                stats.count("enumerate", case)
                out = runner(protocol, case)
                if out.violations:
                    return Found(case, out, f"enumerate:{level}")
        stats.sizes_done.append(list(size))
    rng = random.Random(seed)
    while random_cases and not should_stop():
        case = random_case(rng)
        stats.count("random", case)
        out = runner(protocol, case)
        if out.violations:
            return Found(case, out, "random")
    return None


def _shrinks(case: Case) -> Iterator[Case]:
    """Smaller neighbours of `case`: fewer ranks or chunks, fewer faults, no schedule or seed."""
    f = case.faults
    if case.n_ranks > 1:
        n = case.n_ranks - 1
        yield attrs.evolve(case, n_ranks=n, schedule=(), faults=_restrict(f, n, case.n_chunks))
    if case.n_chunks > 0:
        k = case.n_chunks - 1
        yield attrs.evolve(case, n_chunks=k, schedule=(), faults=_restrict(f, case.n_ranks, k))
    for field in ("evict_before_lookup", "evict_after_lookup", "evict_during_load", "lost", "delayed"):
        for i in range(len(getattr(f, field))):
            yield attrs.evolve(case, faults=f.without(field, i))
    for i, e in enumerate(f.evict_during_load):
        if e.step:
            moved = list(f.evict_during_load)
            moved[i] = attrs.evolve(e, step=e.step - 1)
            yield attrs.evolve(case, faults=attrs.evolve(f, evict_during_load=tuple(moved)))
    if case.seed is not None or case.schedule:
        yield attrs.evolve(case, seed=None, schedule=())
    if case.salt != "s0":
        yield attrs.evolve(case, salt="s0")


def _restrict(f: FaultPlan, n: int, k: int) -> FaultPlan:
    def ok(e: Eviction) -> bool:
        return e.chunk < k and (e.rank is None or e.rank < n)

    return FaultPlan(tuple(filter(ok, f.evict_before_lookup)), tuple(filter(ok, f.evict_after_lookup)),
                     tuple(filter(ok, f.evict_during_load)), tuple(x for x in f.lost if x[0] < n),
                     tuple(x for x in f.delayed if x[0] < n))


def minimise(protocol: Any, found: Found, *, runner: Runner = run_case, budget_runs: int = 2000,
             should_stop: Callable[[], bool] = lambda: False) -> Found:
    """Greedily shrink the case while it still violates the same property (smallest ranks, chunks, faults)."""
    target = found.outcome.violations[0].property
    best, runs = found, 0
    progress = True
    while progress and runs < budget_runs:
        progress = False
        for smaller in _shrinks(best.case):
            if should_stop() or runs >= budget_runs:
                return _lead_with(best, target)
            runs += 1
            out = runner(protocol, smaller)
            if target in out.violated():
                best = Found(smaller, out, found.engine)
                progress = True
                break
    return _lead_with(best, target)


def _lead_with(found: Found, prop: str) -> Found:
    """Put the violation of `prop` first (it names the trace)."""
    vs = found.outcome.violations
    vs.sort(key=lambda v: v.property != prop)
    return found
