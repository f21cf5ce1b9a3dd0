"""The first try of `checking.linearizability` on every part: a replay of the ops in the order of their midpoints,
repaired locally where the model refuses an op. It either ends with a linearization (then the part is
linearizable) or gives up, and the other paths decide; giving up says nothing about the part.

The ops go in the order of one instant inside each op's interval (its midpoint; an op that never completed: its
call, and for a register a put that never completed: just before the first get of its value, or nowhere -- left
out, as it may never have taken effect -- when none returned it), which keeps real time: an op that returned before
another was called has the earlier instant. The model's
`step` replays them; where it refuses op r, a few rearrangements of the ops around r are tried, in this order,
the first that works taken (the "recent writes": the last ops that changed the state, and for a register model
the writes among them that changed nothing):
- r moved back, before one of the recent writes;
- the last recent write moved back, before an earlier one (two concurrent writes in the other order);
- a recent write moved to just before r, or to just before a later recent write with r right after it;
- an op after r (among the next 64) called before r returned pulled to just before r, or r moved to just after it;
- a recent write that may never have taken effect (it never completed, or it raised) left out.
Each is a new order of a segment of the ops, which must keep real time (no op of it before one that returned before
it was called; the segment holds every op whose relative order changes) and be accepted by the model from the state
before it up to r (the ops after r in it are replayed, and repaired, as the rest). So an order this pass ends with
is a linearization: the part's ops (less some that may never have taken effect: every op that completed without
error is in it), in an order that keeps real time, accepted by the model step by step. A replay that needs more
repairs than about one per 24 ops gives up: they would cost more than an exact path."""
from __future__ import annotations

import math
from typing import Any, Iterator, Sequence

from checking.linearizability.wing_gong import unknown
from model.history import Model, Op

__all__ = ["replay_order"]

INF = math.inf
#: How many of the last state-changing ops a repair looks back over, and how far ahead it looks for an op to pull.
_BACK = 8
_AHEAD = 64
#: The repairs a replay may make: `_FREE_REPAIRS`, and one more per `_OPS_PER_REPAIR` ops replayed so far. A repair
#: replays a few hundred ops of candidate segments; past that rate the repairs cost more than an exact path spends
#: on the whole part (measured on the side-by-side histories of `checking.concurrency_bench`), so the replay gives up.
_FREE_REPAIRS = 4
_OPS_PER_REPAIR = 24


def replay_order(keys: tuple[str, ...], ops: Sequence[Op], model: Model) -> list[Op] | None:
    """The linearization the repaired replay of the module doc ends with (the ops, in order), or None."""
    mids = [op.invoked if op.completed is None else (op.invoked + op.completed) / 2 for op in ops]
    out = _place_pending_puts(ops, mids, model.register_view) if model.register_view is not None else None
    order = [ops[j] for j in sorted(range(len(ops)), key=mids.__getitem__) if not out or j not in out]
    step = model.step
    state = model.init(keys)
    recent: list[tuple[int, Any]] = []  # (position, state before) of the last ops that changed the state
    p = repairs = 0
    n = len(order)
    while True:
        for p in range(p, n):
            ok, new = step(keys, state, order[p])
            if not ok:
                break
            if new is not state and new != state:
                recent.append((p, state))
                if len(recent) > _BACK:
                    del recent[0]
                state = new
        else:
            return order
        repairs += 1
        if repairs > _FREE_REPAIRS + p // _OPS_PER_REPAIR:
            return None  # cheaper decided exactly
        got = _repair(keys, order, p, recent, state, model)
        if got is None:
            return None
        p, state = got
        n = len(order)  # a repair may leave an op out


def _place_pending_puts(ops: Sequence[Op], mids: list[float], view: Any) -> set[int] | None:
    """For a register: each put that never completed at an instant of its interval where the reads want it -- just
    before the earliest midpoint of a get of its value (not before its call), or, when no get returned its value,
    nowhere: the indices of those left out (they may never have taken effect)."""
    pending = {}
    for j, op in enumerate(ops):
        if op.completed is None and op.path == "put":
            v = view(op)
            if v is not None and v[0] == "write" and v[1] is not None:
                pending[v[1]] = j
    if not pending:
        return None
    first: dict[Any, float] = {}
    for j, op in enumerate(ops):
        if op.completed is not None and op.error is None and op.path != "put":
            v = view(op)
            if v is not None and v[0] == "read" and v[1] in pending and mids[j] < first.get(v[1], INF):
                first[v[1]] = mids[j]
    out = set()
    for value, j in pending.items():
        at = first.get(value)
        if at is None:
            out.add(j)
        else:
            mids[j] = max(ops[j].invoked, at - 1e-9 * (1 + abs(at)))
    return out


