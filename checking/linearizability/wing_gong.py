"""The search of `checking.linearizability`: Wing & Gong's, with Lowe's memo, constant-time per step (see there).

What a caller of `search_part` may add about the ops of a part:
- `returns[i]`: op i's return time, when not the op's own (+inf for an op that may or may not take effect).
- `reads[i]`: op i never changes the state; such an op is linearized as soon as its call is reached in a
  state where it is legal, with no alternative tried (every linearization from there can move it first:
  nothing that must precede it is left, it changes nothing, and all after it stays after it).
- `classes[i]`: -1, or the class of op i among ops that never return and have the same effect (the caller
  vouches for it). These optional ops are kept out of the event list: within a class they are linearized in
  call order only (two of them can always swap), each only right before a read (one whose effect no read
  sees next can be left out: it may never take effect), and only once every other op callable there has been
  tried (the same alternatives, in another order). The memo counts how many of each class are used instead of
  which, and a state reached with one more of a class used than one already tried is not tried again (the
  unused ones are interchangeable, so it can do nothing the other could not).
"""
from __future__ import annotations

import math
import random
import time
from typing import Sequence

from checking.linearizability.verdict import Verdict
from model.history import Model, Op

__all__ = ["Verdict", "SearchStopped", "search_part", "unknown", "DEFAULT_MAX_STATES"]

#: The search's memory bound per part: memo entries (about 200 bytes each).
DEFAULT_MAX_STATES = 4_000_000


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
    """Decide one part by search (see the module doc for `returns`, `reads` and `classes`). Raises
    `SearchStopped` when a bound is reached. `witness`: a linearizable verdict carries the linearization found
    as its `prefix`."""
    n = len(ops)
    cls = list(classes) if classes is not None and any(c >= 0 for c in classes) else [-1] * n
    events, is_call, op_of, pos_ret, pos_call, by_class, nxt, prv = _event_list(ops, cls, returns)
    n_cls = len(by_class)
    head = len(events)  # sentinel; END is -1
    rng = random.Random(0x5EED ^ n)
    zob = [rng.getrandbits(128) for _ in range(n)]
    forced = bytes(bool(r) for r in reads) if reads is not None else bytes(n)
    step = model.step
    state = model.init(keys)
    h = 0
    used = [0] * n_cls
    seen: set = set()
    # (event, state before, hash before, parent frame, a forced read, class of an optional write or -1, op)
    frame: tuple | None = None
    best: tuple[tuple | None, int, int] | None = None  # (frame, depth, op at whose return it stopped)
    depth = steps = 0
    entry = nxt[head]
    try_class = -1  # >= 0: at the end of a window (`entry` a return), the next class of optional op to try
    while nxt[head] != -1:
        steps += 1
        if deadline is not None and not steps & 4095 and time.monotonic() > deadline:
            raise SearchStopped(f"the time bound ran out in the search of {', '.join(keys)} after {steps:,} steps",
                                steps)
        if try_class < 0 and is_call[entry]:
            i = op_of[entry]
            if frame is not None and frame[5] >= 0 and not forced[i]:
                entry = nxt[entry]  # after an optional write, only a read
                continue
            ok, new_state = step(keys, state, ops[i])
            if ok:
                nh = h ^ zob[i]
                memo = (nh, new_state, tuple(used), False) if n_cls else (nh, new_state)
                if memo not in seen and not (n_cls and _covered(seen, nh, new_state, used, False)):
                    seen.add(memo)
                    if len(seen) > max_states:
                        raise SearchStopped(f"the search of {', '.join(keys)} kept {max_states:,} states (its "
                                            "memory bound, max_states) without a verdict", steps)
                    frame = (entry, state, h, frame, forced[i], -1, i)
                    depth += 1
                    state, h = new_state, nh
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
            continue
        if events[entry][0] == math.inf:  # only ops that may never take effect are left: leave them out
            break
        if try_class < 0:
            try_class = 0
        if n_cls and (frame is None or frame[5] < 0):  # an optional write (then a read) at the window's end
            pushed = _push_optional(keys, ops, step, seen, by_class, pos_call, used, try_class, entry, state, h,
                                    frame)
            if pushed is not None:
                frame, state = pushed
                depth += 1
                try_class = -1
                entry = nxt[head]
                continue
        if best is None or depth >= best[1]:
            best = (frame, depth, op_of[entry])
        try_class = -1
        while True:  # back to the last choice that has an alternative
            if frame is None:
                return Verdict(False, steps, keys, _ids(ops, best[0]), ops[best[2]].id)
            entry, state, h, frame, was_forced, c, _ = frame
            depth -= 1
            if c >= 0:
                used[c] -= 1
                try_class = c + 1  # the next class at the same window's end
                break
            i = op_of[entry]
            p = pos_ret[i]
            a, b = prv[p], nxt[p]
            nxt[a] = p
            if b != -1:
                prv[b] = p
            a, b = prv[entry], nxt[entry]
            nxt[a] = entry
            prv[b] = entry
            if not was_forced:
                entry = nxt[entry]
                break
    return Verdict(True, steps, keys, _ids(ops, frame) if witness else [])


