"""The items of the fault kinds (`model.faults`): an `Eviction`, a completion `(rank, i[, seconds])`, a real-server
`ServerFault`; and what the kinds' records do with them: their JSON codec and validation, text, fit to a shape, how
they shrink and re-place, and how enumeration and random search generate them."""
from __future__ import annotations

import random
from typing import Any, Callable, Iterator

import attrs

__all__ = ["Eviction", "ServerFault", "STRIKE_POINTS"]


@attrs.frozen
class Eviction:
    """Evict chunk `chunk`'s keys from `rank`'s store (`rank=None`: from every store that holds one).

    `step` is the load step before which it happens (only for evictions during load).
    """

    chunk: int
    rank: int | None = None
    step: int | None = None



# -- evictions ---------------------------------------------------------------------------------------
def ev_json(e: Eviction) -> dict:
    return {k: v for k, v in attrs.asdict(e).items() if v is not None}


def ev_from(need_step: bool) -> Callable[[Any], Eviction]:
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


def ev_fits(e: Eviction, n: int, k: int) -> bool:
    return 0 <= e.chunk < k and (e.rank is None or 0 <= e.rank < n) and (e.step is None or e.step >= 0)


def ev_text(what: str) -> Callable[[Eviction], str]:
    def text(e: Eviction) -> str:
        where = f" from rank {e.rank}" if e.rank is not None else ""
        at = f" {e.step}" if e.step is not None else ""
        return f"chunk {e.chunk} evicted{where} {what}{at}"
    return text


def load_steps(n: int, k: int) -> int:
    """The load steps the enumeration places a fault before: about what a terminating load takes."""
    return 2 * k + 3 * n


def draw_after(rng: random.Random, n: int, k: int) -> tuple:
    return (Eviction(rng.randrange(k)),) if k and rng.random() < 0.4 else ()


def draw_during(rng: random.Random, n: int, k: int) -> tuple:
    return (Eviction(rng.randrange(k), step=rng.randrange(load_steps(n, k))),) if k and rng.random() < 0.4 else ()


def every_copy(e: Eviction) -> Iterator[Eviction]:
    if e.rank is not None:
        yield attrs.evolve(e, rank=None)


def earlier(e: Eviction) -> Iterator[Eviction]:
    yield from every_copy(e)
    if e.step:
        if e.step > 1:
            yield attrs.evolve(e, step=e.step // 2)
        yield attrs.evolve(e, step=e.step - 1)


def ev_refit(e: Eviction, n: int, k: int, how: str, was: int) -> Eviction | None:
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
def asyncs(n: int, k: int) -> int:
    """`GetAsync`s per rank the enumeration places a fault on: a rank's share of the chunks."""
    return -(-k // n)


def numbers(width: int, *, integers: int) -> Callable[[Any], tuple]:
    def decode(raw: Any) -> tuple:
        if not isinstance(raw, list) or len(raw) != width or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in raw):
            raise ValueError(f"expected a list of {width} numbers")
        return tuple(int(v) for v in raw[:integers]) + tuple(float(v) for v in raw[integers:])
    return decode


def completion_fits(x: tuple, n: int, k: int) -> bool:
    return 0 <= x[0] < n and x[1] >= 0 and (len(x) < 3 or x[2] >= 0)


def completion_refit(x: tuple, n: int, k: int, how: str, was: int) -> tuple:
    """The completion fault on a rank that exists, on a GetAsync the rank still issues (its share of k chunks)."""
    return (x[0] % n, min(x[1], max(0, asyncs(n, k) - 1)), *x[2:])


def draw_lost(rng: random.Random, n: int, k: int) -> tuple:
    return ((rng.randrange(n), rng.randrange(asyncs(n, k))),) if k and rng.random() < 0.3 else ()


def draw_delayed(rng: random.Random, n: int, k: int) -> tuple:
    if k and rng.random() < 0.3:
        return ((rng.randrange(n), rng.randrange(asyncs(n, k)), rng.choice([0.5, 2.0])),)
    return ()

# -- real faults on the servers --------------------------------------------------------------------
#: Where a real-server fault strikes: a protocol case's phase (before the lookup, between lookup and load, before
#: load step `step`), before an op of a store-ops run ("op": the fault is an op of the sequence), when op `step` of a
#: concurrent run is invoked ("run"), or before step `step` of an engine case ("engine").
STRIKE_POINTS = ("before-lookup", "after-lookup", "during-load", "op", "run", "engine")


@attrs.frozen
class ServerFault:
    """One real fault on rank `rank`'s server, at `at` (`STRIKE_POINTS`; `step`: the load step, the op index of a
    concurrent run, or the engine step), lasting `seconds` (a pause, a restart's down time, a sleep)."""

    rank: int
    at: str = "op"
    step: int | None = None
    seconds: float = 0.0



def sf_json(f: ServerFault) -> dict:
    return {k: v for k, v in attrs.asdict(f).items() if v is not None}


def sf_from(raw: Any) -> ServerFault:
    if not isinstance(raw, dict) or set(raw) - {"rank", "at", "step", "seconds"}:
        raise ValueError("expected an object with 'rank', 'at', 'step'?, 'seconds'?")
    rank, at, step, secs = raw.get("rank"), raw.get("at", "op"), raw.get("step"), raw.get("seconds", 0.0)
    if not isinstance(rank, int) or isinstance(rank, bool):
        raise ValueError("expected an integer 'rank'")
    if at not in STRIKE_POINTS:
        raise ValueError(f"'at' must be one of {', '.join(STRIKE_POINTS)}, got {at!r}")
    if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
        raise ValueError("expected an integer 'step' or none")
    if (at in ("during-load", "run", "engine")) != (step is not None):
        raise ValueError(f"a fault at {at!r} {'needs' if step is None else 'takes no'} 'step'")
    if not isinstance(secs, (int, float)) or isinstance(secs, bool) or not 0 <= secs <= 60:
        raise ValueError("'seconds' must be a number in 0..60")
    return ServerFault(rank, at, step, float(secs))


def sf_fits(f: ServerFault, n: int, k: int) -> bool:
    return 0 <= f.rank < n and (f.step is None or f.step >= 0)


def sf_text(what: str) -> Callable[[ServerFault], str]:
    def text(f: ServerFault) -> str:
        where = {"before-lookup": "before the lookup", "after-lookup": "between lookup and load",
                 "during-load": f"before load step {f.step}", "op": "at this op", "run": f"at op {f.step} of the run",
                 "engine": f"before engine step {f.step}"}[f.at]
        lasts = f" for {f.seconds:g} s" if f.seconds else ""
        return f"rank {f.rank}'s server {what}{lasts} {where}"
    return text


def sf_singles(seconds: float) -> Callable[[int, int], Iterator[ServerFault]]:
    """Each rank's server struck before the lookup, between lookup and load, and before load step 0."""
    def singles(n: int, k: int) -> Iterator[ServerFault]:
        for at, step in (("before-lookup", None), ("after-lookup", None), ("during-load", 0)):
            for r in range(n):
                yield ServerFault(r, at, step, seconds)
    return singles


def sf_shorter(f: ServerFault) -> Iterator[ServerFault]:
    if f.step:
        yield attrs.evolve(f, step=f.step - 1)
