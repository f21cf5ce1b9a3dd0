"""The register path of `engines.linearizability`: one key's part, for a model with a `register_view`.

# Exact simplifications (each keeps the verdict; they also feed the search when the zones do not apply)
- A read that never answered (or raised) constrains nothing: dropped.
- A put that may or may not have taken effect (never completed, or raised) whose value (unique to it) some
  completed get returned must have taken effect before that get returned: it returns at the earliest such
  return. One nobody could observe is dropped: a put whose value no get returned and that no `contains`-true
  read could follow (none returns after its call); a delete that no read of a miss could follow.
- "Excluded": write w cannot be the last write before read r when some write x completed after w was called
  ... precisely when w returned before x was called and x returned before r was called (every linearization
  orders w < x < r). A `contains`-true read for which every delete (and the initial miss) is excluded sees a
  value in every linearization: dropped.
- Any other optional write that remains is interchangeable with every other of its kind (deletes with deletes;
  unobserved puts, which get one shared value, with each other), so the search tries them in call order only.

# The zones (Gibbons & Korach; Golab, Li & Shah)
When every put writes its own value and each read of a miss (`get` None, `contains` false) and each
`contains`-true read has exactly one write it can read from (its one non-excluded candidate), every write w
is a block with its reads (the initial miss is a write at -infinity). In a linearization the blocks are
contiguous, write first; so the part is linearizable iff no read returns before its write is called and the
blocks can be ordered: with F(B) the earliest return and S(B) the latest call in B, B must precede C iff
F(B) < S(C), and that relation has a cycle iff it has one of length two (a shorter cycle always exists; see
`_two_cycle`). Sorting by F and a prefix maximum of S find one in O(n log n). Otherwise (an ambiguous read, an
optional write left), the simplified part goes to the search.

For a violation the verdict names the op whose completion made the history non-linearizable (the earliest
return time at which the history cut there, later ops unanswered, is not) and a linearization of the history
cut just before it as the longest linearizable prefix.
"""
from __future__ import annotations

import bisect
import math
from typing import Any, Sequence

import attrs

from engines.linearizability_search import SearchStopped, Verdict, search_part, unknown
from model.history import READ_ANY, Model, Op

__all__ = ["decide_register", "simplify", "zones"]

INF = math.inf
#: The value every unobserved optional put is given (so they are interchangeable); no get returned it.
_UNSEEN = b"\x00shardcheck: a put nobody observed\x00"
#: The memo bound of the searches that explain a violation (a cut history is usually decided by the zones).
_EXPLAIN_STATES = 200_000


@attrs.define
class Simplified:
    """A part after `simplify`: `ops` (some evolved), each one's effective return time (+inf: may or may not take
    effect), `classes` of interchangeable optional writes for the search, `unique`: every put has its own value and no optional write is left;
    `bad`: an op already known to be unplaceable, with the time its completion is known (a get of a value no put
    wrote)."""

    ops: list[Op]
    returns: list[float]
    classes: list[int]
    unique: bool
    views: list[tuple[str, Any]]
    bad: tuple[int, float] | None = None

    def reads(self) -> list[bool]:
        return [v[0] != "write" for v in self.views]


def simplify(ops: Sequence[Op], view: Any) -> Simplified | None:
    """The exact simplifications of the module doc; None when some op is outside the register form."""
    views = [view(op) for op in ops]
    if any(v is None for v in views):
        return None
    keep = [i for i, op in enumerate(ops) if views[i][0] == "write" or not (op.pending or op.error is not None)]
    readers: dict[Any, list[int]] = {}
    writers: dict[Any, int] = {}
    unique = True
    for i in keep:
        kind, value = views[i]
        if kind == "read" and value is not None:
            readers.setdefault(value, []).append(i)
        elif kind == "write" and value is not None:
            unique = unique and value not in writers
            writers[value] = i
    ret = {i: (INF if unknown(ops[i]) else ops[i].completed) for i in keep}
    for i in keep:
        kind, value = views[i]
        if kind == "write" and value is not None and ret[i] == INF and unique and value in readers:
            ret[i] = min(ops[r].completed for r in readers[value])
    miss_rets = sorted(ops[i].completed for i in keep if views[i] == ("read", None))
    latest_miss = miss_rets[-1] if miss_rets else -INF
    keep = [i for i in keep if not (views[i] == ("write", None) and ret[i] == INF and latest_miss < ops[i].invoked)]
    excl = _Exclusion([(ops[i].invoked, ret[i]) for i in keep if views[i][0] == "write"])
    deletes = _Candidates([(ops[i].invoked, ret[i], i) for i in keep if views[i] == ("write", None)])
    keep = [i for i in keep if not (views[i][0] == READ_ANY and _always_present(ops[i], excl, deletes))]
    any_rets = [ops[i].completed for i in keep if views[i][0] == READ_ANY]
    latest_any = max(any_rets, default=-INF)
    unseen = _UNSEEN
    while unseen in readers or unseen in writers:
        unseen += b"'"
    out_ops, out_ret, out_views, optional = [], [], [], 0
    for i in keep:
        op, (kind, value) = ops[i], views[i]
        if kind == "write" and value is not None and ret[i] == INF and value not in readers:
            if latest_any < op.invoked:
                continue  # an unobserved put nobody could follow
            op, value = attrs.evolve(op, value=unseen), unseen
        optional += kind == "write" and ret[i] == INF
        out_ops.append(op)
        out_ret.append(ret[i])
        out_views.append((kind, value))
    classes = _classes(out_ret, out_views)
    bad = None
    for j, (kind, value) in enumerate(out_views):
        if kind == "read" and value is not None and value not in writers and (bad is None or out_ops[j].completed < bad[1]):
            bad = (j, out_ops[j].completed)
    return Simplified(out_ops, out_ret, classes, unique and not optional, out_views, bad)


