"""The first try of `checking.linearizability` on one key's part of a register model: a greedy linearization in one
pass over the call and return events, with no backtracking. It either builds a linearization (then the part is
linearizable) or gives up, and an exact path decides; giving up says nothing about the part.

The events go in time order (a call before a return at equal times). Reads go as early as they can, writes as
late as they can:
- at a read's call, the writes that returned since the last call ("overdue") are placed first, in an order that
  keeps real time among them and puts what the read needs last (`_order`); then the read is placed if the model
  accepts it in the current state, else it waits;
- a write is placed at the first call after its return, or when a waiting read's return needs it (a get: the put
  of its value; a miss: the pending delete that returns first; a `contains`-true read: the pending put that returns
  first); once a write is placed, every waiting read the new state satisfies is placed right after it;
- writes no read is likely to need (a put whose value nobody reads, a delete no miss could follow) are placed,
  unseen, right before the next write placed; and before a write a read may need, a pending put that a waiting
  get reads and no read called later needs goes first, with that get;
- a read still waiting at its return, or a write the model refuses, gives up.
A write that never completed (or raised) has no return: it is placed only when a read needs it, or never (it may
never take effect); a read that never answered (or raised) constrains nothing and is left out.

Why an order found is a linearization: when an op is placed, every op that returned before it was called is
already placed (reads are placed by their return; a write that returned is overdue and placed before the next
call's read, before a write placed on demand, and before the writes called after it returned: `_order`, and the
unseen or early writes only when none overdue returned before their call), so real time is kept; the model
accepted each op in the state before it (its own `step` decides: the register view only says which write a read
waits for); and every op that completed without error is placed (a read by its return, a write at the end)."""
from __future__ import annotations

import bisect
import math
from typing import Any, Callable, Sequence

from model.history import READ_ANY, Model, Op

__all__ = ["greedy_linearizes", "greedy_order"]

INF = math.inf


def greedy_linearizes(keys: tuple[str, ...], ops: Sequence[Op], model: Model) -> bool:
    """Whether the greedy pass of the module doc builds a linearization of `ops` (one key's part; `model` has a
    `register_view`). False is no verdict."""
    return greedy_order(keys, ops, model) is not None


def greedy_order(keys: tuple[str, ...], ops: Sequence[Op], model: Model) -> list[int] | None:
    """The linearization the greedy pass builds (indices into `ops`), or None when it gives up."""
    g = _Greedy.of(keys, ops, model)
    if g is None:
        return None
    step, placed, views, overdue, order = model.step, g.placed, g.views, g.overdue, g.order
    waiting, pending, hideable, unneeded, times = g.waiting, g.pending, g.hideable, g.unneeded, g.times
    n = len(ops)
    for e in g.events:
        is_return = e >= n
        i = e - n if is_return else e
        kind, value = views[i]
        if is_return:
            if placed[i]:
                continue
            if kind == "write":
                if hideable:
                    hideable.pop(i, None)
                overdue.append(i)
                continue
            g.now = times[e]
            if not g.settle(i):
                return None
            continue
        if kind == "write":
            if unneeded[i]:
                hideable[i] = None
            if value in pending:  # another put of this value: the first placed now if it returned, else give up
                g.now = times[e]
                if not g.flush(-1) or value in pending:
                    return None
            pending[value if value is not None else (None, i)] = i
            continue
        if overdue:
            if len(overdue) == 1 and not waiting:  # `flush`, for the common case
                w = overdue.pop()
                if not placed[w]:
                    if hideable and not g.hide_before(w, ops[w].completed):  # type: ignore
                        return None
                    ok, g.state = step(keys, g.state, ops[w])
                    if not ok:
                        return None
                    placed[w] = 1
                    order.append(w)
                    v = views[w][1]
                    del pending[v if v is not None else (None, w)]
            else:
                g.now = times[e]
                if not g.flush(i):
                    return None
        ok, _ = step(keys, g.state, ops[i])
        if ok:
            placed[i] = 1
            order.append(i)
        else:
            waiting.setdefault(value if kind != READ_ANY else READ_ANY, []).append(i)
    g.now = INF
    if not g.flush(-1):
        return None
    return order if placed.count(1) - sum(placed[w] for w in g.optional) == g.required else None


