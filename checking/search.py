"""The protocol-case strategies of `check`: exhaustive enumeration of small configurations (with swarm cases beside it)
and seeded random cases; each returns the first violation as a `Finding` (shrunk later by `checking.minimise`).
Pure: time and I/O come in through callables."""
from __future__ import annotations

import itertools
import random
from typing import Any, Callable, Iterator

import attrs

from checking.api import Runner, SearchContext
from model.faults import FAULT_KINDS, Eviction, FaultPlan
from model.finding import Finding
from model.harness import Case, Outcome, run_case
from model.outcome import OtherPrompt
from model.trace import Trace

__all__ = ["Runner", "LEVELS", "ENUM_RANKS", "ENUM_CHUNKS", "enumerate_cases", "enumeration_sizes", "other_prompts",
           "random_case", "search", "random_search", "plain_finding", "Enumeration", "RandomCases",
           "EnumerationCoverage", "RandomCoverage", "SWARM_EVERY"]

ENUM_RANKS = range(1, 5)
ENUM_CHUNKS = range(0, 11)


def enumeration_sizes() -> list[tuple[int, int]]:
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
          *sorted(dict.fromkeys(k.level for k in FAULT_KINDS if k.level is not None and k.family == "harness"),
                  key=_level_cost))
#: The level of the real-server faults (`model.faults.SERVER_KINDS`): enumerated only where a nemesis strikes them
#: (`enumerate_cases(NEMESIS_LEVEL, kinds=...)`).
NEMESIS_LEVEL = "nemesis"


def other_prompts(n: int, k: int) -> Iterator[OtherPrompt]:
    """Every other prompt the `prompts` level tries beside a k-chunk one: any shared prefix, stored before or
    after it; one of another tenant (nothing shared); then the same, evicting the other prompt's last chunk."""
    for evicted in ((), (k - 1,)) if k else ((),):
        for shared in range(k + 1):
            for after in (False, True):
                yield OtherPrompt(n_chunks=k, shared=shared, after=after, evicted=evicted)
        yield OtherPrompt(salt="tenant-b", n_chunks=k, after=True, evicted=evicted)


def enumerate_cases(level: str, sizes: list[tuple[int, int]] | None = None,
                    kinds: tuple | None = None) -> Iterator[Case]:
    """Every case of one enumeration level, smallest configurations first: every cached set (`cached`), the whole
    prompt cached beside each of `other_prompts` (`prompts`), or every cached set with every single fault of the kinds
    of that level (`model.faults.FAULT_KINDS`; the kinds of one
    level alternate fault by fault)."""
    if level not in LEVELS + (NEMESIS_LEVEL,):
        raise ValueError(f"unknown enumeration level {level!r} (known: {', '.join(LEVELS)}, {NEMESIS_LEVEL})")
    kinds = [k for k in FAULT_KINDS if k.level == level and (kinds is None or k in kinds)]
    for n, k in sizes or enumeration_sizes():
        for before in _evicted_sets(k):
            plan = FaultPlan.of(before_lookup=before)
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


def random_case(rng: random.Random, *, max_ranks: int = 8, max_chunks: int = 32, others: bool = True,
                min_ranks: int = 1) -> Case:
    """A seeded random case beyond the enumerated sizes: random sizes, cached set, faults and schedule seed."""
    n, k = rng.randint(min_ranks, max_ranks), rng.randint(0, max_chunks)
    faults = FaultPlan(**{kind.field: kind.draw(rng, n, k) for kind in FAULT_KINDS})
    salt, seed = f"r{rng.getrandbits(32):08x}", rng.getrandbits(32)
    tier = []
    while others and rng.random() < 0.3 and len(tier) < 3:  # other prompts in the same tier
        m = rng.randint(0, max_chunks)
        tier.append(OtherPrompt(salt=f"o{len(tier)}", n_chunks=m, shared=rng.randint(0, min(m, k)),
                                  after=rng.random() < 0.5,
                                  evicted=tuple(c for c in range(m) if rng.random() < 0.1)))
    return Case(n, k, salt=salt, faults=faults, seed=seed, others=tuple(tier))


#: Large random shapes sampled alongside enumeration (one every SWARM_EVERY cases), so a bug that needs a big shape
#: is found in seconds, not after the enumeration's ladder reaches it.
SWARM_EVERY = 16


@attrs.define
class EnumerationCoverage:
    """What the enumeration covered: cases (and the swarm's big random ones), the sizes it exhausted."""

    cases: int = 0
    swarm_cases: int = 0
    sizes_done: list[tuple[int, int]] = attrs.field(factory=list)
    largest: tuple[int, int] | None = None
    largest_swarm: tuple[int, int] | None = None

    def count(self, case: Case, swarm: bool = False) -> None:
        size = (case.n_ranks, case.n_chunks)
        if swarm:
            self.swarm_cases += 1
            self.largest_swarm = _larger(self.largest_swarm, size)
        else:
            self.cases += 1
            self.largest = _larger(self.largest, size)

    def exhausted(self) -> tuple[int, int] | None:
        """The largest box of exhausted sizes: every size up to (ranks, chunks) was enumerated to the end."""
        done = set(self.sizes_done)
        best = None
        for n in sorted({d[0] for d in done}):
            for k in sorted({d[1] for d in done}):
                if all((a, b) in done for a in range(1, n + 1) for b in range(0, k + 1)):
                    if best is None or n * (k + 1) > best[0] * (best[1] + 1):
                        best = (n, k)
        return best

    def text(self) -> str:
        box = self.exhausted()
        what = f"exhausted 1-{box[0]} ranks x 0-{box[1]} chunks" if box else "exhausted no size"
        swarm = f"; swarm {self.swarm_cases:,} random cases up to {_size(self.largest_swarm)}" if self.swarm_cases else ""
        return (f"{what} (every cached set; one other prompt in the tier; one fault of each kind); {self.cases:,} "
                f"cases, largest {_size(self.largest)}{swarm}")

    def to_json(self) -> dict:
        box = self.exhausted()
        return {"cases": self.cases, "swarm_cases": self.swarm_cases, "sizes_done": len(self.sizes_done),
                "exhausted": {"ranks": box[0], "chunks": box[1]} if box else None,
                "largest": list(self.largest) if self.largest else None}


