"""The search loop's memo of each half of the ranks: a global state's successors, half by half.

A global state's successors are, in order, every moving rank's affordable branches (rank order, branch order), then
(unreduced, with budget left, when some rank can move) every rank's eager evictions; each is the state plus a
packed delta that depends only on that half's dense id (`checking.explore.state`) and the fault budget. So the deltas
of ranks [0, h) and of ranks [h, n) are memoised per (half id, budget), in lists indexed by the id: expanding a state
is two list look-ups, a look-up of what the two halves' classes make of it, and the state plus each delta. The states of one level share few halves
(5 ranks x 10 chunks, 2 faults: 27k entries for the first 1.5M states).

A half's class says whether its deltas are the whole story: every expanded branch a plain move or an arrival, no
failure nor last move, and the summary of its ranks that decides an arrival (`checking.explore.slow`: an arrival is a
plain successor when another rank can still move, another rank is still to arrive, and no rank waits in another
collective). A pair of classes decides the state (`how`): its successors are plain (which deltas), it has none (no
rank can move), or it takes the general path (`SLOW`).
"""
from __future__ import annotations

from typing import Any

from checking.explore.state import ARRIVE, CF_BITS, FAIL, HALF_MASK, PLAIN, StateSpace

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
    """Per half (0: ranks [0, h), 1: ranks [h, n)) and fault budget b, `memo[half][b]`: the half's id -> (move
    deltas, eviction deltas, its class: an id for the first half, for the second its row of the decision table, a
    list: the first half's class id -> `how`), None until computed. Every row is always complete (classes are few).
    Per half id, `moves_of[half]` and `evictions_of[half]` (`rank_moves`, `rank_evictions`) hold each of its ranks'
    deltas, for the entries and the general path (`checking.explore.slow`)."""

    def __init__(self, space: StateSpace) -> None:
        self.space = space
        self.h = space.h
        self.mask0 = HALF_MASK
        self.shift1 = space.shift1
        budgets = range(space.max_faults + 1)
        self.memo: tuple[list[list], list[list]] = ([[] for _ in budgets], [[] for _ in budgets])
        self.moves_of: tuple[list, list] = ([], [])
        self.evictions_of: tuple[list, list] = ([], [])
        for half in (0, 1):
            for table in self.memo[half] + [self.moves_of[half], self.evictions_of[half]]:
                table.extend([None] * len(space.half_lids[half]))
                space.half_tables[half].append(table)
        # a class: (plain: no failure nor last move, arrivals expanded, ranks able to move, ranks arrived,
        # signature summary of the arrived ranks and expanded arrivals)
        self.class_ids: dict[tuple, int] = {}
        self.classes: list[tuple] = []
        self.rows: dict[tuple, list[int]] = {}

    def rank_moves(self, half: int, hid: int) -> tuple:
        """Per rank of half id `hid`: (its branches as [(cost, packed delta, new lid | Violation, kind)] (none if it
        cannot move, or reduced if it is not the half's first mover: never expanded), when every branch is PLAIN per
        fault budget b the deltas of those costing at most b, in branch order, else False)."""
        space = self.space
        lids, half_id, sh = space.half_lids[half][hid], space.half_id, CF_BITS if half == 0 else self.shift1
        out, first, budgets = [], True, range(space.max_faults + 1)
        for i, lid in enumerate(lids):
            branches: list[tuple] = []
            plain: Any = False
            if space.can_move[lid] and (first or not space.reduction):
                first, head, tail, plain = False, lids[:i], lids[i + 1:], True
                for cost, nl, kind in space.packed(lid):
                    if kind == FAIL:
                        branches.append((cost, 0, nl, kind))
                    else:
                        branches.append((cost, ((half_id(half, head + (nl,) + tail) - hid) << sh) + cost, nl, kind))
                    plain = plain and kind == PLAIN
                if plain:
                    plain = tuple([tuple([b[1] for b in branches if b[0] <= budget]) for budget in budgets])
            out.append((branches, plain))
        got = self.moves_of[half][hid] = tuple(out)
        return got

    def rank_evictions(self, half: int, hid: int) -> tuple:
        """Per rank of half id `hid`: the packed deltas of its eager evictions (each costs one fault)."""
        space = self.space
        lids, half_id, sh, out = space.half_lids[half][hid], space.half_id, CF_BITS if half == 0 else self.shift1, []
        for i, lid in enumerate(lids):
            head, tail = lids[:i], lids[i + 1:]
            out.append([((half_id(half, head + (nl,) + tail) - hid) << sh) + 1 for nl, _ in space.evictions(lid)])
        got = self.evictions_of[half][hid] = tuple(out)
        return got

    def entry(self, half: int, hid: int, budget: int) -> tuple:
        """The entry of half `half` with id `hid` at `budget`."""
        space = self.space
        plain, arrivals, moves, evictions, movers, arrived, sig = True, False, [], [], 0, 0, -1
        ranks = self.moves_of[half][hid]
        if ranks is None:
            ranks = self.rank_moves(half, hid)
        for i, lid in enumerate(space.half_lids[half][hid]):
            if space.status_code[lid] >= 0:
                arrived += 1
                sig = _merge_sig(sig, space.status_code[lid])
            if not space.can_move[lid]:
                continue
            movers += 1
            if space.reduction and movers > 1:  # only a half's first mover can be the state's expanded one
                continue
            for cost, delta, nl, kind in ranks[i][0]:
                if cost > budget:
                    continue
                if kind == ARRIVE:
                    arrivals = True
                    sig = _merge_sig(sig, space.arrived_sig[nl])
                elif kind != PLAIN:
                    plain = False
                moves.append(delta)
        if budget and not space.reduction:
            per_rank = self.evictions_of[half][hid]
            for deltas in self.rank_evictions(half, hid) if per_rank is None else per_rank:
                evictions.extend(deltas)
        cls = (plain, arrivals, movers, arrived, sig)
        got: Any
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
        entry = self.memo[half][budget][hid] = (tuple(moves), tuple(evictions), got)
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
