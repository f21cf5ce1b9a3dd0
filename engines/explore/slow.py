"""The search loop's general path (`engines.explore.bfs.Search`): the expansion of states whose successors are not
all plain (every branch kind, arrivals that complete their collective or desync, and the checks of new states near
the step bound). Its tables are bound once per search (`slow_expander`), not once per state: a quarter-million
states of the 5 x 10 bench space take it, one call each, from the hot loop."""
from __future__ import annotations

from typing import Any, Callable

from engines.explore.state import ARRIVE, CF_BITS, CF_MASK, FAIL, LAST_MOVE, LID_MASK

__all__ = ["slow_expander", "arrival_of"]


def slow_expander(search: Any) -> Callable[[Any, dict, int], int]:
    """`expand(states, seen, d1)`: expand `states` (of depth d1 - 1) into `seen` (the states of depth d1 -> their
    parents) by every branch of every rank (the lowest movable one, reduced), then every eager eviction (unreduced);
    the transitions generated. New states are checked (`search._check_new`) when they may be terminal, complete a
    collective, or lie near the step bound; a failing branch or a desync is reported (`search._found`)."""
    space = search.space
    n, reduction, bound, budgets, dead = space.n, space.reduction, space.bound, search.budgets, search.dead
    check_new, arrival, found, branches_of = search._check_new, arrival_of(search), search._found, space.branches
    can_move, plain_deltas, packed_branches, packed = space.can_move, space.plain_deltas, space.packed_branches, \
        space.packed
    status_code, arrived_sig, shifts, eviction_deltas, packed_evictions = space.status_code, space.arrived_sig, \
        space.shifts, space.eviction_deltas, space.packed_evictions

    def expand(states, seen: dict[int, int | None], d1: int) -> int:
        near, trans = d1 >= bound, 0  # only near the bound can a state reach it
        for st in states:
            if dead and st in dead:
                continue
            budget = budgets[st & CF_MASK]
            runnable = False
            here = []  # the ranks' local states (rank r's is here.index(lid))
            for sh in shifts:
                here.append((st >> sh) & LID_MASK)
            waits = None  # at the state's first arrival: the collective ranks wait in (-3: several), how many
            for lid in here:
                if not can_move[lid]:
                    continue
                runnable = True
                plain = plain_deltas[lid]
                if plain is None:
                    packed(lid)
                    plain = plain_deltas[lid]
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
                branches = packed_branches[lid]
                for cost, delta, nl, kind in branches:
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
                        ns = arrival(st, ns, here.index(lid), sig)
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
                        label = branches_of(lid)[branches.index((cost, delta, nl, kind))][2]
                        found(st, (here.index(lid), label), nl)
                if reduction:
                    break
            if budget and runnable and not reduction:
                for lid in here:
                    evs = eviction_deltas[lid]
                    if evs is None:
                        evs = packed_evictions(lid)
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
    n, shifts, arrived_sig, completions, unpack, pack, arrive = space.n, space.shifts, space.arrived_sig, \
        space.completions, space.unpack, space.pack, space.arrive

    def arrival(st: int, ns: int, r: int, sig: int) -> int | None:
        complete = True
        for sh in shifts:
            other = arrived_sig[(ns >> sh) & LID_MASK]
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
            got = arrive(unpack(ns)[:n], r)
            if type(got) is not tuple:
                found(st, (r, ("arrive",)), got)
                return None  # (only other properties are searched for)
            got = completions[high] = pack(got, 0) >> CF_BITS
        return (got << CF_BITS) | (ns & CF_MASK)

    return arrival
