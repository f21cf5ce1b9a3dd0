"""Fault plans: which keys are evicted when, and which async completions are lost or delayed."""
from __future__ import annotations

import attrs


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


@attrs.frozen
class FaultPlan:
    """Every fault injected into one run.

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

    def after_lookup(self) -> bool:
        """Whether any fault happens after the lookup (maximality is only claimed without one)."""
        return bool(self.evict_after_lookup or self.evict_during_load or self.lost or self.delayed)

    def size(self) -> int:
        """How many faults the plan injects (what minimisation shrinks)."""
        return (len(self.evict_before_lookup) + len(self.evict_after_lookup) + len(self.evict_during_load)
                + len(self.lost) + len(self.delayed))

    def without(self, field: str, index: int) -> "FaultPlan":
        """This plan less entry `index` of `field`."""
        items = list(getattr(self, field))
        del items[index]
        return attrs.evolve(self, **{field: tuple(items)})


FAULT_FIELDS = ("evict_before_lookup", "evict_after_lookup", "evict_during_load", "lost", "delayed")
NO_FAULTS = FaultPlan()
