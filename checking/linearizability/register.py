"""The register path of `checking.linearizability`: one key's part, for a model with a `register_view`.

When every put of the key writes its own value, the part is decided by the exact sweep of
`checking.linearizability.sweep` (see there for why it is exact): first its necessary condition (the zones of the
puts with their gets, the deletes and the puts nobody reads); then the sweep itself, whose path is turned into an
order of the ops that is checked against the model's own `step` and real-time order before "linearizable" is
answered (a path that failed that check would be a bug: the part then goes to the search, and the verdict's
methods say so). Otherwise (two puts of one value) the part is simplified exactly, as below, for the search.

A violation names the op whose return first makes the history non-linearizable (the earliest return event whose
cut -- the ops called by then, those not returned by then left unanswered -- is not linearizable) and a
linearization of the cut just before it as the longest linearizable prefix. Cuts only grow more constrained, so
that op is found by probing cuts from where the sweep or the zones located the violation.

# Exact simplifications for the search (two puts of one value)
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
"""
from __future__ import annotations

import bisect
import math
from typing import Any, Callable, Sequence

import attrs

from checking.linearizability.wing_gong import SearchStopped, Verdict, search_part, unknown
from checking.linearizability.sweep import Instance, OverBudget, SweepStopped, build, first_dead_end, sweep, witness
from checking.linearizability.zones import conflict
from model.history import READ_ANY, Model, Op

__all__ = ["decide_register", "simplify"]

INF = math.inf
#: The value every unobserved optional put is given (so they are interchangeable); no get returned it.
_UNSEEN = b"\x00shardcheck: a put nobody observed\x00"
#: The method a part is counted under when the sweep's path failed its check and the search decided instead.
REJECTED = "search (sweep witness rejected)"
#: The sweep's `witness`, called through this module variable: compiled code calls a function of its own build
#: directly, and a test replaces this one with a wrong one to see the path rejected.
witness_of: Callable[[Instance, list], list[int] | None] = witness


class _Rejected(Exception):
    """The sweep found a path whose order of the ops the model does not accept (a bug of the sweep)."""


def decide_register(keys: tuple[str, ...], ops: Sequence[Op], model: Model, *, max_states: int,
                    deadline: float | None) -> tuple[Verdict, str]:
    """Decide one key's part: by the sweep when every put writes its own value, else by the search on the part
    simplified. Raises `SearchStopped` when a bound stops it."""
    inst = build(ops, model.register_view)  # type: ignore
    if inst is None:
        return _search(keys, ops, model, max_states, deadline), "search"
    try:
        linearizable, _, bounds, steps = _decide(inst, keys, ops, model, max_states, deadline)
    except SweepStopped as stop:
        raise SearchStopped(f"{stop.why} (part {', '.join(keys)})", stop.steps) from None
    except _Rejected:
        return _search(keys, ops, model, max_states, deadline), REJECTED
    if linearizable:
        return Verdict(True, steps, keys), "register"
    v = _explain(keys, list(ops), model, bounds, max_states, deadline)
    v.steps += steps
    return v, "register"


def _search(keys: tuple[str, ...], ops: Sequence[Op], model: Model, max_states: int,
            deadline: float | None) -> Verdict:
    s = simplify(ops, model.register_view)
    if s is None:
        return search_part(keys, list(ops), model, max_states=max_states, deadline=deadline)
    return search_part(keys, s.ops, model, max_states=max_states, deadline=deadline, classes=s.classes,
                       returns=s.returns, reads=s.reads())


