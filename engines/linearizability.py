"""Linearizability of a concurrent history against the sequential key-value register (`model.history.KVModel`).

The search is Wing & Gong's, with Lowe's memo of (set of linearized ops, model state) pairs already tried,
run on each partition of the history separately (P-compositionality: a history is linearizable iff the
sub-history of every independent part is). The contract asks for a register per key, so by default a
multi-key read is split into what it says about each key over its own interval (`get_batch`: each value;
`get_prefix` / `contains_batch` / `contains_async`: the hits of the leading run, then a miss of the key after
it) and every key is a part. With `snapshot=True` a multi-key read must instead see one instant of all its
keys, and it joins them into one part. Within a part, call and return events sit in one doubly linked list ordered by time (a call
before a return at equal times: they overlap); the search linearizes the first call it can, removes that
op's two events, and backtracks when it reaches the return of an op it has not placed.

An op that never completed returns at +infinity: it may take effect at any point after its call, or never
(a read that never answered constrains nothing). A write that raised is treated the same way (it may or may
not have happened).
"""
from __future__ import annotations

import math
from typing import Sequence

import attrs

from model.history import History, KVModel, Op

__all__ = ["Verdict", "check", "partitions", "per_key"]


@attrs.define
class Verdict:
    """`linearizable`: True, False, or None when the search ran out of `max_steps` (undecided).
    For a violation: the part's keys, the longest linearizable prefix found (op ids, in order) and the op that
    cannot be placed after it."""

    linearizable: bool | None
    steps: int = 0
    keys: tuple[str, ...] = ()
    prefix: list[int] = attrs.field(factory=list)
    unplaceable: int | None = None
    parts: int = 0

    def to_json(self) -> dict:
        return {"linearizable": self.linearizable, "steps": self.steps, "keys": list(self.keys),
                "prefix": list(self.prefix), "unplaceable": self.unplaceable, "parts": self.parts}


def per_key(ops: Sequence[Op]) -> list[Op]:
    """`ops` with every multi-key read split into single-key reads (same id, caller and interval)."""
    out: list[Op] = []
    for op in ops:
        if len(op.keys) == 1 or op.path in ("put", "delete"):
            out.append(op)
            continue
        if op.pending or op.error is not None:
            continue  # an unanswered read constrains nothing
        res = op.result
        if op.path == "get_batch":
            parts = [("get", k, v) for k, v in zip(op.keys, res if isinstance(res, list) else [])]
            if not isinstance(res, list) or len(res) != len(op.keys):
                parts = [("get", op.keys[0], ("$malformed", repr(res)))]
        else:
            hits = len(res) if isinstance(res, list) else res if isinstance(res, int) else -1
            if not 0 <= hits <= len(op.keys):
                parts = [("get", op.keys[0], ("$malformed", repr(res)))]
            elif op.path == "get_prefix":
                parts = [("get", k, v) for k, v in zip(op.keys, res)]
            else:
                parts = [("contains", k, True) for k in op.keys[:hits]]
            if 0 <= hits < len(op.keys):
                parts.append(("contains", op.keys[hits], False))
        for path, key, result in parts:
            out.append(attrs.evolve(op, path=path, keys=(key,), result=result))
    return out


def partitions(ops: Sequence[Op]) -> list[tuple[tuple[str, ...], list[Op]]]:
    """The independent parts of `ops`: (keys, ops touching them), keys joined by multi-key ops."""
    parent: dict[str, str] = {}

    def find(k: str) -> str:
        while parent.setdefault(k, k) != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for op in ops:
        root = find(op.keys[0])
        for k in op.keys[1:]:
            other = find(k)
            if other != root:
                parent[other] = root
    groups: dict[str, list[Op]] = {}
    for op in ops:
        groups.setdefault(find(op.keys[0]), []).append(op)
    keys_of: dict[str, list[str]] = {}
    for k in parent:
        keys_of.setdefault(find(k), []).append(k)
    return [(tuple(sorted(keys_of[r])), groups[r]) for r in sorted(groups)]


def _check_part(keys: tuple[str, ...], ops: list[Op], max_steps: int, spec: type = KVModel) -> Verdict:
    model = spec(keys)
    n = len(ops)
    events = []
    for i, op in enumerate(ops):
        unknown = op.pending or (op.error is not None and op.path in ("put", "delete"))
        ret = math.inf if unknown else op.completed
        events.append((op.invoked, 0, i))
        events.append((ret, 1, i))
    events.sort()
    m = len(events)
    is_call = [e[1] == 0 for e in events]
    op_of = [e[2] for e in events]
    pos_ret = [0] * n
    for p, (_, kind, i) in enumerate(events):
        if kind == 1:
            pos_ret[i] = p
    head = m  # sentinel; END is -1
    nxt = list(range(1, m)) + [-1, 0]
    prv = [head] + list(range(0, m - 1)) + [-1]

    def unlink(p: int) -> None:
        a, b = prv[p], nxt[p]
        nxt[a] = b
        if b != -1:
            prv[b] = a

    def relink(p: int) -> None:
        a, b = prv[p], nxt[p]
        nxt[a] = p
        if b != -1:
            prv[b] = p

    state = model.init()
    linearized = 0
    seen: set = set()
    stack: list[tuple[int, tuple]] = []
    best: tuple[list[int], int | None] = ([], None)
    steps = 0
    entry = nxt[head]
    while nxt[head] != -1:
        steps += 1
        if steps > max_steps:
            return Verdict(None, steps, keys)
        if is_call[entry]:
            i = op_of[entry]
            ok, new_state = model.step(state, ops[i])
            if ok:
                bits = linearized | (1 << i)
                memo = (bits, new_state)
                if memo not in seen:
                    seen.add(memo)
                    stack.append((entry, state))
                    state, linearized = new_state, bits
                    unlink(entry)
                    unlink(pos_ret[i])
                    entry = nxt[head]
                    continue
            entry = nxt[entry]
        else:
            if len(stack) >= len(best[0]):
                best = ([ops[op_of[e]].id for e, _ in stack], ops[op_of[entry]].id)
            if not stack:
                return Verdict(False, steps, keys, best[0], best[1])
            entry, state = stack.pop()
            i = op_of[entry]
            linearized &= ~(1 << i)
            relink(pos_ret[i])
            relink(entry)
            entry = nxt[entry]
    return Verdict(True, steps, keys)


def check(history: History | Sequence[Op], *, max_steps: int = 2_000_000, snapshot: bool = False,
          spec: type = KVModel) -> Verdict:
    """Decide whether `history` is linearizable against `spec` (a `KVModel` class: `model.history.LossyKVModel` for a
    history through real-server faults); the first part that is not (or is undecided) is reported."""
    ops = history.ops if isinstance(history, History) else list(history)
    if not snapshot:
        ops = per_key(ops)
    parts = partitions(ops)
    steps = 0
    undecided = None
    for keys, part_ops in parts:
        v = _check_part(keys, part_ops, max_steps - steps, spec)
        steps += v.steps
        if v.linearizable is False:
            v.steps, v.parts = steps, len(parts)
            return v
        if v.linearizable is None:
            undecided = undecided or v
            if steps >= max_steps:
                break
    if undecided is not None:
        return Verdict(None, steps, undecided.keys, parts=len(parts))
    return Verdict(True, steps, parts=len(parts))