@attrs.define
class RandomCoverage:
    """Seeded random cases beyond the enumerated sizes."""

    cases: int = 0
    largest: tuple[int, int] | None = None

    def count(self, case: Case) -> None:
        self.cases += 1
        self.largest = _larger(self.largest, (case.n_ranks, case.n_chunks))

    def text(self) -> str:
        return f"{self.cases:,} cases, largest {_size(self.largest)}"

    def to_json(self) -> dict:
        return {"cases": self.cases, "largest": list(self.largest) if self.largest else None}


def _larger(top: tuple[int, int] | None, size: tuple[int, int]) -> tuple[int, int]:
    return size if top is None or (sum(size), size[0]) > (sum(top), top[0]) else top


def _size(size: tuple[int, int] | None) -> str:
    return "-" if not size else f"{size[0]} ranks x {size[1]} chunks"


def plain_finding(case: Case, outcome: Outcome, strategy: str) -> Finding:
    """The finding of a protocol case with no client or protocol reference (strategies run outside `check`)."""
    return Finding(strategy=strategy, violations=list(outcome.violations), case=case, outcome=outcome,
                   trace=Trace.from_outcome(outcome, protocol_ref=None, origin=strategy))


FindingOf = Callable[[Case, Outcome, str], Finding]


def search(protocol: Any, *, runner: Runner = run_case, should_stop: Callable[[], bool] = lambda: False,
           seed: int = 0, coverage: EnumerationCoverage | None = None, levels: tuple[str, ...] = LEVELS,
           swarm: bool = False, others: bool = True, sizes: list[tuple[int, int]] | None = None,
           finding_of: FindingOf = plain_finding, min_ranks: int = 1, max_ranks: int = 8) -> Finding | None:
    """Enumerate every level for each size (`sizes`, default every enumerated size), smallest first; return the first
    violation. `swarm`: every `SWARM_EVERY`-th case is also a random one of any size up to `max_ranks` x 32 chunks
    (its own seeded stream)."""
    cov = coverage if coverage is not None else EnumerationCoverage()
    swarm_rng = random.Random(f"swarm-{seed}")
    for size in sizes if sizes is not None else enumeration_sizes():
        for level in levels:
            for case in enumerate_cases(level, [size]):
                if should_stop():
                    return None
                cov.count(case)
                out = runner(protocol, case)
                if out.violations:
                    return finding_of(case, out, f"enumerate:{level}")
                if swarm and cov.cases % SWARM_EVERY == 0:
                    big = random_case(swarm_rng, others=others, min_ranks=min(min_ranks, max_ranks),
                                      max_ranks=max_ranks)
                    cov.count(big, swarm=True)
                    out = runner(protocol, big)
                    if out.violations:
                        return finding_of(big, out, "swarm")
        cov.sizes_done.append(size)
    return None


def random_search(protocol: Any, *, runner: Runner = run_case, should_stop: Callable[[], bool] = lambda: False,
                  seed: int = 0, coverage: RandomCoverage | None = None, others: bool = True,
                  finding_of: FindingOf = plain_finding, min_ranks: int = 1, max_ranks: int = 8) -> Finding | None:
    """Seeded random cases until `should_stop()`; the first violation."""
    cov = coverage if coverage is not None else RandomCoverage()
    rng = random.Random(seed)
    while not should_stop():
        case = random_case(rng, others=others, min_ranks=min_ranks, max_ranks=max_ranks)
        cov.count(case)
        out = runner(protocol, case)
        if out.violations:
            return finding_of(case, out, "random")
    return None


def _multi_prompt(ctx: SearchContext) -> bool:
    """Whether cases may hold other prompts in the tier (the process runner runs one prompt at a time)."""
    return ctx.target.runner == "sim"


class Enumeration:
    """`check`'s enumeration: every small configuration, level by level (`LEVELS`), with swarm cases beside it."""

    name = "enumerate"

    def search(self, ctx: SearchContext) -> Finding | None:
        t = ctx.target
        levels = LEVELS if _multi_prompt(ctx) else tuple(level for level in LEVELS if level != "prompts")
        return search(t.protocol.obj, runner=ctx.run, should_stop=ctx.should_stop, seed=ctx.seed,
                      coverage=ctx.coverage.of(self.name, EnumerationCoverage), levels=levels, swarm=True,
                      others=_multi_prompt(ctx), finding_of=ctx.protocol_finding, min_ranks=t.ranks or 1,
                      max_ranks=t.rank_cap(8),
                      sizes=[s for s in enumeration_sizes() if t.allows(s[0])])


class RandomCases:
    """`check`'s last strategy: seeded random cases of any size up to 8 ranks x 32 chunks until the budget ends."""

    name = "random"

    def search(self, ctx: SearchContext) -> Finding | None:
        t = ctx.target
        return random_search(t.protocol.obj, runner=ctx.run, should_stop=ctx.should_stop, seed=ctx.seed,
                             coverage=ctx.coverage.of(self.name, RandomCoverage), others=_multi_prompt(ctx),
                             finding_of=ctx.protocol_finding, min_ranks=t.ranks or 1, max_ranks=t.rank_cap(8))
