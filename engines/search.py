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

__all__ = ["Runner", "LEVELS", "enumerate_cases", "enumeration_sizes", "other_prompts", "random_case", "search",
           "Found", "SearchStats", "coverage_lines", "SWARM_EVERY"]

Runner = Callable[[Any, Case], Outcome]
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


def random_case(rng: random.Random, *, max_ranks: int = 8, max_chunks: int = 32, others: bool = True) -> Case:
    """A seeded random case beyond the enumerated sizes: random sizes, cached set, faults and schedule seed."""
    n, k = rng.randint(1, max_ranks), rng.randint(0, max_chunks)
    faults = FaultPlan(**{kind.field: kind.draw(rng, n, k) for kind in FAULT_KINDS})
    salt, seed = f"r{rng.getrandbits(32):08x}", rng.getrandbits(32)
    tier = []
    while others and rng.random() < 0.3 and len(tier) < 3:  # other prompts in the same tier
        m = rng.randint(0, max_chunks)
        tier.append(OtherPrompt(salt=f"o{len(tier)}", n_chunks=m, shared=rng.randint(0, min(m, k)),
                                  after=rng.random() < 0.5,
                                  evicted=tuple(c for c in range(m) if rng.random() < 0.1)))
    return Case(n, k, salt=salt, faults=faults, seed=seed, others=tuple(tier))


@attrs.define
class Found:
    """The first violation an engine found: the case, its outcome, and which engine."""

    case: Case
    outcome: Outcome
    engine: str


@attrs.define
class SearchStats:
    """What the engines covered: cases per engine, the sizes each one exhausted, the largest it tried."""

    cases: int = 0
    by_engine: dict[str, int] = attrs.field(factory=dict)
    sizes_done: list[list[int]] = attrs.field(factory=list)
    largest: dict[str, list[int]] = attrs.field(factory=dict)
    #: The engine running now (progress reports show it).
    phase: str = ""
    #: Explorer configurations searched to the end: {"ranks", "chunks", "faults", "states"}.
    explored: list[dict] = attrs.field(factory=list)
    #: Store-client read/lookup paths the properties called, and how often.
    paths: dict[str, int] = attrs.field(factory=dict)

    def count(self, engine: str, case: Case) -> None:
        self.cases += 1
        self.by_engine[engine] = self.by_engine.get(engine, 0) + 1
        top = self.largest.get(engine)
        size = [case.n_ranks, case.n_chunks]
        if top is None or (sum(size), size[0]) > (sum(top), top[0]):
            self.largest[engine] = size

    def exhausted(self) -> dict | None:
        """The enumeration's exhausted sizes as the largest box of them: every size up to `ranks` x `chunks`."""
        done = {tuple(d) for d in self.sizes_done}
        best = None
        for n in sorted({d[0] for d in done}):
            for k in sorted({d[1] for d in done}):
                if all((a, b) in done for a in range(1, n + 1) for b in range(0, k + 1)):
                    if best is None or n * (k + 1) > best[0] * (best[1] + 1):
                        best = (n, k)
        return None if best is None else {"ranks": best[0], "chunks": best[1]}

    def coverage(self) -> dict:
        """Per engine: what it exhausted, how much it ran, the largest size it tried (JSON)."""
        out: dict[str, dict] = {}
        if "enumerate" in self.by_engine:
            out["enumerate"] = {"cases": self.by_engine["enumerate"], "exhausted": self.exhausted(),
                                "sizes_done": len(self.sizes_done), "largest": self.largest.get("enumerate"),
                                "each_size": "every cached set; one other prompt in the tier; one fault of each kind"}
        if self.explored or "explore" in self.largest:
            out["explore"] = {"exhausted": self.explored, "states": sum(e["states"] for e in self.explored),
                              "largest": self.largest.get("explore")}
        if "hypothesis_steps" in self.by_engine:
            out["hypothesis"] = {"rule_steps": self.by_engine["hypothesis_steps"]}
        for engine in ("swarm", "random"):
            if engine in self.by_engine:
                out[engine] = {"cases": self.by_engine[engine], "largest": self.largest.get(engine)}
        if self.paths:
            out["paths"] = dict(sorted(self.paths.items()))
        return out

    def coverage_lines(self) -> list[str]:
        """`coverage()` in words, one line per engine."""
        return coverage_lines(self.coverage())


def coverage_lines(c: dict) -> list[str]:
    """A `SearchStats.coverage()` dict in words, one line per engine."""
    lines = []
    if "enumerate" in c:
        e = c["enumerate"]
        box = e["exhausted"]
        what = (f"exhausted 1-{box['ranks']} ranks x 0-{box['chunks']} chunks" if box else "exhausted no size")
        lines.append(f"enumeration: {what} ({e['each_size']}); {e['cases']:,} cases, largest "
                     f"{_size(e['largest'])}")
    if "explore" in c:
        x = c["explore"]
        done = ", ".join(f"{d['ranks']}x{d['chunks']}/{d['faults']}f" for d in x["exhausted"][-4:]) or "none"
        lines.append(f"explorer: {len(x['exhausted'])} configurations exhausted (every interleaving; last: {done}); "
                     f"{x['states']:,} states")
    if "hypothesis" in c:
        lines.append(f"hypothesis: {c['hypothesis']['rule_steps']:,} rule steps")
    for engine in ("swarm", "random"):
        if engine in c:
            lines.append(f"{engine}: {c[engine]['cases']:,} cases, largest {_size(c[engine]['largest'])}")
    if "paths" in c:
        lines.append("client paths exercised: " + ", ".join(f"{p} x{n}" for p, n in c["paths"].items()))
    return lines




def _size(size: list[int] | None) -> str:
    return "-" if not size else f"{size[0]} ranks x {size[1]} chunks"


#: Large random shapes sampled alongside enumeration (one every SWARM_EVERY cases), so a bug that needs a big shape
#: is found in seconds, not after the enumeration's ladder reaches it.
SWARM_EVERY = 16


def search(protocol: Any, *, runner: Runner = run_case, should_stop: Callable[[], bool] = lambda: False,
           seed: int = 0, stats: SearchStats | None = None, levels: tuple[str, ...] = LEVELS,
           random_cases: bool = True, swarm: bool = False, others: bool = True,
           sizes: list[tuple[int, int]] | None = None) -> Found | None:
    """Enumerate every level for each size (`sizes`, default every enumerated size), smallest first, then
    simulate random cases until `should_stop()`; return the first violation. `swarm`: during enumeration, every
    `SWARM_EVERY`-th case is a random one of any size up to 8 ranks x 32 chunks (its own seeded stream)."""
    stats = stats if stats is not None else SearchStats()
    swarm_rng = random.Random(f"swarm-{seed}")
    for size in (sizes or enumeration_sizes() if levels else []):
        for level in levels:
            for case in enumerate_cases(level, [size]):
                if should_stop():
                    return None
                stats.count("enumerate", case)
                out = runner(protocol, case)
                if out.violations:
                    return Found(case, out, f"enumerate:{level}")
                if swarm and stats.by_engine["enumerate"] % SWARM_EVERY == 0:
                    big = random_case(swarm_rng, others=others)
                    stats.count("swarm", big)
                    out = runner(protocol, big)
                    if out.violations:
                        return Found(big, out, "swarm")
        stats.sizes_done.append(list(size))
    rng = random.Random(seed)
    while random_cases and not should_stop():
        case = random_case(rng, others=others)
        stats.count("random", case)
        out = runner(protocol, case)
        if out.violations:
            return Found(case, out, "random")
    return None
