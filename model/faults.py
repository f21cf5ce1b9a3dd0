"""Fault plans, and every kind of fault as a record: which keys are evicted when, which completions are lost or late.

A `FaultKind` carries everything the engines need to know about one kind: its `FaultPlan` field (also its key in
a trace), when it strikes, its JSON codec and validation, its text, how it shrinks, how enumeration and random
search generate it, and how the exhaustive explorer covers it (or that it does not). The simulator's hook is
`FaultPlan.simulator_options()`. Adding a kind: a field of `FaultPlan`, a record in `FAULT_KINDS`, and the
simulator's support for it if it strikes during the load (ARCHITECTURE.md).
"""
from __future__ import annotations

import random
from typing import Any, Callable, Iterator

import attrs

__all__ = ["Eviction", "FaultPlan", "FaultKind", "FAULT_KINDS", "FAULT_FIELDS", "NO_FAULTS", "kind_of",
           "DEFAULT_DELAY"]

#: The delay enumeration gives a delayed completion: twice the reference protocols' wait timeout (1 s).
DEFAULT_DELAY = 2.0


def _tuples(items) -> tuple:
    return tuple(tuple(i) for i in items)


@attrs.frozen
class Eviction:
    """Evict chunk `chunk`'s keys from `rank`'s store (`rank=None`: from every store that holds one).

    `step` is the load step before which it happens (only for evictions during load).
    """

    chunk: int
    rank: int | None = None
    step: int | None = None


@attrs.frozen(kw_only=True)
class FaultPlan:
    """Every fault injected into one run (one field per `FaultKind`).

    - `evict_before_lookup`: evictions after the store phase, before lookup (they shape the cached set);
    - `evict_after_lookup`: between lookup and load;
    - `evict_during_load`: before the given load step;
    - `lost`: `(rank, i)`: the completion of that rank's i-th `GetAsync` of the load never arrives;
    - `delayed`: `(rank, i, seconds)`: it arrives `seconds` logical seconds after it was issued.
    """

    evict_before_lookup: tuple[Eviction, ...] = attrs.field(default=(), converter=tuple)
    evict_after_lookup: tuple[Eviction, ...] = attrs.field(default=(), converter=tuple)
    evict_during_load: tuple[Eviction, ...] = attrs.field(default=(), converter=tuple)
    lost: tuple[tuple[int, int], ...] = attrs.field(default=(), converter=_tuples)
    delayed: tuple[tuple[int, int, float], ...] = attrs.field(default=(), converter=_tuples)

    def items(self) -> Iterator[tuple["FaultKind", Any]]:
        """Every fault of the plan with its kind, in `FAULT_KINDS` order."""
        for kind in FAULT_KINDS:
            for item in getattr(self, kind.field):
                yield kind, item

    def after_lookup(self) -> bool:
        """Whether any fault happens after the lookup (maximality is only claimed without one)."""
        return any(kind.when != "before-lookup" for kind, _ in self.items())

    def size(self) -> int:
        """How many faults the plan injects (what minimisation shrinks)."""
        return sum(1 for _ in self.items())

    def without(self, field: str, index: int) -> "FaultPlan":
        """This plan less entry `index` of `field`."""
        items = list(getattr(self, field))
        del items[index]
        return attrs.evolve(self, **{field: tuple(items)})

    def restricted(self, n_ranks: int, n_chunks: int) -> "FaultPlan":
        """The faults that still fit `n_ranks` ranks and `n_chunks` chunks."""
        return FaultPlan(**{k.field: tuple(x for x in getattr(self, k.field) if k.fits(x, n_ranks, n_chunks))
                            for k in FAULT_KINDS})

    def refitted(self, n_ranks: int, n_chunks: int, how: str = "owner", *, was: int | None = None) -> "FaultPlan":
        """Every fault re-placed to fit `n_ranks` x `n_chunks` (`FaultKind.refit`), so that a smaller shape keeps
        the fault that made a case fail; one that cannot be re-placed is dropped. `how` (`REFITS`): "owner" moves
        a chunk that no longer exists down to the last chunk with the same owner, "shift" moves every chunk down by
        as many chunks as the shape lost (`was` chunks before; a fault keeps its distance from the end), "last"
        puts it on the last chunk; ranks wrap, a completion's GetAsync index is cut to the rank's share."""
        out = {}
        for k in FAULT_KINDS:
            placed = (x if k.fits(x, n_ranks, n_chunks) and how != "shift"
                      else k.refit(x, n_ranks, n_chunks, how, n_chunks if was is None else was)
                      for x in getattr(self, k.field))
            out[k.field] = tuple(dict.fromkeys(x for x in placed if x is not None and k.fits(x, n_ranks, n_chunks)))
        return FaultPlan(**out)

    def simulator_options(self) -> dict:
        """The load simulator's fault options (`model.sim.Simulator`): what strikes during the load."""
        return {"evictions": self.evict_during_load, "lost": self.lost, "delayed": self.delayed}

    def text(self) -> str:
        """The plan in words."""
        return "; ".join(kind.text(item) for kind, item in self.items()) or "no fault"

    def to_json(self) -> dict:
        return {kind.field: [kind.to_json(x) for x in getattr(self, kind.field)] for kind in FAULT_KINDS}

    @classmethod
    def from_json(cls, data: Any) -> "FaultPlan":
        """The plan of a trace's `faults` object; `ValueError` naming the kind and the entry when malformed."""
        if not isinstance(data, dict):
            raise ValueError(f"expected an object, got {type(data).__name__}")
        unknown = set(data) - set(FAULT_FIELDS)
        if unknown:
            raise ValueError(f"unknown fault kind {sorted(unknown)[0]!r} (known: {', '.join(FAULT_FIELDS)})")
        fields = {}
        for kind in FAULT_KINDS:
            raw = data.get(kind.field, [])
            if not isinstance(raw, list):
                raise ValueError(f"{kind.field}: expected a list")
            fields[kind.field] = tuple(_decoded(kind, i, x) for i, x in enumerate(raw))
        return cls(**fields)

    def problems(self, n_ranks: int, n_chunks: int) -> list[tuple[str, str]]:
        """(`field[i]`, what is wrong) for every fault outside `n_ranks` x `n_chunks`."""
        return [(f"{kind.field}[{i}]", f"{kind.text(x)} is outside {n_ranks} ranks x {n_chunks} chunks")
                for kind in FAULT_KINDS for i, x in enumerate(getattr(self, kind.field))
                if not kind.fits(x, n_ranks, n_chunks)]