class _Greedy:
    """The state of the greedy pass: the model state, what is placed (`placed`), the waiting reads by what they
    need (`waiting`: a value, None for a miss, `READ_ANY`), the writes called and not placed (`pending`: a put by
    its value, a delete i by (None, i)), `overdue` (returned since the last flush, in return order) and `hideable`."""

    keys: tuple[str, ...]
    ops: Sequence[Op]
    views: list[Any]
    events: list[int]
    times: list[float]
    step: Callable[[tuple[str, ...], Any, Op], tuple[bool, Any]]
    last_read: dict[Any, float]
    state: Any
    placed: bytearray
    waiting: dict[Any, list[int]]
    pending: dict[Any, int]
    hideable: dict[int, None]
    overdue: list[int]
    unneeded: bytearray
    now: float
    required: int
    order: list[int]
    optional: list[int]

    @classmethod
    def of(cls, keys: tuple[str, ...], ops: Sequence[Op], model: Model) -> "_Greedy | None":
        """The pass's state before the first event; None when an op is outside the register view. The events are
        numbers: i is op i's call, n + i its return, sorted stably by time from that order, so at equal times a call
        comes before a return (and then the op index decides); those that never happen (the return of an op that
        never completed, the call of a read that never answered) are left out."""
        view = model.register_view
        n = len(ops)
        times = [INF] * (2 * n)
        views: list[Any] = [None] * n
        last_read: dict[Any, float] = {}  # per value read: the latest call of a get of it
        misses: list[tuple[float, float]] = []
        writes: list[int] = []
        required = 0  # the ops that completed without error: each must be placed
        for i, op in enumerate(ops):
            v = view(op)  # type: ignore
            if v is None:
                return None
            views[i] = v
            call, ret = op.invoked, op.completed
            if ret is None or op.error is not None:
                if v[0] == "write":
                    times[i] = call
                    writes.append(i)
                continue  # a read that never answered constrains nothing
            times[i] = call
            times[n + i] = ret
            required += 1
            if v[0] == "write":
                writes.append(i)
            elif v[0] == "read":
                if v[1] is None:
                    misses.append((call, ret))
                elif last_read.get(v[1], -INF) < call:
                    last_read[v[1]] = call
        events = sorted(range(2 * n), key=times.__getitem__)
        never = times.count(INF)
        if never:
            del events[2 * n - never:]
        g = cls()
        g.keys, g.ops, g.views, g.events, g.times, g.step = keys, ops, views, events, times, model.step
        g.last_read, g.state, g.placed = last_read, model.init(keys), bytearray(n)
        g.waiting, g.pending, g.hideable, g.overdue = {}, {}, {}, []
        g.unneeded = _unneeded_writes(ops, views, writes, last_read, misses)
        g.now = -INF
        g.required, g.order = required, []
        g.optional = [w for w in writes if ops[w].completed is None or ops[w].error is not None]
        return g

    def place(self, w: int, limit: float = INF) -> bool:
        """Write w placed now (after the early and unseen writes called by `limit`), then every waiting read the new
        state satisfies."""
        if self.waiting and not self.unneeded[w] and not self._serve_before(w, limit):
            return False
        if self.hideable and not self.hide_before(w, limit):
            return False
        return self._put_down(w) and self._serve(self.views[w][1])

    def hide_before(self, w: int, limit: float) -> bool:
        """The hideable writes called by `limit` placed (unseen: write w comes right after them)."""
        for x in [x for x in self.hideable if x != w and self.ops[x].invoked <= limit]:
            if not self._put_down(x):
                return False
        return True

    def _serve(self, value: Any) -> bool:
        """The waiting reads a write of `value` (None: a delete) just placed satisfies, placed."""
        waiting = self.waiting
        readers = waiting.pop(value, None) or []
        if value is not None and READ_ANY in waiting:
            readers += waiting.pop(READ_ANY)
        for r in readers:
            ok, _ = self.step(self.keys, self.state, self.ops[r])
            if not ok:
                return False
            self.placed[r] = 1
            self.order.append(r)
        return True

    def _serve_before(self, w: int, limit: float) -> bool:
        """Before write w: each pending put called by `limit` that a waiting get reads and no read called from now
        on needs, with its waiting gets (else w would hide its value from them)."""
        for value in [v for v in self.waiting if v is not None and v is not READ_ANY]:
            u = self.pending.get(value, -1)
            if u < 0 or u == w or self.ops[u].invoked > limit or self.last_read[value] >= self.now:
                continue
            if not (self._put_down(u) and self._serve(value)):
                return False
        return True

    def _put_down(self, w: int) -> bool:
        """Write w placed (no read after it yet)."""
        ok, self.state = self.step(self.keys, self.state, self.ops[w])
        if not ok:
            return False
        self.placed[w] = 1
        self.order.append(w)
        if self.hideable:
            self.hideable.pop(w, None)
        value = self.views[w][1]
        del self.pending[value if value is not None else (None, w)]
        return True

    def flush(self, r: int) -> bool:
        """Place the overdue writes in the order of `_order`, the next read being r (-1: none)."""
        overdue = self.overdue[:]
        self.overdue.clear()
        if len(overdue) == 1:
            return bool(self.placed[overdue[0]]) or self.place(overdue[0], self.ops[overdue[0]].completed)  # type: ignore
        overdue = self._order(overdue, self._needed(r, overdue) if r >= 0 else -1)
        limits = [INF] * (len(overdue) + 1)  # the earliest return among the overdue writes from each on
        for j in range(len(overdue) - 1, -1, -1):
            limits[j] = min(limits[j + 1], self.ops[overdue[j]].completed)  # type: ignore
        for j, w in enumerate(overdue):
            if not self.placed[w] and not self.place(w, limits[j]):
                return False
        return True

    def _order(self, writes: list[int], needed: int) -> list[int]:
        """`writes` in an order that keeps real time among them (none before one that returned before it was
        called), each next the first that may go next of: those no read is likely to need, the others, `needed`."""
        unneeded, ops = self.unneeded, self.ops
        left = list(writes)
        order = []
        while left:
            first_ret = min(ops[w].completed for w in left)  # type: ignore
            best, best_rank = -1, 3
            for k, w in enumerate(left):
                if ops[w].invoked <= first_ret:  # type: ignore  # else one of the others returned before it was called
                    rank = 0 if unneeded[w] else 2 if w == needed else 1
                    if rank < best_rank:
                        best, best_rank = k, rank
            order.append(left.pop(best))
        return order

    def _needed(self, r: int, writes: list[int]) -> int:
        """The write of `writes` read r needs (for a miss or a `contains`-true, the last returned of its kind)."""
        kind, value = self.views[r]
        for w in reversed(writes):
            v = self.views[w][1]
            if (v is None) if kind != READ_ANY and value is None else (v is not None and (kind == READ_ANY or v == value)):
                return w
        return -1

    def settle(self, r: int) -> bool:
        """At waiting read r's return: the overdue writes placed, then the pending write it needs; whether r is then
        placed."""
        if self.overdue and not self.flush(r):
            return False
        if self.placed[r]:
            return True
        kind, value = self.views[r]
        if kind == READ_ANY or value is None:
            w = self._first_return(kind == READ_ANY)
        else:
            w = self.pending.get(value, -1)
        return w >= 0 and self.place(w) and bool(self.placed[r])

    def _first_return(self, puts: bool) -> int:
        """The pending put (`puts`) or delete that returns first; -1: none."""
        best, at = -1, INF
        for key, w in self.pending.items():
            if (type(key) is tuple and key[0] is None) == puts:
                continue
            op = self.ops[w]
            ret = INF if op.completed is None or op.error is not None else op.completed
            if best < 0 or ret < at:
                best, at = w, ret
        return best


