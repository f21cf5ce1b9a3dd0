"""The search loop's hot path (`checking.explore.bfs.Search._expand`): a state whose two halves' entries
(`checking.explore.halves`) say its successors are plain is the state plus their deltas, each inserted into the next
level's dict with its first parent; any other state takes the general path (`checking.explore.slow`). A module of its
own so that `make venv` compiles it (`checking.native`): the loop is the explorer's time."""
from __future__ import annotations

from typing import Any, Callable, Final, Iterable

__all__ = ["expand_plain"]

# what a pair of classes makes of a state (`checking.explore.halves`: SLOW, ALL, NONE, FIRST, SECOND)
_SLOW: Final = 0
_ALL: Final = 1
_NONE: Final = 2
_FIRST: Final = 3


def expand_plain(states: Iterable[int], seen: dict[int, Any], d1: int, memo0: list[list[Any]], memo1: list[list[Any]],
                 entry: Callable[[int, int, int], tuple], budgets: list[int], slow: Callable[[Any, dict, int], int],
                 cf_mask: int, cf_bits: int, half_mask: int, shift1: int) -> int:
    """Expand `states` (of depth d1 - 1) into `seen` (the states of depth d1 -> their parents, the first kept); the
    transitions generated. `memo0`, `memo1`: per budget, each half id's entry or None (`entry(half, hid, budget)`
    makes it); `budgets`: the fault budget left per configuration-and-faults word; `slow`: the general path."""
    trans = 0
    add = seen.setdefault
    for st in states:
        budget = budgets[st & cf_mask]
        hid = (st >> cf_bits) & half_mask
        e0 = memo0[budget][hid]
        if e0 is None:
            e0 = entry(0, hid, budget)
        hid = st >> shift1
        e1 = memo1[budget][hid]
        if e1 is None:
            e1 = entry(1, hid, budget)
        how: int = e1[2][e0[2]]
        if how == _ALL:
            deltas = e0[0] + e1[0] + e0[1] + e1[1]
        elif how == _NONE:
            continue
        elif how == _SLOW:
            trans += slow((st,), seen, d1)
            continue
        else:
            deltas = e0[0] if how == _FIRST else e1[0]
        trans += len(deltas)
        for delta in deltas:
            add(st + delta, st)
    return trans