def _decide(inst: Instance, keys: tuple[str, ...], ops: Sequence[Op], model: Model, max_states: int,
            deadline: float | None, zones_first: bool = False
            ) -> tuple[bool, list[int] | None, list[tuple[str, tuple]], int]:
    """(linearizable, the order of the op indices found, for a violation where it is known from: ("by", event) --
    the cut at that return event is not linearizable -- or ("after", event) -- no cut before it is not; steps).
    The zones' necessary condition is checked once the sweep goes back more than a linearizable part would (or
    first, with `zones_first`, where a violation is likely)."""
    dead = first_dead_end(inst)
    if dead is not None:
        return False, None, [("by", dead)], 0
    evidence = conflict(inst) if zones_first else None
    if evidence is not None:
        return False, None, [("by", evidence)], 0
    budget = len(inst.T) // 8 + 200  # steps going back: linearizable parts backtrack little (1-8% more steps)
    found: list = []

    def zones_say_stop() -> bool:
        found.append(conflict(inst))
        return found[0] is not None

    try:
        chosen, deepest, steps = sweep(inst, max_states=max_states, deadline=deadline, budget=budget,
                                       over_budget=zones_say_stop)
    except OverBudget as over:
        return False, None, [("by", found[0])], over.steps
    if chosen is None:
        evidence = found[0] if found else conflict(inst)
        return False, None, [("after", inst.event(deepest))] + ([("by", evidence)] if evidence else []), steps
    order = witness_of(inst, chosen)
    if order is None or not linearization_holds(keys, ops, order, model):
        raise _Rejected()
    return True, order, [], steps


def linearization_holds(keys: tuple[str, ...], ops: Sequence[Op], order: Sequence[int], model: Model) -> bool:
    """Whether `order` (indices into `ops`) is a linearization: every op that completed without error exactly
    once (others at most once), no op before one that returned before it was called, and each op legal in the
    model's state before it."""
    if len(set(order)) != len(order):
        return False
    done = 0
    latest_call = -INF
    state = model.init(keys)
    step = model.step
    for j in order:
        op = ops[j]
        end = op.completed
        if end is not None:
            if end < latest_call:
                return False  # it returned before an op placed earlier was called
            done += op.error is None
        if op.invoked > latest_call:
            latest_call = op.invoked
        ok, state = step(keys, state, op)
        if not ok:
            return False
    return done == sum(1 for op in ops if op.completed is not None and op.error is None)


def _cut(ops: Sequence[Op], event: tuple[float, int]) -> list[Op]:
    """The part as it stood at a return event: the ops called by then, those not returned by then unanswered."""
    t = event[0]
    out = []
    for j, op in enumerate(ops):
        if op.invoked > t:
            continue
        if op.completed is not None and (op.completed, j) > event:
            op = attrs.evolve(op, completed=None, completions=0)
        out.append(op)
    return out


def _explain(keys: tuple[str, ...], ops: list[Op], model: Model, bounds: list[tuple[str, tuple]], max_states: int,
             deadline: float | None) -> Verdict:
    """The violation's verdict: the op at the earliest return event whose cut is not linearizable, and the order
    found for the cut at the event before it. Probes cuts next to what is known (a cut is known not linearizable
    at a bound "by" an event, and linearizable before a bound "after" one); each probe that is not linearizable
    says by which event already, each that is gives the order."""
    events = sorted((op.completed, j) for j, op in enumerate(ops) if op.completed is not None)
    orders: dict[int, list[Op]] = {-1: []}
    lo, hi = -1, len(events) - 1  # cut(lo) is linearizable, cut(hi) is not

    def learn(p: int, found: list[tuple[str, tuple]]) -> None:
        nonlocal lo, hi
        if not found:
            lo = max(lo, p)
            return
        hi = min(hi, p)
        for kind, event in found:
            at = bisect.bisect_left(events, event)
            if kind == "by":
                hi = min(hi, at)
            else:
                lo = max(lo, at - 1)

    learn(len(events) - 1, bounds)
    step = 1
    try:
        while hi - lo > 1:
            probe = max(lo + 1, hi - step) if step < hi - lo else (lo + hi) // 2
            cut = _cut(ops, events[probe])
            ok, order, found, _ = _decide(build(cut, model.register_view), keys, cut, model, max_states, deadline,  # type: ignore
                                          zones_first=True)
            if ok:
                orders[probe] = [cut[j] for j in order]  # type: ignore
            learn(probe, found)
            step = 1 if hi < probe else step * 2  # the evidence moved: look right next to it first
        hi, lo = _confirmed(hi, len(events) - 1, lambda p: _cut_linearizable(p, ops, events, keys, model, orders,
                                                                              max_states, deadline), (lo, hi))
        if lo not in orders:
            cut = _cut(ops, events[lo])
            ok, order, _, _ = _decide(build(cut, model.register_view), keys, cut, model, max_states, deadline)  # type: ignore
            orders[lo] = [cut[j] for j in order] if ok else []  # type: ignore
    except (SweepStopped, _Rejected):
        pass  # not narrowed further: the op at `hi` is one whose cut is not linearizable
    return Verdict(False, 0, keys, [op.id for op in orders.get(lo, [])], ops[events[hi][1]].id)


