"""The exact sweep of `checking.linearizability.register`: one key of a register whose puts each write their own
value, with deletes, reads of a miss and `contains` reads, decided without general search.

# The problem
Reads are of three kinds: a get of value v (it must see v's one put), a *miss* (get None, `contains` false: the
key absent) and a *contains-true* read (the key present, any value). A write takes effect at one instant inside
its interval; one that never completed (or raised) may also never take effect ("optional"), unless a get returned
its value (then it took effect before that get returned). Given the instants of the writes, the reads are
independent of each other (a read changes nothing), so the question is only where the writes go. Put all call and
return events in one order (calls before returns at equal times); the write instants fall into the gaps between
events. A get of v is satisfied iff v's put goes before the get's return and the next write after it goes after
the get's call: so v's put has a *deadline* (its own return, or the earliest return of a get of v) and a *hold*
(the latest call of a get of v: no other write before it, once v's put has taken effect). A miss (contains-true) is
satisfied iff in some gap of its interval the register was absent (present) at some moment.

# Why the sweep below is exact
1. Lazy instants. Move every write to the last gap before the next *decision* event (a mandatory write's deadline,
   or a miss / contains-true read's return), keeping the order of the writes. Each write stays before its
   deadline (a decision), every hold is still met (writes only move later), and a read satisfied by a moment of
   write w still is: w's moment interval [gap of w, gap of the next write] only moves right, its left end stays
   before the read's return (a decision) and its right end after the read's call. So only those gaps are tried.
2. What the future needs to know. After a gap, the future depends only on: the current write's kind (absent or
   present) and, while it lasts, its hold; which mandatory writes already called are still to be placed; how many
   optional writes of each kind were used; and when the *other* kind was last seen (a read is satisfied iff its
   kind is current, or was seen at a gap after its call). Of two configurations differing only in that time
   and in the optional writes used, one that saw the other kind no earlier and used no more optional writes of
   either kind can do all the other can (optional writes of a kind are interchangeable and stay available once
   called): once a configuration failed, none it dominates is tried.
3. One gap. Writes placed in one gap in a row: every one but the last must have its hold over (a holding write
   can only be last); their order among themselves changes nothing but which kinds were seen in that gap.
4. Interchangeable writes. At a gap, a write whose hold is over (a delete, a put nobody reads, a put whose gets
   were all called) is, for the rest of the sweep, a write of its kind with a deadline. Two such writes of one
   kind can trade places when the one with the earlier deadline goes later, so the writes of a kind placed in a
   gap are the ones with the earliest deadlines; an optional write counts as one with no deadline; two optional
   writes of a kind in a gap, or an optional beside a mandatory one of its kind, do nothing one would not.
So every linearization maps to a path of the sweep's choices (1-4), and every path is a linearization: the sweep
tries, depth first with a memo of configurations already tried, exactly these choices. A found path is also
turned into an order of the ops (`witness`), which the caller checks against the model before it trusts it.

A cheap necessary condition comes first (`checking.linearizability.zones`): the puts with their gets, the deletes
and the puts nobody reads, without the misses and contains reads, must already order (Gibbons & Korach's zones).
"""
from __future__ import annotations

import bisect
import collections
import math
import time
from typing import Any, Callable, Final, Iterator, Sequence, cast

from model.history import READ_ANY, Op

__all__ = ["Instance", "build", "first_dead_end", "sweep", "witness", "SweepStopped", "OverBudget"]

INF: Final = math.inf
_W: Final = 0  # decisions: a mandatory write's deadline, a miss / contains-true read's return, a dead end
_R: Final = 1
_X: Final = 2


class SweepStopped(Exception):
    def __init__(self, why: str, steps: int) -> None:
        super().__init__(why)
        self.why, self.steps = why, steps