def _writes(view: Any, op: Op) -> bool:
    v = view(op)
    return v is not None and v[0] == "write"


def _repair(keys: tuple[str, ...], order: list[Op], p: int, recent: list[tuple[int, Any]], state: Any,
            model: Model) -> tuple[int, Any] | None:
    """The first new order of a segment around the refused op at p that works (see the module doc), put in place
    of the segment; (the position to go on from, the state there), or None. `recent` (the last ops that changed the
    state; for a register model, the writes among the ops since then that did not are added here) is brought up to
    date."""
    kept = recent
    if model.register_view is not None:
        recent = _with_unchanging_writes(order, p, recent, state, model.register_view)
    states = dict(recent)
    r = order[p]
    for a, b, seg in _candidates(order, p, recent):
        end = next(k for k, op in enumerate(seg) if op is r) + 1
        got = _replayed(keys, seg, end, states.get(a, state) if a < p else state, model)
        if got is None:
            continue
        after, changes = got
        order[a:b] = seg
        del recent[next((k for k, (pos, _) in enumerate(recent) if pos >= a), len(recent)):]
        recent.extend((a + k, before) for k, before in changes)
        del recent[:-_BACK]
        kept[:] = recent
        return a + end, after
    return None


def _with_unchanging_writes(order: list[Op], p: int, recent: list[tuple[int, Any]], state: Any,
                            view: Any) -> list[tuple[int, Any]]:
    """`recent` with the writes among the ops since its first one that changed nothing (a delete of a missing key,
    say), each with the state in effect before it: the state before the next change, or `state`."""
    start = recent[0][0] if recent else max(0, p - _BACK)
    out: list[tuple[int, Any]] = []
    k = 0
    for pos in range(start, p):
        while k < len(recent) and recent[k][0] < pos:
            k += 1
        if k < len(recent) and recent[k][0] == pos:
            out.append(recent[k])
        elif _writes(view, order[pos]):
            out.append((pos, recent[k][1] if k < len(recent) else state))
    return out[-_BACK:]


def _replayed(keys: tuple[str, ...], seg: list[Op], end: int, state: Any, model: Model) -> tuple[Any, list] | None:
    """Whether `seg` keeps real time and the model accepts its first `end` ops (to r) from `state` (the main loop
    replays the rest): (the state after them, (index, state before) of each write among them), or None."""
    first_return = INF
    for op in reversed(seg):
        if op.invoked > first_return:
            return None  # an op after it returned before it was called
        if op.completed is not None and op.completed < first_return:
            first_return = op.completed
    changes = []
    step, view = model.step, model.register_view
    for k, op in enumerate(seg[:end]):
        ok, new = step(keys, state, op)
        if not ok:
            return None
        if new != state or (view is not None and _writes(view, op)):
            changes.append((k, state))
            state = new
    return state, changes


def _candidates(order: list[Op], p: int, recent: list[tuple[int, Any]]) -> Iterator[tuple[int, int, list[Op]]]:
    """(a, b, new order of order[a:b]) for the repairs of the module doc, in the order they are tried; a new order
    holds the same ops, less one that may never have taken effect for a "left out" repair."""
    r = order[p]
    positions = [pos for pos, _ in recent]
    for pos in reversed(positions):  # r moved back before a recent state change
        yield pos, p + 1, [r] + order[pos:p]
    if positions:  # the last write moved before an earlier one
        u = positions[-1]
        for w in reversed(positions[:-1]):
            yield w, p + 1, [order[u]] + order[w:u] + order[u + 1:p + 1]
    for k in range(len(positions) - 1, -1, -1):  # a recent write moved to just before r, or before a later write
        w = positions[k]
        yield w, p + 1, order[w + 1:p] + [order[w], r]
        for x in positions[k + 1:]:
            yield w, p + 1, order[w + 1:x] + [order[w], r] + order[x:p]
    latest = r.completed if r.completed is not None else INF
    for q in range(p + 1, min(p + _AHEAD, len(order))):  # a later op, called before r returned, pulled before r,
        if order[q].invoked > latest:  # or r after it
            continue
        yield p, q + 1, [order[q]] + order[p:q]
        yield p, q + 1, order[p + 1:q + 1] + [r]
    for pos in reversed(positions):  # a recent state change that may never have happened left out
        if unknown(order[pos]):
            yield pos, p + 1, order[pos + 1:p + 1]