def _classes(returns: list[float], views: list[tuple[str, Any]]) -> list[int]:
    """For each optional write, a class per effect (the value it writes); -1 for every other op."""
    out = [-1] * len(views)
    ids: dict[Any, int] = {}
    for j, (kind, value) in enumerate(views):
        if kind == "write" and returns[j] == INF:
            out[j] = ids.setdefault(value, len(ids))
    return out


class _Exclusion:
    """M(t): the latest call among the writes that returned before t (-inf when none)."""

    def __init__(self, writes: list[tuple[float, float]]) -> None:
        done = sorted((r, inv) for inv, r in writes if r < INF)
        self.rets = [r for r, _ in done]
        self.max_inv, m = [], -INF
        for _, inv in done:
            m = max(m, inv)
            self.max_inv.append(m)

    def latest_call_before(self, t: float) -> float:
        k = bisect.bisect_left(self.rets, t)
        return self.max_inv[k - 1] if k else -INF


class _Candidates:
    """Writes (call, return, index) sorted by call: which of them a read can read from."""

    def __init__(self, writes: list[tuple[float, float, int]]) -> None:
        writes = sorted(writes)
        self.done = [w for w in writes if w[1] < INF]
        self.calls = [w[0] for w in self.done]
        self.longest = max((r - inv for inv, r, _ in self.done), default=0.0)
        self.optional = [w for w in writes if w[1] == INF]

    def of(self, inv: float, ret: float, m: float, limit: int = 2) -> list[int]:
        """Up to `limit` indices of writes called by `ret` that are not excluded (returned at or after `m`)."""
        out = [w[2] for w in self.optional if w[0] <= ret][:limit]
        k = bisect.bisect_right(self.calls, ret) - 1
        while k >= 0 and len(out) < limit and self.done[k][0] >= m - self.longest:
            if self.done[k][1] >= m:
                out.append(self.done[k][2])
            k -= 1
        return out


def _always_present(op: Op, excl: _Exclusion, deletes: _Candidates) -> bool:
    m = excl.latest_call_before(op.invoked)
    return m > -INF and not deletes.of(op.invoked, op.completed, m, 1)


def zones(s: Simplified) -> tuple[str, Any]:
    """("linearizable", blocks in a linearization order) | ("violation", time its evidence is complete) |
    ("search", None) when the zones do not apply (see the module doc). Blocks: [write index or -1, reads...]."""
    if not s.unique:
        return "search", None
    ops, rets, views = s.ops, s.returns, s.views
    if s.bad is not None:
        return "violation", s.bad[1]
    writes = [j for j, v in enumerate(views) if v[0] == "write"]
    excl = _Exclusion([(ops[j].invoked, rets[j]) for j in writes])
    dels = _Candidates([(ops[j].invoked, rets[j], j) for j in writes if views[j][1] is None])
    puts = _Candidates([(ops[j].invoked, rets[j], j) for j in writes if views[j][1] is not None])
    writer = {views[j][1]: j for j in writes if views[j][1] is not None}
    block_of: dict[int, list[int]] = {j: [] for j in writes}
    block_of[-1] = []
    for j, (kind, value) in enumerate(views):
        if kind == "write":
            continue
        op = ops[j]
        if kind == "read" and value is not None:
            w = writer[value]
        else:
            m = excl.latest_call_before(op.invoked)
            cands = (dels if kind == "read" else puts).of(op.invoked, op.completed, m)
            if kind == "read" and m == -INF:
                cands.append(-1)
            if len(cands) > 1:
                return "search", None
            if not cands:
                return "violation", op.completed
            w = cands[0]
        if w >= 0 and op.completed < ops[w].invoked:
            return "violation", op.completed  # the read returned before its write was called
        block_of[w].append(j)
    blocks = list(block_of.items())
    F = [min([-INF if w < 0 else rets[w]] + [ops[r].completed for r in rs]) for w, rs in blocks]
    S = [max([-INF if w < 0 else ops[w].invoked] + [ops[r].invoked for r in rs]) for w, rs in blocks]
    pair = _two_cycle(F, S)
    if pair is not None:
        a, b = pair
        evidence = [rets[w] if w >= 0 else -INF for w in (blocks[a][0], blocks[b][0])]
        evidence += [ops[r].completed for x in (a, b) for r in blocks[x][1]]
        return "violation", max(evidence)
    order = sorted(range(len(blocks)), key=lambda x: (min(F[x], S[x]), 0 if S[x] <= F[x] else 1))
    return "linearizable", [[blocks[x][0]] + sorted(blocks[x][1], key=lambda r: ops[r].completed) for x in order]