class Instance:
    """One key's part in the sweep's terms. Writes are numbered: `w_op` (index into `ops`), `w_call`, `w_dl`
    (deadline; INF: optional), `w_hold` (-INF: none), `w_kind` (0 delete, 1 put). Decisions, in event order:
    time `T`, kind `DT` and `DR` (a write, a read or an op); `event(i)` is decision i's return event (time, op
    index). `new[i]`: mandatory writes called since the previous decision; `optional(k, i)`: optional writes of kind
    k called by then; `opt[k]` those by call. `reads`: (op index, write its get reads or -1, kind) of every read
    that constrains something; `gets[w]`: the op indices of the gets of write w."""

    ops: Sequence[Op]
    w_op: list[int]
    w_call: list[float]
    w_dl: list[float]
    w_hold: list[float]
    w_kind: list[int]
    T: tuple[float, ...]
    DT: tuple[int, ...]
    DR: tuple[int, ...]
    decisions: list[tuple[float, int, int, int]]
    r_call: list[float]
    r_kind: list[int]
    new: list[tuple[int, ...]]
    opt_calls: list[list[float]]
    opt: list[list[int]]
    reads: list[tuple[float, int, int, int]]
    gets: list[list[int]]
    dead_ends: bool

    def event(self, i: int) -> tuple[float, int]:
        return self.decisions[i][0], self.decisions[i][1]

    def optional(self, k: int, i: int) -> int:
        """How many optional writes of kind k were called by decision i."""
        return bisect.bisect_right(self.opt_calls[k], self.T[i]) if self.opt_calls[k] else 0


def build(ops: Sequence[Op], view: Callable[[Op], Any]) -> Instance | None:
    """The instance of `ops` (one key's part); None when it is not this form (an op outside the register view,
    or two puts of one value)."""
    put_of: dict[Any, int] = {}
    writes: list[int] = []
    values: list[Any] = []
    gets: collections.defaultdict[Any, list[int]] = collections.defaultdict(list)
    decisions: list[tuple[float, int, int, int]] = []
    reads: list[tuple[float, int, int, int]] = []
    r_call: list[float] = []
    r_kind: list[int] = []
    last_free = [-INF, -INF]
    n_free = 0
    for i, op in enumerate(ops):
        v = view(op)
        if v is None:
            return None
        kind, value = v
        if kind == "write":
            if value is not None:
                if value in put_of:
                    return None
                put_of[value] = i
            writes.append(i)
            values.append(value)
            continue
        ret = op.completed
        if ret is None or op.error is not None:
            continue  # a read that never answered (or raised) constrains nothing
        if value is not None:
            gets[value].append(i)
            continue
        k = 1 if kind == READ_ANY else 0  # a miss (0) or a contains-true read (1): a decision at its return
        decisions.append((ret, i, _R, n_free))
        n_free += 1
        r_call.append(op.invoked)
        r_kind.append(k)
        reads.append((op.invoked, i, -1, k))
        if ret > last_free[k]:
            last_free[k] = ret
    inst = Instance()
    inst.ops = ops
    w_op: list[int] = []
    w_call: list[float] = []
    w_dl: list[float] = []
    w_hold: list[float] = []
    w_kind: list[int] = []
    w_gets: list[list[int]] = []
    no_gets: list[int] = []
    dead_ends = False
    n_w = 0
    for i, value in zip(writes, values):
        op = ops[i]
        kind = 0 if value is None else 1
        g = gets.pop(value, no_gets) if kind else no_gets
        unknown = op.completed is None or op.error is not None
        if unknown and not g and op.invoked > last_free[kind]:
            continue  # an optional write no read could follow: it never needs to take effect
        w = n_w
        n_w += 1
        dl = INF if unknown else cast(float, op.completed)
        tie, hold = i, -INF
        for j in g:
            get = ops[j]
            c = cast(float, get.completed)
            if c < dl or (c == dl and j < tie):
                dl, tie = c, j
            if get.invoked > hold:
                hold = get.invoked
            reads.append((get.invoked, j, w, 1))
        w_op.append(i)
        w_call.append(op.invoked)
        w_dl.append(dl)
        w_hold.append(hold)
        w_kind.append(kind)
        w_gets.append(g)
        if dl < INF:
            if op.invoked <= dl:
                decisions.append((dl, tie, _W, w))
            else:  # a get of its value returned before it was called
                decisions.append((dl, tie, _X, w))
                dead_ends = True
    for js in gets.values():  # gets of values no put wrote
        decisions += [(cast(float, ops[j].completed), j, _X, j) for j in js]
        dead_ends = True
    decisions.sort()
    inst.w_op, inst.w_call, inst.w_dl, inst.w_hold, inst.w_kind = w_op, w_call, w_dl, w_hold, w_kind
    inst.gets, inst.decisions, inst.dead_ends = w_gets, decisions, dead_ends
    inst.T, _, inst.DT, inst.DR = zip(*decisions) if decisions else ((), (), (), ())
    inst.r_call, inst.r_kind, inst.reads = r_call, r_kind, reads
    _index_calls(inst)
    return inst


