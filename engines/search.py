"""The `check` case engines: exhaustive enumeration of small configurations and seeded random simulation (the
first violation found is shrunk by `engines.minimise`). Pure: time and I/O come in through callables."""
from __future__ import annotations

import itertools
import random
from typing import Any, Callable, Iterator

import attrs

from model.faults import FAULT_KINDS, Eviction, FaultPlan
from model.harness import Case, Outcome, run_case
from model.outcome import OtherPrompt

__all__ = ["Runner", "LEVELS", "enumerate_cases", "random_case", "search", "Found", "SearchStats"]

Runner = Callable[[Any, Case], Outcome]
ENUM_RANKS = range(1, 5)
ENUM_CHUNKS = range(0, 11)


def _sizes() -> list[tuple[int, int]]:
    """Every (ranks, chunks) of the enumeration, smallest first."""
    return sorted(itertools.product(ENUM_RANKS, ENUM_CHUNKS), key=lambda nk: (nk[0] + nk[1], nk[0]))


def _evicted_sets(k: int) -> Iterator[tuple[Eviction, ...]]:
    for mask in range(1 << k):
        yield tuple(Eviction(c) for c in range(k) if mask >> c & 1)


def _level_cost(level: str) -> int:
    """Cases one cached set of 2 ranks x 3 chunks costs at `level`: levels run cheapest first."""
    return sum(sum(1 for _ in k.singles(2, 3)) for k in FAULT_KINDS if k.level == level)


#: The enumeration levels: every cached set alone; with another prompt in the same tier (`prompts`); then with
#: every single fault of each level's kinds.
LEVELS = ("cached", "prompts",
          *sorted(dict.fromkeys(k.level for k in FAULT_KINDS if k.level is not None), key=_level_cost))


def other_prompts(n: int, k: int) -> Iterator[OtherPrompt]:
    """Every other prompt the `prompts` level tries beside a k-chunk one: any shared prefix, stored before or
    after it; one of another tenant (nothing shared); then the same, evicting the other prompt's last chunk."""
    for evicted in ((), (k - 1,)) if k else ((),):
        for shared in range(k + 1):
            for after in (False, True):
                yield OtherPrompt(n_chunks=k, shared=shared, after=after, evicted=evicted)
        yield OtherPrompt(salt="tenant-b", n_chunks=k, after=True, evicted=evicted)


def enumerate_cases(level: str, sizes: list[tuple[int, int]] | None = None) -> Iterator[Case]:
    """Every case of one enumeration level, smallest configurations first: every cached set (`cached`), the whole
    prompt cached beside each of `other_prompts` (`prompts`), or every cached set with every single fault of the kinds
    of that level (`model.faults.FAULT_KINDS`; the kinds of one
    level alternate fault by fault)."""
    if level not in LEVELS:
        raise ValueError(f"unknown enumeration level {level!r} (known: {', '.join(LEVELS)})")
    kinds = [k for k in FAULT_KINDS if k.level == level]
    for n, k in sizes or _sizes():
        for before in _evicted_sets(k):
            plan = FaultPlan(evict_before_lookup=before)
            if level == "cached":
                yield Case(n, k, faults=plan)
                continue
            if level == "prompts":  # (every prompt cached: another prompt's harm does not need evictions of its own)
                if not before:
                    yield from (Case(n, k, others=(other,)) for other in other_prompts(n, k))
                continue
            for singles in zip(*(kind.singles(n, k) for kind in kinds)):
                for kind, item in zip(kinds, singles):
                    yield Case(n, k, faults=attrs.evolve(plan, **{kind.field: (item,)}))


def random_case(rng: random.Random, *, max_ranks: int = 8, max_chunks: int = 32) -> Case:
    """A seeded random case beyond the enumerated sizes: random sizes, cached set, faults and schedule seed."""
    n, k = rng.randint(1, max_ranks), rng.randint(0, max_chunks)
    faults = FaultPlan(**{kind.field: kind.draw(rng, n, k) for kind in FAULT_KINDS})
    salt, seed = f"r{rng.getrandbits(32):08x}", rng.getrandbits(32)
    others = []
    while rng.random() < 0.3 and len(others) < 3:  # other prompts in the same tier
        m = rng.randint(0, max_chunks)
        others.append(OtherPrompt(salt=f"o{len(others)}", n_chunks=m, shared=rng.randint(0, min(m, k)),
                                  after=rng.random() < 0.5,
                                  evicted=tuple(c for c in range(m) if rng.random() < 0.1)))
    return Case(n, k, salt=salt, faults=faults, seed=seed, others=tuple(others))


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