def _decoded(kind: "FaultKind", i: int, raw: Any) -> Any:
    try:
        return kind.from_json(raw)
    except (TypeError, ValueError, KeyError) as exc:
        raise ValueError(f"{kind.field}[{i}]: {exc}") from None


@attrs.frozen(kw_only=True)
class FaultKind:
    """One kind of fault, everything about it in one place (see the module doc).

    `when`: "before-lookup" (shapes the cached set), "after-lookup", "during-load", or "completion" (of a
    `GetAsync` of the load). `level`: the enumeration level that tries every single fault of this kind (None: the
    kind is enumerated as every subset, the cached sets). `explorer`: how `engines.explore` covers it, or "" where
    it refuses plans that hold it.
    """

    field: str
    when: str
    level: str | None
    explorer: str
    text: Callable[[Any], str]
    to_json: Callable[[Any], Any]
    from_json: Callable[[Any], Any]
    fits: Callable[[Any, int, int], bool]
    singles: Callable[[int, int], Iterator[Any]]
    draw: Callable[[random.Random, int, int], tuple]
    smaller: Callable[[Any], Iterator[Any]] = lambda item: iter(())
    refit: Callable[[Any, int, int, str, int], Any] = lambda item, n, k, how, was: None


# -- evictions ---------------------------------------------------------------------------------------
def _ev_json(e: Eviction) -> dict:
    return {k: v for k, v in attrs.asdict(e).items() if v is not None}


def _ev_from(need_step: bool) -> Callable[[Any], Eviction]:
    def decode(raw: Any) -> Eviction:
        if not isinstance(raw, dict) or not isinstance(raw.get("chunk"), int) or isinstance(raw.get("chunk"), bool):
            raise ValueError("expected an object with an integer 'chunk'")
        if need_step and not isinstance(raw.get("step"), int):
            raise ValueError("expected an integer 'step'")
        if raw.get("rank") is not None and not isinstance(raw.get("rank"), int):
            raise ValueError("expected an integer 'rank' or none")
        unknown = set(raw) - {"chunk", "rank", "step"}
        if unknown:
            raise ValueError(f"unknown field {sorted(unknown)[0]!r}")
        return Eviction(raw["chunk"], raw.get("rank"), raw.get("step"))
    return decode


def _ev_fits(e: Eviction, n: int, k: int) -> bool:
    return 0 <= e.chunk < k and (e.rank is None or 0 <= e.rank < n) and (e.step is None or e.step >= 0)


def _ev_text(what: str) -> Callable[[Eviction], str]:
    def text(e: Eviction) -> str:
        where = f" from rank {e.rank}" if e.rank is not None else ""
        at = f" {e.step}" if e.step is not None else ""
        return f"chunk {e.chunk} evicted{where} {what}{at}"
    return text


def _load_steps(n: int, k: int) -> int:
    """The load steps the enumeration places a fault before: about what a terminating load takes."""
    return 2 * k + 3 * n


def _draw_after(rng: random.Random, n: int, k: int) -> tuple:
    return (Eviction(rng.randrange(k)),) if k and rng.random() < 0.4 else ()


def _draw_during(rng: random.Random, n: int, k: int) -> tuple:
    return (Eviction(rng.randrange(k), step=rng.randrange(_load_steps(n, k))),) if k and rng.random() < 0.4 else ()


def _every_copy(e: Eviction) -> Iterator[Eviction]:
    if e.rank is not None:
        yield attrs.evolve(e, rank=None)


