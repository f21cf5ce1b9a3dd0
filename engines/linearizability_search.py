"""The search of `engines.linearizability`: Wing & Gong's, with Lowe's memo, constant-time per step (see there)."""
from __future__ import annotations

import math
import random
import time
from typing import Sequence

import attrs

from model.history import Model, Op

__all__ = ["Verdict", "SearchStopped", "search_part", "unknown", "DEFAULT_MAX_STATES"]

#: The search's memory bound per part: memo entries (about 200 bytes each).
DEFAULT_MAX_STATES = 4_000_000


@attrs.define
class Verdict:
    """`linearizable`: True, False, or None when a bound stopped the search (undecided: `why` says which, and
    `undecided` lists the keys of every part left undecided). For a violation: the part's keys, the longest
    linearizable prefix found (op ids, in order) and the op that cannot be placed after it. `methods`: how
    many parts each path decided ("register", "search")."""

    linearizable: bool | None
    steps: int = 0
    keys: tuple[str, ...] = ()
    prefix: list[int] = attrs.field(factory=list)
    unplaceable: int | None = None
    parts: int = 0
    why: str | None = None
    undecided: list[tuple[str, ...]] = attrs.field(factory=list)
    methods: dict[str, int] = attrs.field(factory=dict)

    def to_json(self) -> dict:
        return {"linearizable": self.linearizable, "steps": self.steps, "keys": list(self.keys),
                "prefix": list(self.prefix), "unplaceable": self.unplaceable, "parts": self.parts,
                "why": self.why, "undecided": [list(k) for k in self.undecided], "methods": dict(self.methods)}


class SearchStopped(Exception):
    def __init__(self, why: str, steps: int) -> None:
        super().__init__(why)
        self.why, self.steps = why, steps


def unknown(op: Op) -> bool:
    """Whether `op` may or may not have taken effect: it never completed, or it is a write that raised."""
    return op.pending or (op.error is not None and op.path in ("put", "delete"))