def _cut_linearizable(p: int, ops: list[Op], events: list, keys: tuple[str, ...], model: Model,
                      orders: dict[int, list[Op]], max_states: int, deadline: float | None) -> bool:
    """Whether the cut at return event `p` is linearizable, decided on its own (its order kept in `orders`); the
    zones first, as the cut is likely not (it is one a bound named)."""
    cut = _cut(ops, events[p])
    ok, order, _, _ = _decide(build(cut, model.register_view), keys, cut, model, max_states, deadline, zones_first=True)  # type: ignore
    if ok:
        orders[p] = [cut[j] for j in order]  # type: ignore
    return ok


def _confirmed(hi: int, last: int, linearizable: Callable[[int], bool], known: tuple[int, int]) -> tuple[int, int]:
    """(hi, lo) with the cut at `hi` decided not linearizable on its own: the sweep's bounds ("by", "after") narrow
    the search, but a bound that was too early named an op whose cut is linearizable; then the first bad return
    is bisected between it and `last` (whose cut the verdict says is not linearizable) on direct decisions only."""
    lo = known[0]
    if hi >= last or not linearizable(hi):
        return hi, lo
    lo, top = hi, last
    while top - lo > 1:
        mid = (lo + top) // 2
        if linearizable(mid):
            lo = mid
        else:
            top = mid
    return top, lo


class Simplified:
    """A part after `simplify`: `ops` (some evolved), each one's effective return time (+inf: may or may not take
    effect), `classes` of interchangeable optional writes for the search, and each op's register view."""

    def __init__(self, ops: list[Op], returns: list[float], classes: list[int], views: list[tuple[str, Any]]) -> None:
        self.ops, self.returns, self.classes, self.views = ops, returns, classes, views

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
            ret[i] = min(ops[r].completed for r in readers[value])  # type: ignore
    miss_rets = sorted(ops[i].completed for i in keep if views[i] == ("read", None))  # type: ignore
    latest_miss = miss_rets[-1] if miss_rets else -INF
    keep = [i for i in keep if not (views[i] == ("write", None) and ret[i] == INF and latest_miss < ops[i].invoked)]  # type: ignore
    excl = _Exclusion([(ops[i].invoked, ret[i]) for i in keep if views[i][0] == "write"])  # type: ignore
    deletes = _Candidates([(ops[i].invoked, ret[i], i) for i in keep if views[i] == ("write", None)])  # type: ignore
    keep = [i for i in keep if not (views[i][0] == READ_ANY and _always_present(ops[i], excl, deletes))]
    any_rets = [ops[i].completed for i in keep if views[i][0] == READ_ANY]
    latest_any = max(any_rets, default=-INF)  # type: ignore
    unseen = _UNSEEN
    while unseen in readers or unseen in writers:
        unseen += b"'"
    out_ops, out_ret, out_views = [], [], []
    for i in keep:
        op, (kind, value) = ops[i], views[i]
        if kind == "write" and value is not None and ret[i] == INF and value not in readers:
            if latest_any < op.invoked:  # type: ignore
                continue  # an unobserved put nobody could follow
            op, value = attrs.evolve(op, value=unseen), unseen
        out_ops.append(op)
        out_ret.append(ret[i])
        out_views.append((kind, value))
    return Simplified(out_ops, out_ret, _classes(out_ret, out_views), out_views)  # type: ignore


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
    return m > -INF and not deletes.of(op.invoked, op.completed, m, 1)  # type: ignore