def _earlier(e: Eviction) -> Iterator[Eviction]:
    yield from _every_copy(e)
    if e.step:
        if e.step > 1:
            yield attrs.evolve(e, step=e.step // 2)
        yield attrs.evolve(e, step=e.step - 1)


def _ev_refit(e: Eviction, n: int, k: int, how: str, was: int) -> Eviction | None:
    """The eviction in `n` ranks x `k` chunks (`FaultPlan.refitted`), its rank wrapped."""
    if k <= 0:
        return None
    chunk = e.chunk
    if how == "shift":
        chunk = max(0, chunk - max(0, was - k))
    elif chunk >= k:
        same_owner = (k - 1) - ((k - 1 - chunk) % n)
        chunk = same_owner if how == "owner" and 0 <= same_owner < k else k - 1
    return attrs.evolve(e, chunk=chunk, rank=None if e.rank is None else e.rank % n)


# -- completions -------------------------------------------------------------------------------------
def _asyncs(n: int, k: int) -> int:
    """`GetAsync`s per rank the enumeration places a fault on: a rank's share of the chunks."""
    return -(-k // n)


def _numbers(width: int, *, integers: int) -> Callable[[Any], tuple]:
    def decode(raw: Any) -> tuple:
        if not isinstance(raw, list) or len(raw) != width or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in raw):
            raise ValueError(f"expected a list of {width} numbers")
        return tuple(int(v) for v in raw[:integers]) + tuple(float(v) for v in raw[integers:])
    return decode


def _completion_fits(x: tuple, n: int, k: int) -> bool:
    return 0 <= x[0] < n and x[1] >= 0 and (len(x) < 3 or x[2] >= 0)


def _completion_refit(x: tuple, n: int, k: int, how: str, was: int) -> tuple:
    """The completion fault on a rank that exists, on a GetAsync the rank still issues (its share of k chunks)."""
    return (x[0] % n, min(x[1], max(0, _asyncs(n, k) - 1)), *x[2:])


def _draw_lost(rng: random.Random, n: int, k: int) -> tuple:
    return ((rng.randrange(n), rng.randrange(_asyncs(n, k))),) if k and rng.random() < 0.3 else ()


def _draw_delayed(rng: random.Random, n: int, k: int) -> tuple:
    if k and rng.random() < 0.3:
        return ((rng.randrange(n), rng.randrange(_asyncs(n, k)), rng.choice([0.5, 2.0])),)
    return ()


FAULT_KINDS: tuple[FaultKind, ...] = (
    FaultKind(field="evict_before_lookup", when="before-lookup", level=None, explorer="initial configurations",
              text=_ev_text("before lookup"), to_json=_ev_json, from_json=_ev_from(False), fits=_ev_fits,
              singles=lambda n, k: (Eviction(c) for c in range(k)),
              draw=lambda rng, n, k: tuple(Eviction(c) for c in range(k) if rng.random() < 0.1), refit=_ev_refit,
              smaller=_every_copy),
    FaultKind(field="evict_after_lookup", when="after-lookup", level="after-lookup", explorer="lazy eviction",
              text=_ev_text("between lookup and load"), to_json=_ev_json, from_json=_ev_from(False), fits=_ev_fits,
              singles=lambda n, k: (Eviction(c) for c in range(k)), draw=_draw_after, refit=_ev_refit,
              smaller=_every_copy),
    FaultKind(field="evict_during_load", when="during-load", level="during-load", explorer="lazy eviction",
              text=_ev_text("before load step"), to_json=_ev_json, from_json=_ev_from(True), fits=_ev_fits,
              singles=lambda n, k: (Eviction(c, step=s) for s in range(_load_steps(n, k)) for c in range(k)),
              draw=_draw_during, smaller=_earlier, refit=_ev_refit),
    FaultKind(field="lost", when="completion", level="completions", explorer="branch at each GetAsync",
              text=lambda x: f"rank {x[0]}'s GetAsync #{x[1]} completion lost", to_json=list,
              from_json=_numbers(2, integers=2), fits=_completion_fits,
              singles=lambda n, k: ((r, i) for r in range(n) for i in range(_asyncs(n, k))), draw=_draw_lost,
              refit=_completion_refit),
    FaultKind(field="delayed", when="completion", level="completions", explorer="branch at each GetAsync",
              text=lambda x: f"rank {x[0]}'s GetAsync #{x[1]} completion delayed {x[2]:g} s", to_json=list,
              from_json=_numbers(3, integers=2), fits=_completion_fits,
              singles=lambda n, k: ((r, i, DEFAULT_DELAY) for r in range(n) for i in range(_asyncs(n, k))),
              draw=_draw_delayed, refit=_completion_refit),
)
FAULT_FIELDS = tuple(k.field for k in FAULT_KINDS)
#: The ways `FaultPlan.refitted` re-places a fault in a smaller shape.
REFITS = ("owner", "shift", "last")
NO_FAULTS = FaultPlan()


def kind_of(field: str) -> FaultKind:
    """The kind whose `FaultPlan` field is `field`."""
    for kind in FAULT_KINDS:
        if kind.field == field:
            return kind
    raise KeyError(field)
