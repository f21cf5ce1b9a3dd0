"""The search loop's memo of each half of the ranks: a global state's successors, half by half.

A global state's successors are, in order, every moving rank's affordable branches (rank order, branch order), then
(unreduced, with budget left, when some rank can move) every rank's eager evictions; each is the state plus a
packed delta that depends only on that rank's local state and the fault budget. So the deltas of ranks [0, h) and
of ranks [h, n) are memoised per (that half's local states, budget): expanding a state is two dict look-ups, a look-up
of what the two halves' classes make of it, and the state plus each delta. The states of one level share few halves
(5 ranks x 10 chunks, 2 faults: 27k entries for the first 1.5M states).

A half's class says whether its deltas are the whole story: every expanded branch a plain move or an arrival, no
failure nor last move, and the summary of its ranks that decides an arrival (`Search._expand_slow`: an arrival is a
plain successor when another rank can still move, another rank is still to arrive, and no rank waits in another
collective). A pair of classes decides the state (`how`): its successors are plain (which deltas), it has none (no
rank can move), or it takes the general path (`SLOW`).
"""
from __future__ import annotations

from typing import Any

from engines.explore.state import ARRIVE, CF_BITS, LID_BITS, LID_MASK, PLAIN, StateSpace

__all__ = ["Halves", "SLOW", "ALL", "NONE", "FIRST", "SECOND"]

#: what a pair of classes makes of a state: the general path; every half's moves then evictions; no successor;
#: (reduced) the first half's moves; the second half's
SLOW, ALL, NONE, FIRST, SECOND = 0, 1, 2, 3, 4
# a class's collective signature summary: no signature (-1), one id (>= 0), or several
_MIXED = -3


def _merge_sig(a: int, b: int) -> int:
    """The signature summary of the union of two sets of signature ids summarised as `a` and `b`."""
    if a == -1 or a == b:
        return b
    return a if b == -1 else _MIXED


class Halves:
    """Per half (0: ranks [0, h), 1: ranks [h, n)) and fault budget b, `memo[half][b]`: the half's packed local
    ids -> (move deltas, eviction deltas, its class: an id for the first half, for the second its row of the
    decision table, a list: the first half's class id -> `how`). Every row is always complete (classes are few)."""

    def __init__(self, space: StateSpace) -> None:
        self.space = space
        self.h = h = space.n // 2
        self.mask0 = (1 << (LID_BITS * h)) - 1
        self.shift1 = CF_BITS + LID_BITS * h
        budgets = range(space.max_faults + 1)
        self.memo: tuple[list[dict], list[dict]] = ([{} for _ in budgets], [{} for _ in budgets])
        # a class: (plain: no failure nor last move, arrivals expanded, ranks able to move, ranks arrived,
        # signature summary of the arrived ranks and expanded arrivals)
        self.class_ids: dict[tuple, int] = {}
        self.classes: list[tuple] = []
        self.rows: dict[tuple, list[int]] = {}

    def entry(self, half: int, bits: int, budget: int) -> tuple:
        """The entry of half `half` with packed local ids `bits` (that half's, from its first rank) at `budget`."""
        space, h = self.space, self.h
        ranks = range(h) if half == 0 else range(h, space.n)
        plain, arrivals, moves, evictions, movers, arrived, sig = True, False, [], [], 0, 0, -1
        for i in range(len(ranks)):
            lid = (bits >> (LID_BITS * i)) & LID_MASK
            if space.status_code[lid] >= 0:
                arrived += 1
                sig = _merge_sig(sig, space.status_code[lid])
            if not space.can_move[lid]:
                continue
            movers += 1
            if space.reduction and movers > 1:  # only a half's first mover can be the state's expanded one
                continue
            for cost, delta, nl, kind in space.packed(lid):
                if cost > budget:
                    continue
                if kind == ARRIVE:
                    arrivals = True
                    sig = _merge_sig(sig, space.arrived_sig[nl])
                elif kind != PLAIN:
                    plain = False
                moves.append(delta)
        if budget and not space.reduction:
            for i in range(len(ranks)):
                evictions.extend(space.packed_evictions((bits >> (LID_BITS * i)) & LID_MASK))
        cls = (plain, arrivals, movers, arrived, sig)
        if half == 0:
            got = self.class_ids.get(cls)
            if got is None:
                got = self.class_ids[cls] = len(self.classes)
                self.classes.append(cls)
                for second, row in self.rows.items():
                    row.append(self.decide(cls, second))
        else:
            got = self.rows.get(cls)
            if got is None:
                got = self.rows[cls] = [self.decide(first, cls) for first in self.classes]
        entry = self.memo[half][budget][bits] = (tuple(moves), tuple(evictions), got)
        return entry

    def decide(self, first: tuple, second: tuple) -> int:
        """`how` for a state whose halves have classes `first` and `second`."""
        plain0, arrivals0, movers0, arrived0, sig0 = first
        plain1, arrivals1, movers1, arrived1, sig1 = second
        if not movers0 + movers1:
            return NONE
        if not (plain0 and plain1):
            return SLOW
        if (arrivals0 or arrivals1) and not (movers0 + movers1 > 1 and arrived0 + arrived1 < self.space.n - 1
                                             and _merge_sig(sig0, sig1) != _MIXED):
            return SLOW
        if self.space.reduction:
            return FIRST if movers0 else SECOND
        return ALL

    def budgets(self) -> list[int]:
        """The fault budget left in each `cf` (index: cf, the low CF_BITS of a packed state) of the configurations."""
        space: Any = self.space
        max_faults1 = space.max_faults + 1
        return [space.max_faults - cf % max_faults1 for cf in range(len(space.configs) * max_faults1)]