def _event_list(ops: Sequence[Op], cls: list[int], returns: Sequence[float] | None) -> tuple:
    """(the events sorted: (time, 0 call / 1 return, op); whether each is a call; its op; each op's return and
    call position; the optional ops of each class in call order; the events' doubly linked list: the next and
    the previous of each position, the sentinel head at position len(events), END -1). The optional ops' calls
    are not in the list, nor their returns in the events."""
    n = len(ops)
    events = []
    for i, op in enumerate(ops):
        ret = returns[i] if returns is not None else (math.inf if unknown(op) else op.completed)
        events.append((op.invoked, 0, i))
        if cls[i] < 0:
            events.append((ret, 1, i))  # type: ignore
    events.sort()
    m = len(events)
    pos_ret, pos_call = [0] * n, [0] * n
    for p, (_, kind, i) in enumerate(events):
        if kind == 1:
            pos_ret[i] = p
        else:
            pos_call[i] = p
    by_class: list[list[int]] = [[] for _ in range(max(cls, default=-1) + 1)]
    for p, (_, kind, i) in enumerate(events):
        if kind == 0 and cls[i] >= 0:
            by_class[cls[i]].append(i)
    nxt = list(range(1, m)) + [-1, 0]
    prv = [m] + list(range(0, m - 1)) + [-1]
    for c in by_class:
        for i in c:
            p = pos_call[i]
            a, b = prv[p], nxt[p]
            nxt[a] = b
            if b != -1:
                prv[b] = a
    return events, [e[1] == 0 for e in events], [e[2] for e in events], pos_ret, pos_call, by_class, nxt, prv


def _push_optional(keys: tuple[str, ...], ops: Sequence[Op], step, seen: set, by_class: list[list[int]],
                   pos_call: list[int], used: list[int], try_class: int, entry: int, state: object, h: int,
                   frame: tuple | None) -> tuple[tuple, object] | None:
    """At a window's end (`entry` a return), the next optional write from class `try_class` on that can go there:
    (its frame, the state after it), with `used` and `seen` updated; None when none can."""
    n_cls = len(by_class)
    while try_class < n_cls:
        c = try_class
        try_class += 1
        if used[c] >= len(by_class[c]):
            continue
        i = by_class[c][used[c]]
        if pos_call[i] > entry:
            continue
        ok, new_state = step(keys, state, ops[i])
        if not ok:
            continue
        used[c] += 1
        memo = (h, new_state, tuple(used), True)
        if memo in seen or _covered(seen, h, new_state, used, True):
            used[c] -= 1
            continue
        seen.add(memo)
        return (entry, state, h, frame, 0, c, i), new_state
    return None


def _covered(seen: set, h: int, state: object, used: list[int], after_optional: bool) -> bool:
    """Whether the same ops and state with one fewer used of some class were already tried (a dominated
    state). Only those neighbours are looked up: cheap, and a miss only costs a repeated sub-search."""
    for c, k in enumerate(used):
        if k:
            used[c] = k - 1
            hit = (h, state, tuple(used), after_optional) in seen
            used[c] = k
            if hit:
                return True
    return False


def _ids(ops: Sequence[Op], frame: tuple | None) -> list[int]:
    out = []
    while frame is not None:
        out.append(ops[frame[6]].id)
        frame = frame[3]
    return out[::-1]