def _two_cycle(F: list[float], S: list[float]) -> tuple[int, int] | None:
    """Two blocks a != b with F(a) < S(b) and F(b) < S(a), or None. A cycle B0 -> B1 -> ... -> B0 has a
    two-cycle: let m be its block with the least F and p its predecessor (F(p) < S(m)); if S(p) > F(p) >= F(m),
    then m, p is one; else S(p) <= F(p) and p's own predecessor q has F(q) < S(p) <= F(p) < S(m): drop p."""
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


def _quick(keys: tuple[str, ...], ops: Sequence[Op], model: Model, witness: bool) -> Verdict | None:
    """Decide `ops` (a cut of the part) by the zones or a small search; None when neither can."""
    s = simplify(ops, model.register_view)
    kind, data = zones(s) if s is not None else ("search", None)
    if kind == "violation":
        return Verdict(False, 0, keys)
    if kind == "linearizable":
        return Verdict(True, 0, keys, [s.ops[j].id for blk in data for j in blk if j >= 0] if witness else [])
    part = s.ops if s is not None else list(ops)
    try:
        return search_part(keys, part, model, max_states=_EXPLAIN_STATES, classes=s and s.classes,
                           returns=s and s.returns, reads=s and s.reads(), witness=witness)
    except SearchStopped:
        return None


def _cut(ops: Sequence[Op], t: float) -> list[Op]:
    """The history as it stood at time t: ops called by then, those that had not returned unanswered."""
    return [op if op.completed is not None and op.completed <= t else attrs.evolve(op, completed=None, completions=0)
            for op in ops if op.invoked <= t]


def explain(keys: tuple[str, ...], ops: Sequence[Op], model: Model, evidence: float) -> Verdict:
    """The violation's verdict: the op whose return first makes a cut non-linearizable, and a linearization of
    the cut just before it (searched back from `evidence`, a return time whose cut is not linearizable)."""
    times = sorted({op.completed for op in ops if op.completed is not None and op.completed <= evidence})
    hi = len(times) - 1  # cut(times[hi]) is not linearizable
    lo = -1  # cut(times[lo]) is linearizable (-1: the empty cut)
    if hi > 0:
        v = _quick(keys, _cut(ops, times[hi - 1]), model, False)
        lo = hi - 1 if v is not None and v.linearizable else -1
        if v is not None and not v.linearizable:
            hi -= 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        v = _quick(keys, _cut(ops, times[mid]), model, False)
        if v is None:
            break
        lo, hi = (mid, hi) if v.linearizable else (lo, mid)
    at = times[hi] if times else evidence
    done = sorted((op for op in ops if op.completed == at), key=lambda op: (op.path in ("put", "delete"), op.id))
    bad = done[0] if done else None
    if len(done) > 1:  # several returned then: the one whose answer, left out, leaves the cut linearizable
        cut = _cut(ops, at)
        for cand in done:
            v = _quick(keys, [op for op in cut if op.id != cand.id or op.path != cand.path], model, False)
            if v is not None and v.linearizable:
                bad = cand
                break
    prefix: list[int] = []
    if lo >= 0:
        v = _quick(keys, _cut(ops, times[lo]), model, True)
        prefix = v.prefix if v is not None and v.linearizable else []
    return Verdict(False, 0, keys, prefix, None if bad is None else bad.id)


def decide_register(keys: tuple[str, ...], ops: Sequence[Op], model: Model, *, max_states: int,
                    deadline: float | None) -> tuple[Verdict, str]:
    """Decide one key's part: by the zones when they apply, else by the search on the simplified part."""
    s = simplify(ops, model.register_view)
    if s is None:
        return search_part(keys, list(ops), model, max_states=max_states, deadline=deadline), "search"
    kind, data = zones(s)
    if kind == "linearizable":
        return Verdict(True, 0, keys), "register"
    if kind == "violation":
        return explain(keys, ops, model, data), "register"
    return search_part(keys, s.ops, model, max_states=max_states, deadline=deadline, classes=s.classes,
                       returns=s.returns, reads=s.reads()), "search"