def _index_calls(inst: Instance) -> None:
    """`new`, `opt_calls` and `opt` of `inst` (see `Instance`): a write is new at the first decision not before its
    call (a call is before a return at the same time)."""
    T, w_call, w_dl = inst.T, inst.w_call, inst.w_dl
    n = len(T)
    new: list[Any] = [()] * n
    opt: list[list[int]] = [[], []]
    bisect_left = bisect.bisect_left
    for w, call in enumerate(w_call):
        if w_dl[w] == INF:
            opt[inst.w_kind[w]].append(w)
            continue
        i = bisect_left(T, call)
        if i < n:
            row = new[i]
            new[i] = (w,) if not row else row + (w,)
    inst.new = new
    for k in (0, 1):
        opt[k].sort(key=w_call.__getitem__)
    inst.opt_calls = [[w_call[w] for w in opt[k]] for k in (0, 1)]
    inst.opt = opt


def first_dead_end(inst: Instance) -> tuple[float, int] | None:
    """The event of the first decision no configuration passes (a get of a value no put wrote, or one that
    returned before its put was called): the cut there is not linearizable. None if there is none."""
    if inst.dead_ends:
        for i, typ in enumerate(inst.DT):
            if typ == _X:
                return inst.event(i)
    return None


class OverBudget(Exception):
    """The sweep took more steps than it was given (`steps`), and `over_budget` said to stop."""

    def __init__(self, steps: int) -> None:
        super().__init__(f"over budget after {steps:,} steps")
        self.steps = steps


def sweep(inst: Instance, *, max_states: int, deadline: float | None = None, budget: int | None = None,
          over_budget: Callable[[], bool] | None = None) -> tuple[list | None, int, int]:
    """Depth first over the choices of the module doc: (the writes placed at each decision of a path found, or
    None; the first decision no configuration got past, len(T) when found; steps). A configuration is (current
    kind, its hold or -INF, mandatory writes called and not placed, optional deletes used, optional puts used,
    when the other kind was last seen). A configuration is remembered once every choice from it failed (then any
    it dominates -- the same but for fewer optional writes used or the other kind seen later -- is not tried again);
    the likeliest choice is tried first, the others only when it fails. Raises `SweepStopped` at a bound
    (`max_states`: configurations remembered). After `budget` steps beyond the deepest decision reached (steps spent
    going back and trying again) `over_budget()` is asked once whether to stop (then `OverBudget`) or go on."""
    n = len(inst.T)
    T, DT, DR, NEW = inst.T, inst.DT, inst.DR, inst.new
    w_hold, w_kind, r_kind, r_call = inst.w_hold, inst.w_kind, inst.r_kind, inst.r_call
    dead: dict[int, dict[tuple, list[tuple[int, int, float]]]] = {}
    path: list[Any] = [None] * n  # the configuration before each decision of the path
    placed_at: list[tuple] = [()] * n  # the writes placed at each decision of the path
    others: dict[int, Iterator] = {}  # the choices not yet tried at a decision of the path
    cfg: tuple | None = (0, -INF, frozenset(), 0, 0, -INF)
    i = deepest = steps = kept = 0
    while True:
        steps += 1
        if cfg is not None:  # entering decision i with cfg: the likeliest choice, inline
            if i == n:
                return placed_at, n, steps
            if i > deepest:
                deepest = i
            path[i] = cfg
            kind, hold, U, uA, uP, L = cfg
            t = T[i]
            if NEW[i]:
                U = U.union(NEW[i])
            typ = DT[i]
            nxt = None
            placed: tuple[int, ...] = ()
            if typ == _W:
                w = DR[i]
                if w not in U:
                    nxt, placed = (kind, hold if hold > t else -INF, U, uA, uP, L), ()
                elif hold <= t:
                    if w_hold[w] <= t:
                        k = w_kind[w]
                        nxt, placed = (k, -INF, U.difference((w,)), uA, uP, t if k != kind else L), (w,)
                    else:
                        got = _holding_last(inst, t, kind, U, uA, uP, L, w)
                        if got is not None:
                            nxt, placed = got
            elif typ == _R:
                r = DR[i]
                if r_kind[r] == kind or L >= r_call[r]:
                    nxt, placed = (kind, hold if hold > t else -INF, U, uA, uP, L), ()
                elif hold <= t:
                    got = _first_choice(inst, i, t, kind, U, uA, uP, L, -1, r_kind[r])
                    if got is not None:
                        nxt, placed = got
            if nxt is not None and (not dead or i + 1 not in dead or not _is_dead(dead, i + 1, nxt)):
                placed_at[i] = placed
                cfg, i = nxt, i + 1
                continue
        # decision i's next choice not tried yet, or back to the decision before it
        if budget is not None and steps - deepest > budget:
            if over_budget is None or over_budget():
                raise OverBudget(steps)
            budget = None
        if deadline is not None and not steps & 1023 and time.monotonic() > deadline:
            raise SweepStopped(f"the time bound ran out in the sweep after {steps:,} steps", steps)
        it = others.get(i)
        if it is None:
            it = others[i] = _options(inst, i, path[i])
        for nxt, placed in it:
            if not (dead and _is_dead(dead, i + 1, nxt)):
                placed_at[i] = placed
                cfg, i = nxt, i + 1
                break
        else:
            del others[i]
            c = path[i]
            row = dead.setdefault(i, {})
            known = row.get(c[:3])
            if known is None:
                row[c[:3]] = [c[3:]]
            else:
                known.append(c[3:])
            kept += 1
            if kept > max_states:
                raise SweepStopped(f"the sweep kept {max_states:,} configurations (its memory bound, max_states) "
                                   "without a verdict", steps)
            if i == 0:
                return None, deepest, steps
            cfg, i = None, i - 1


