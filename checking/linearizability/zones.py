"""The necessary condition of `checking.linearizability.sweep` (Gibbons & Korach's zones): for one key's part whose
puts each write their own value, the puts with their gets, the deletes and the puts nobody reads -- the misses
and `contains` reads left out -- must already order. Each such write is a block from its call (or the latest call
of a get of its value, if later) to its deadline (its own return, or the earliest return of a get of its value);
block B must precede block C when B's deadline is before C's start, and a linearization orders all blocks, so two
blocks that must each precede the other are a violation (and any cycle of "must precede" contains such a pair).
"""
from __future__ import annotations

import bisect
import math

from checking.linearizability.sweep import Instance

__all__ = ["conflict", "two_cycle"]

INF = math.inf


def conflict(inst: Instance) -> tuple[float, int] | None:
    """The necessary condition of the module doc: None when it holds, else the event (time, op index) by which
    its evidence is complete (every op of two blocks that cannot be ordered has returned)."""
    blocks = [w for w in range(len(inst.w_op)) if inst.w_dl[w] < INF]
    w_call, w_hold, w_dl = inst.w_call, inst.w_hold, inst.w_dl
    F = [w_dl[w] for w in blocks]
    S = [w_call[w] if w_call[w] > w_hold[w] else w_hold[w] for w in blocks]
    pair = two_cycle(F, S)
    if pair is None:
        return None
    ops = inst.ops
    done = [(ops[j].completed, j) for b in pair for j in inst.gets[blocks[b]]]
    done += [(ops[inst.w_op[blocks[b]]].completed, inst.w_op[blocks[b]]) for b in pair
             if ops[inst.w_op[blocks[b]]].completed is not None]
    return max(done)  # type: ignore


def two_cycle(F: list[float], S: list[float]) -> tuple[int, int] | None:
    """Two blocks a != b with F(a) < S(b) and F(b) < S(a), or None. A cycle B0 -> B1 -> ... -> B0 of "B must
    precede C iff F(B) < S(C)" has a two-cycle: let m be its block with the least F and p its predecessor
    (F(p) < S(m)); if S(p) > F(p) >= F(m), then m, p is one; else S(p) <= F(p) and p's own predecessor q has
    F(q) < S(p) <= F(p) < S(m): drop p."""
    order = sorted(range(len(F)), key=F.__getitem__)
    fs = [F[x] for x in order]
    top1: list[tuple[float, int]] = []  # per prefix of `order`: the greatest S and the second greatest
    top2: list[tuple[float, int]] = []
    best, second = (-INF, -1), (-INF, -1)
    for x in order:
        cand = (S[x], x)
        if cand > best:
            best, second = cand, best
        elif cand > second:
            second = cand
        top1.append(best)
        top2.append(second)
    for b in range(len(F)):
        k = bisect.bisect_left(fs, S[b])  # the blocks with F < S(b)
        if not k:
            continue
        s_a, a = top1[k - 1]
        if a == b:
            s_a, a = top2[k - 1]
        if a >= 0 and s_a > F[b]:
            return a, b
    return None