def search_part(keys: tuple[str, ...], ops: Sequence[Op], model: Model, *, max_states: int = DEFAULT_MAX_STATES,
                deadline: float | None = None, classes: Sequence[int] | None = None,
                returns: Sequence[float] | None = None, reads: Sequence[bool] | None = None,
                witness: bool = False) -> Verdict:
    """Decide one part by search (see the module doc). Raises `SearchStopped` when a bound is reached.

    `returns[i]`: op i's return time, when not the op's own (+inf for an op that may or may not take effect).
    `classes[i]`: -1, or the class of op i among ops that never return and have the same effect (the caller
    vouches for it). Within a class the ops are only linearized in call order (two of them can always swap),
    and the memo counts how many of each class are used instead of which: a state reached with no more used of
    any class than a state already tried is not tried again (the unused ones are interchangeable, so it can do
    nothing the other could not). An op of a class is only linearized right before a read (`reads`): one
    whose effect no read sees next can be left out (it may not take effect at all) and the linearization stays
    one; so the memo also tells apart states right after such an op.
    `reads[i]`: op i never changes the state; such an op is linearized as soon as its call is reached in a
    state where it is legal, with no alternative tried (every linearization from there can move it first:
    nothing that must precede it is left, it changes nothing, and all after it stays after it).
    `witness`: a linearizable verdict carries the linearization found as its `prefix`."""
    n = len(ops)
    events = []
    for i, op in enumerate(ops):
        ret = returns[i] if returns is not None else (math.inf if unknown(op) else op.completed)
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
    rng = random.Random(0x5EED ^ n)
    zob = [rng.getrandbits(128) for _ in range(n)]
    cls = list(classes) if classes is not None and any(c >= 0 for c in classes) else None
    guard, unit, n_cls = _class_order(ops, cls) if cls is not None else (None, [], 0)
    forced = bytes(bool(r) for r in reads) if reads is not None else bytes(n)
    lin = bytearray(n)
    step = model.step
    state = model.init(keys)
    h = cnt = 0
    seen: dict = {}
    # (call event, state before, hash before, counts before, parent frame, a forced read, an optional write)
    frame: tuple | None = None
    best: tuple[tuple | None, int, int] | None = None  # (frame, depth, op at whose return it stopped)
    depth = steps = 0
    entry = nxt[head]
    while nxt[head] != -1:
        steps += 1
        if deadline is not None and not steps & 4095 and time.monotonic() > deadline:
            raise SearchStopped(f"the time bound ran out in the search of {', '.join(keys)} after {steps:,} steps",
                                steps)
        if is_call[entry]:
            i = op_of[entry]
            if guard is not None and guard[i] >= 0 and not lin[guard[i]]:
                entry = nxt[entry]
                continue
            if frame is not None and frame[6] and not forced[i]:
                entry = nxt[entry]  # after an optional write, only a read
                continue
            ok, new_state = step(keys, state, ops[i])
            if ok:
                if cls is None or cls[i] < 0:
                    nh, ncnt, opt = h ^ zob[i], cnt, False
                else:
                    nh, ncnt, opt = h, cnt + unit[cls[i]], True
                memo = (nh, new_state, opt)
                got = seen.get(memo)
                if got is None or (cls is not None and not _covered(got, ncnt, n_cls)):
                    if got is None:
                        seen[memo] = ncnt if cls is None else [ncnt]
                    else:
                        got.append(ncnt)
                    if len(seen) > max_states:
                        raise SearchStopped(f"the search of {', '.join(keys)} kept {max_states:,} states (its "
                                            "memory bound, max_states) without a verdict", steps)
                    frame = (entry, state, h, cnt, frame, forced[i], opt)
                    depth += 1
                    state, h, cnt = new_state, nh, ncnt
                    lin[i] = 1
                    a, b = prv[entry], nxt[entry]  # unlink the call
                    nxt[a] = b
                    prv[b] = a
                    p = pos_ret[i]  # and the return
                    a, b = prv[p], nxt[p]
                    nxt[a] = b
                    if b != -1:
                        prv[b] = a
                    entry = nxt[head]
                    continue
            entry = nxt[entry]
        else:
            if events[entry][0] == math.inf:  # only ops that may never take effect are left: leave them out
                break
            if best is None or depth >= best[1]:
                best = (frame, depth, op_of[entry])
            while True:  # back to the last choice that has an alternative
                if frame is None:
                    return Verdict(False, steps, keys, _ids(ops, op_of, best[0]), ops[best[2]].id)
                entry, state, h, cnt, frame, was_forced, _ = frame
                depth -= 1
                i = op_of[entry]
                lin[i] = 0
                p = pos_ret[i]
                a, b = prv[p], nxt[p]
                nxt[a] = p
                if b != -1:
                    prv[b] = p
                a, b = prv[entry], nxt[entry]
                nxt[a] = entry
                prv[b] = entry
                if not was_forced:
                    break
            entry = nxt[entry]
    return Verdict(True, steps, keys, _ids(ops, op_of, frame) if witness else [])


_COUNT_BITS = 24


def _class_order(ops: Sequence[Op], cls: list[int]) -> tuple[list[int], list[int], int]:
    """Per op, the previous op of its class in call order (or -1); each class's unit in the packed counts."""
    guard = [-1] * len(ops)
    last: dict[int, int] = {}
    for i in sorted(range(len(ops)), key=lambda i: ops[i].invoked):
        if cls[i] >= 0:
            guard[i] = last.get(cls[i], -1)
            last[cls[i]] = i
    n_cls = max(cls) + 1
    return guard, [1 << (_COUNT_BITS * c) for c in range(n_cls)], n_cls


def _covered(tried: list[int], counts: int, n_cls: int) -> bool:
    """Whether some packed count vector in `tried` is componentwise at most `counts`."""
    mask = (1 << _COUNT_BITS) - 1
    for t in tried:
        if t == counts:
            return True
        for c in range(n_cls):
            if (t >> (_COUNT_BITS * c)) & mask > (counts >> (_COUNT_BITS * c)) & mask:
                break
        else:
            return True
    return False


def _ids(ops: Sequence[Op], op_of: list[int], frame: tuple | None) -> list[int]:
    out = []
    while frame is not None:
        out.append(ops[op_of[frame[0]]].id)
        frame = frame[4]
    return out[::-1]