def _is_dead(dead: dict[int, dict[tuple, list[tuple[int, int, float]]]], i: int, cfg: tuple) -> bool:
    """Whether `cfg` at decision i is dominated by one every choice from which already failed: the same current
    kind, hold and writes to place, no more optional writes of either kind used, the other kind seen no earlier."""
    row = dead.get(i)
    if row is None:
        return False
    known = row.get(cfg[:3])
    if known is None:
        return False
    _, _, _, uA, uP, L = cfg
    return any(a <= uA and p <= uP and seen >= L for a, p, seen in known)


def _options(inst: Instance, i: int, cfg: tuple) -> Iterator[tuple[tuple, tuple]]:
    """Every configuration after decision i from `cfg` (each with the writes placed, in order; -1 / -2: an
    optional delete / put): nothing placed when nothing is due, then every placement of points 3-4."""
    kind, hold, U, uA, uP, L = cfg
    typ = inst.DT[i]
    if typ == _X:
        return
    t = inst.T[i]
    if inst.new[i]:
        U = U.union(inst.new[i])
    ref = inst.DR[i]
    need_w = need_k = -1
    if typ == _W:
        if ref in U:
            need_w = ref
    elif inst.r_kind[ref] != kind and L < inst.r_call[ref]:
        need_k = inst.r_kind[ref]
    if need_w < 0 and need_k < 0:
        yield (kind, hold if hold > t else -INF, U, uA, uP, L), ()
    if hold > t:
        return  # the current write holds: nothing may be placed yet
    first = _first_choice(inst, i, t, kind, U, uA, uP, L, need_w, need_k)
    if first is not None:
        yield first
    yield from _every_choice(inst, i, t, kind, U, uA, uP, L, need_w, need_k)


def _first_choice(inst: Instance, i: int, t: float, kind: int, U: frozenset, uA: int, uP: int, L: float,
                  need_w: int, need_k: int) -> tuple[tuple, tuple] | None:
    """The least placement that does what decision i needs (the fast path of `_every_choice`)."""
    if need_w >= 0:
        if inst.w_hold[need_w] > t:
            return _holding_last(inst, t, kind, U, uA, uP, L, need_w)
        k = inst.w_kind[need_w]
        return (k, -INF, U - {need_w}, uA, uP, t if k != kind else L), (need_w,)
    if need_k < 0:
        return None
    best = -1
    for w in U:
        if inst.w_kind[w] == need_k and inst.w_hold[w] <= t and (best < 0 or inst.w_dl[w] < inst.w_dl[best]):
            best = w
    if best >= 0:
        return (need_k, -INF, U - {best}, uA, uP, t), (best,)
    if inst.optional(need_k, i) > (uP if need_k else uA):
        return (need_k, -INF, U, uA + (need_k == 0), uP + need_k, t), (-1 - need_k,)
    for w in U:
        if need_k == 1 and inst.w_kind[w] == 1:
            got = _holding_last(inst, t, kind, U, uA, uP, L, w)
            if got is not None:
                return got
    return None