def _unneeded_writes(ops: Sequence[Op], views: list[Any], writes: list[int], last_read: dict[Any, float],
                     misses: list[tuple[float, float]]) -> bytearray:
    """1 for each completed write no read is likely to need: a put whose value no get returned; a delete no
    completed miss could follow (one that returned after the delete was called and was called before a write that
    must follow the delete -- one called after it returned -- returned). Placing such a write unseen changes only
    which linearization the greedy pass tries."""
    out = bytearray(len(ops))
    deletes = []
    for w in writes:
        value = views[w][1]
        if ops[w].completed is None or ops[w].error is not None:
            continue
        if value is None:
            deletes.append(w)
        elif value not in last_read:
            out[w] = 1
    if not deletes:
        return out
    misses.sort()
    miss_calls = [c for c, _ in misses]
    latest_ret, m = [], -INF  # per prefix of the misses by call: the latest return
    for _, r in misses:
        m = max(m, r)
        latest_ret.append(m)
    by_call = sorted((ops[w].invoked, INF if ops[w].completed is None or ops[w].error is not None else ops[w].completed)
                     for w in writes)
    write_calls = [c for c, _ in by_call]
    first_ret = [INF] * (len(by_call) + 1)  # per suffix of the writes by call: the earliest return
    for j in range(len(by_call) - 1, -1, -1):
        first_ret[j] = min(first_ret[j + 1], by_call[j][1])  # type: ignore
    for w in deletes:
        op = ops[w]
        until = first_ret[bisect.bisect_right(write_calls, op.completed)]  # type: ignore
        k = bisect.bisect_right(miss_calls, until)
        out[w] = not (k and latest_ret[k - 1] >= op.invoked)
    return out
