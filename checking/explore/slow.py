"""The search loop's general path (`checking.explore.bfs.Search`): the expansion of states whose successors are not
all plain (every branch kind, arrivals that complete their collective or desync, and the checks of new states near
the step bound). Its tables are bound once per search (`slow_expander`), not once per state: a quarter-million
states of the 5 x 10 bench space take it, one call each, from the hot loop."""
from __future__ import annotations

from typing import Any, Callable

from checking.explore.state import ARRIVE, CF_BITS, CF_MASK, FAIL, HALF_MASK, LAST_MOVE

__all__ = ["slow_expander", "arrival_of"]


def slow_expander(search: Any) -> Callable[[Any, dict, int], int]:
    """`expand(states, seen, d1)`: expand `states` (of depth d1 - 1) into `seen` (the states of depth d1 -> their
    parents) by every branch of every rank (the lowest movable one, reduced), then every eager eviction (unreduced);
    the transitions generated. New states are checked (`search._check_new`) when they may be terminal, complete a
    collective, or lie near the step bound; a failing branch or a desync is reported (`search._found`)."""
    space, halves = search.space, search.halves
    n, reduction, bound, budgets, dead = space.n, space.reduction, space.bound, search.budgets, search.dead
    check_new, arrival, found, branches_of = search._check_new, arrival_of(search), search._found, space.branches
    can_move, status_code, arrived_sig = space.can_move, space.status_code, space.arrived_sig
    lids0, lids1, shift1 = space.half_lids[0], space.half_lids[1], space.shift1
    moves0, moves1, rank_moves = halves.moves_of[0], halves.moves_of[1], halves.rank_moves
    evictions0, evictions1, rank_evictions = halves.evictions_of[0], halves.evictions_of[1], halves.rank_evictions

    def expand(states, seen: dict[int, int | None], d1: int) -> int:
        near, trans = d1 >= bound, 0  # only near the bound can a state reach it
        for st in states:
            if dead and st in dead:
                continue
            budget = budgets[st & CF_MASK]
            runnable = False
            h0, h1 = (st >> CF_BITS) & HALF_MASK, st >> shift1
            here = lids0[h0] + lids1[h1]  # the ranks' local states
            first, second = moves0[h0], moves1[h1]  # per rank: (its branches, its plain deltas per budget)
            ranks = (rank_moves(0, h0) if first is None else first) + (rank_moves(1, h1) if second is None else second)
            waits = None  # at the state's first arrival: the collective ranks wait in (-3: several), how many
            for r, lid in enumerate(here):
                if not can_move[lid]:
                    continue
                runnable = True
                branches, plain = ranks[r]
                if plain:  # every branch a plain move: only the deltas affordable within the budget
                    deltas = plain[budget]
                    trans += len(deltas)
                    for delta in deltas:
                        ns = st + delta
                        if ns not in seen:
                            seen[ns] = st
                            if near:
                                check_new(ns, d1)
                    if reduction:
                        break
                    continue
                for j, (cost, delta, nl, kind) in enumerate(branches):
                    if cost > budget:
                        continue
                    trans += 1
                    ns = st + delta
                    if kind == ARRIVE:
                        sig = arrived_sig[nl]
                        if waits is None:
                            waits, waiting, movers = -1, 0, 0  # ranks arrived / able to move, in st
                            for x in here:
                                c = status_code[x]
                                if c == -1:
                                    movers += 1
                                elif c >= 0:
                                    waits = c if waits in (-1, c) else -3
                                    waiting += 1
                        if movers > 1 and waiting < n - 1 and (waits == sig or waits == -1) and not near:
                            # another rank is still to arrive (no desync, not complete) and another rank can
                            # move (not terminal); not near the step bound: nothing to check
                            if ns not in seen:
                                seen[ns] = st
                            continue
                        ns = arrival(st, ns, r, sig)
                        if ns is None or ns in seen:
                            continue
                        seen[ns] = st
                        check_new(ns, d1)
                    elif kind != FAIL:  # PLAIN, or LAST_MOVE: the rank cannot move after it (maybe terminal)
                        if ns not in seen:
                            seen[ns] = st
                            if near or kind == LAST_MOVE:
                                check_new(ns, d1)
                    else:
                        found(st, (r, branches_of(lid)[j][2]), nl)
                if reduction:
                    break
            if budget and runnable and not reduction:
                first, second = evictions0[h0], evictions1[h1]
                for evs in ((rank_evictions(0, h0) if first is None else first)
                            + (rank_evictions(1, h1) if second is None else second)):
                    trans += len(evs)
                    for delta in evs:
                        ns = st + delta
                        if ns not in seen:
                            seen[ns] = st
                            if near:
                                check_new(ns, d1)
        return trans

    return expand


def arrival_of(search: Any) -> Callable[[int, int, int, int], int | None]:
    """`arrival(st, ns, r, sig)`: the state after rank r's arrival (signature id `sig`) took `st` to `ns`: `ns`, or
    the state after the collective completed (memoised per the ranks' local states); a desync is reported
    (`search._found`; None: the run ends)."""
    space, found = search.space, search._found
    arrived_sig, completions, pack, arrive = space.arrived_sig, space.completions, space.pack, space.arrive
    lids0, lids1, shift1 = space.half_lids[0], space.half_lids[1], space.shift1

    def arrival(st: int, ns: int, r: int, sig: int) -> int | None:
        complete: bool | None = True
        lids = lids0[(ns >> CF_BITS) & HALF_MASK] + lids1[ns >> shift1]
        for x in lids:
            other = arrived_sig[x]
            if other != sig:
                if other >= 0:  # a different collective: desync
                    complete = None
                    break
                complete = False
        if complete is False:
            return ns
        high = ns >> CF_BITS
        got = completions.get(high)
        if got is None:
            got = arrive(lids, r)
            if type(got) is not tuple:
                found(st, (r, ("arrive",)), got)
                return None  # (only other properties are searched for)
            got = completions[high] = pack(got, 0) >> CF_BITS
        return (got << CF_BITS) | (ns & CF_MASK)

    return arrival