def _holding_last(inst: Instance, t: float, kind: int, U: frozenset, uA: int, uP: int, L: float,
                  w: int) -> tuple[tuple, tuple] | None:
    """Put w (whose hold is not over) placed last, after every write that could not wait for its hold."""
    w_dl = inst.w_dl
    hold = inst.w_hold[w]
    left = U - {w}
    before = [u for u in left if w_dl[u] < hold]
    if not before:
        return (1, hold, left, uA, uP, t if kind == 0 else L), (w,)
    w_hold, w_kind = inst.w_hold, inst.w_kind
    if any(w_hold[u] > t for u in before):
        return None
    seen_absent = kind == 0 or any(w_kind[u] == 0 for u in before)
    return (1, hold, left.difference(before), uA, uP, t if seen_absent else L), tuple(before) + (w,)


def _every_choice(inst: Instance, i: int, t: float, kind: int, U: frozenset, uA: int, uP: int, L: float,
                  need_w: int, need_k: int) -> Iterator[tuple[tuple, tuple]]:
    """Every placement of points 3-4 of the module doc that does what decision i needs, fewest writes first."""
    w_dl, w_hold, w_kind = inst.w_dl, inst.w_hold, inst.w_kind
    plain: tuple[list[int], list[int]] = ([], [])
    holding = []
    for w in U:
        if w_hold[w] > t:
            holding.append(w)
        else:
            plain[w_kind[w]].append(w)
    per_kind = []
    for k in (0, 1):
        plain[k].sort(key=w_dl.__getitem__)
        choices = [tuple(plain[k][:c]) for c in range(len(plain[k]) + 1)]
        if inst.optional(k, i) > (uP if k else uA):
            choices.append((-1 - k,))
        per_kind.append(choices)
    forced_plain = need_w >= 0 and w_hold[need_w] <= t
    out = []
    for a in per_kind[0]:
        for p in per_kind[1]:
            if forced_plain and need_w not in (p if w_kind[need_w] else a):
                continue
            for last in (["A"] if a else []) + (["P"] if p else []) + holding:
                if need_w >= 0 and not forced_plain and last != need_w:
                    continue
                held = not isinstance(last, str)
                seen = {kind} | ({0} if a else set()) | ({1} if p or held else set())
                if need_k >= 0 and need_k not in seen:
                    continue
                left = U.difference(a, p, (last,) if held else ())
                if held and any(w_dl[u] < w_hold[last] for u in left):
                    continue
                new_kind = 0 if last == "A" else 1
                cfg = (new_kind, w_hold[last] if held else -INF, left, uA + (a == (-1,)), uP + (p == (-2,)),
                       t if 1 - new_kind in seen else L)
                seq = a + p + (last,) if held else (p + a if last == "A" else a + p)
                out.append((len(seq), cfg, seq))
    out.sort(key=lambda c: c[0])
    for _, cfg, seq in out:
        yield cfg, seq


def witness(inst: Instance, chosen: list[tuple]) -> list[int] | None:
    """The op indices of the part in the order of a path the sweep found: each write where it was placed, each
    read (in call order) right where its kind or value is current in its interval. None if a read finds no place."""
    used = [0, 0]
    pw: list[int] = []
    pt: list[float] = []
    for i, placed in enumerate(chosen):
        for w in placed:
            if w < 0:
                k = -1 - w
                w = inst.opt[k][used[k]]
                used[k] += 1
            pw.append(w)
            pt.append(inst.T[i])
    n_p = len(pw)
    pos = {w: p for p, w in enumerate(pw)}
    kinds = [inst.w_kind[w] for w in pw]
    nxt = [[n_p] * (n_p + 1), [n_p] * (n_p + 1)]  # nxt[k][x]: the first placement at or after x of kind k
    for x in range(n_p - 1, -1, -1):
        nxt[kinds[x]][x] = x
        nxt[1 - kinds[x]][x] = nxt[1 - kinds[x]][x + 1]
    after: list[list[int] | None] = [None] * (n_p + 1)  # after[p + 1]: the reads right after placement p
    j0 = -1  # the last placement before the read was called
    for c, j, w, k in sorted(inst.reads):
        while j0 + 1 < n_p and pt[j0 + 1] < c:
            j0 += 1
        if (j0 >= 0 and pw[j0] == w) if w >= 0 else (kinds[j0] if j0 >= 0 else 0) == k:
            p = j0  # what it needs is current when it is called
        else:
            p = pos.get(w, n_p) if w >= 0 else nxt[k][j0 + 1]
            if p >= n_p or p <= j0:
                return None
        row = after[p + 1]
        if row is None:
            after[p + 1] = [j]
        else:
            row.append(j)
    order: list[int] = list(after[0] or ())
    w_op = inst.w_op
    for p in range(n_p):
        order.append(w_op[pw[p]])
        row = after[p + 1]
        if row:
            order += row
    return order
