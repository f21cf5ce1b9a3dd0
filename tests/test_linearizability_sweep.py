"""The register path's exact sweep (`checking.linearizability.sweep`) against a brute force and against the search,
on one-key histories where every put writes its own value: deletes (several), misses before any write, `contains`
both ways, puts and deletes that never completed; and the violation it names."""
from __future__ import annotations

import attrs
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from checking import native
from checking.linearizability import register as linearizability_register, midpoints as linearizability_replay, sweep as linearizability_sweep
from checking.concurrency_bench import synthetic_history
from checking.linearizability import check, partitions, split_parts
from checking.linearizability.greedy import greedy_order
from checking.linearizability.register import REJECTED, decide_register, linearization_holds
from checking.linearizability.midpoints import replay_order
from model.history import KV_MODEL, Op
from tests.test_linearizability import _brute_force, op

PATHS = ["put", "put", "delete", "delete", "get", "get", "contains", "contains"]


def _history(draw, n_max: int, span: int, lie: float) -> list[Op]:
    """A one-key history with unique put values. Half the time the reads answer as some linearization says (each
    op at a random instant of its interval, a pending write taking effect or not) and then one answer in about
    1/lie is flipped; otherwise every answer is drawn at random."""
    n = draw(st.integers(1, n_max))
    ops = []
    for i in range(n):
        path = draw(st.sampled_from(PATHS))
        inv = draw(st.integers(0, span))
        pending = draw(st.integers(0, 6)) == 0
        ret = None if pending else inv + draw(st.integers(0, 4))
        ops.append(op(i, f"c{i}", path, "k", inv, ret, value=f"v{i}".encode() if path == "put" else None))
    values = [o.value for o in ops if o.path == "put"]
    if draw(st.booleans()):
        at = {o.id: draw(st.floats(o.invoked, (o.completed if o.completed is not None else o.invoked + 10)))
              for o in ops}
        happens = {o.id: not (o.pending and draw(st.booleans())) for o in ops}
        state = None
        for o in sorted(ops, key=lambda o: at[o.id]):
            if o.path == "put" and happens[o.id]:
                state = o.value
            elif o.path == "delete" and happens[o.id]:
                state = None
            elif o.path == "get":
                o.result = state
            elif o.path == "contains":
                o.result = state is not None
        for o in ops:
            if o.path in ("get", "contains") and draw(st.integers(0, lie)) == 0:
                o.result = draw(st.sampled_from([None, *values])) if o.path == "get" else not o.result
    else:
        for o in ops:
            if o.path == "get":
                o.result = draw(st.sampled_from([None, None, *values]))
            elif o.path == "contains":
                o.result = draw(st.booleans())
    return ops


def _cut_before(ops: list[Op], bad: int) -> tuple[list[Op], list[Op]]:
    """The history cut at the return of op `bad` and just before it (as the register path cuts)."""
    events = sorted((o.completed, j) for j, o in enumerate(ops) if o.completed is not None)
    at = next(k for k, (_, j) in enumerate(events) if ops[j].id == bad)
    cut = linearizability_register._cut
    return cut(ops, events[at]), (cut(ops, events[at - 1]) if at else [])


def _assert_explained(ops: list[Op], verdict) -> None:
    """The op named is the first whose return makes the cut non-linearizable; the prefix linearizes the cut before."""
    at_bad, before = _cut_before(ops, verdict.unplaceable)
    assert check(at_bad, fast=False).linearizable is False
    assert check(before, fast=False).linearizable is True
    index = {o.id: j for j, o in enumerate(before)}
    assert linearization_holds(("k",), before, [index[i] for i in verdict.prefix], KV_MODEL)


def _sweep(ops: list[Op]):
    """The register path's own verdict on a one-key history (whatever `check` would take first)."""
    v, method = decide_register(("k",), ops, KV_MODEL, max_states=1_000_000, deadline=None)
    assert method == "register"
    return v


def test_sweep_agrees_with_a_brute_force():
    """Small unique-value histories: the sweep (never the search) gives the brute force's verdict, and so does
    `check` (which first tries the greedy pass); an order the greedy pass builds is a linearization."""
    @settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
    @given(st.data())
    def run(data):
        ops = _history(data.draw, 7, 8, 3)
        want = _brute_force(ops)
        assert _sweep(ops).linearizable is want
        v = check(ops)
        assert v.linearizable is want and set(v.methods) <= {"register", "greedy", "replay"}
        _assert_greedy_sound(ops, want)

    run()


def _assert_greedy_sound(ops: list[Op], want: bool) -> None:
    """An order the greedy pass or the repaired replay ends with is a linearization."""
    order = greedy_order(("k",), ops, KV_MODEL)
    if order is not None:
        assert want is True and linearization_holds(("k",), ops, order, KV_MODEL)
    replayed = replay_order(("k",), ops, KV_MODEL)
    if replayed is not None:
        index = {id(o): j for j, o in enumerate(ops)}
        assert want is True and linearization_holds(("k",), ops, [index[id(o)] for o in replayed], KV_MODEL)


def test_sweep_agrees_with_the_search_and_names_the_first_bad_return():
    """Larger unique-value histories (up to 16 ops, much overlap): the sweep gives the search's verdict, and a
    violation names the op at whose return the cut first stops being linearizable, with a linearization of the
    cut before it."""
    @settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
    @given(st.data())
    def run(data):
        ops = _history(data.draw, 16, 20, 8)
        want = check(ops, fast=False, max_states=1_000_000).linearizable
        v = _sweep(ops)
        assert v.linearizable is want and check(ops).linearizable is want
        _assert_greedy_sound(ops, want)
        if want is False:
            _assert_explained(ops, v)

    run()


def test_ambiguous_misses_and_contains_are_decided_without_search():
    """Reads of a miss that two deletes (or the initial miss) could explain, and contains-true reads that two
    puts could: the sweep decides, both ways."""
    h = [op(0, "a", "get", "k", 0, 3, None), op(1, "b", "put", "k", 1, 2, value=b"x"), op(2, "c", "delete", "k", 1, 4),
         op(3, "d", "delete", "k", 3, 6), op(4, "a", "get", "k", 5, 7, None), op(5, "b", "put", "k", 5, 8, value=b"y"),
         op(6, "c", "contains", "k", 6, 9, True), op(7, "d", "contains", "k", 9, 10, True)]
    assert _sweep(h).linearizable is True and check(h).linearizable is True
    h.append(op(8, "a", "get", "k", 11, 12, None))  # y completed at 8 and nothing deleted it since
    v = _sweep(h)
    assert v.linearizable is False and v.unplaceable == 8 and check(h).unplaceable == 8
    _assert_explained(h, v)


def test_pending_writes_explain_reads_only_when_they_can():
    """A delete that never completed explains a later miss; a put that never completed explains a contains-true;
    neither can explain a read that returned before it was called."""
    h = [op(0, "a", "put", "k", 0, 1, value=b"x"), op(1, "b", "delete", "k", 2, None),
         op(2, "c", "get", "k", 3, 4, None), op(3, "b", "put", "k", 5, None, value=b"y"),
         op(4, "c", "contains", "k", 6, 7, True)]
    assert check(h).linearizable is True
    h[1].invoked = 3.5  # called while the miss was in flight: it may still go first
    assert check(h).linearizable is True
    h[1].invoked = 4.5  # called after the miss returned: nothing deleted x before it
    v = check(h)
    assert v.linearizable is False and v.unplaceable == 2


def test_a_rejected_path_goes_to_the_search_and_says_so(monkeypatch):
    """If the sweep's path ever failed its check against the model, the search decides and the verdict's
    methods say the path was rejected (never a silent "linearizable")."""
    h = [op(0, "a", "put", "k", 0, 4, value=b"x"), op(1, "b", "get", "k", 1, 2, b"x")]
    monkeypatch.setattr(linearizability_register, "witness_of", lambda inst, chosen: [1, 0])
    v, method = decide_register(("k",), h, KV_MODEL, max_states=1_000, deadline=None)
    assert v.linearizable is True and method == REJECTED


def test_the_first_tries_decide_only_what_they_linearize():
    """The repaired replay and the greedy pass guess without backtracking; where a guess is wrong they give up and
    the register path decides. Demos: a linearizable history each gives up on (the replay puts the contains-true
    before the deletes, which leaves the key absent for the last read; the greedy pass puts x last, but the miss
    needs the pending delete after x), and a violation, which neither calls linearizable and the register path
    names."""
    first = [op(0, "a", "put", "k", 0, 0, value=b"v"), op(1, "b", "delete", "k", 0, 0), op(2, "c", "delete", "k", 0, 0),
             op(3, "d", "contains", "k", 0, 0, True), op(4, "e", "contains", "k", 1, 1, True)]
    assert replay_order(("k",), first, KV_MODEL) is None
    second = [op(0, "a", "put", "k", 0, 0.1, value=b"y"), op(1, "b", "put", "k", 0, 0.9, value=b"x"),
              op(2, "c", "get", "k", 0.5, 1, None), op(3, "d", "delete", "k", 0, 1), op(4, "a", "get", "k", 2, 3, b"x")]
    assert greedy_order(("k",), second, KV_MODEL) is None
    for h in (first, second):
        assert _sweep(h).linearizable is True and check(h).linearizable is True
    second[4].result = b"y"  # y was overwritten by x before the read was called
    assert greedy_order(("k",), second, KV_MODEL) is None and replay_order(("k",), second, KV_MODEL) is None
    v = check(second)
    assert v.linearizable is False and v.methods == {"register": 1} and v.unplaceable == 4


def test_a_replay_in_midpoint_order_that_the_model_accepts_decides():
    """Without a register view (a model other than the register), ops replayed in the order of their midpoints
    keep real time; when the model accepts them so, or after local repairs, that is a linearization (even with ops
    overlapping); when it does not, the search decides and names the op."""
    model = attrs.evolve(KV_MODEL, register_view=None)
    h = [op(0, "a", "put", "k", 0, 1, value=b"x"), op(1, "b", "get", "k", 2, 3, b"x"),
         op(2, "a", "delete", "k", 4, 5), op(3, "b", "contains", "k", 4.5, 7, False)]
    v = check(h, model)
    assert v.linearizable is True and v.methods == {"replay": 1}
    h[3].result = True  # possible (it may go before the delete), not in midpoint order: a repair moves it back
    v = check(h, model)
    assert v.linearizable is True and v.methods == {"replay": 1}
    h[3].invoked = 6  # after the delete returned: a violation
    v = check(h, model)
    assert v.linearizable is False and v.methods == {"search": 1} and v.unplaceable == 3 and v.prefix == [0, 1, 2]
    assert check(h).unplaceable == 3 and check(h).methods == {"register": 1}


def test_a_replay_that_needs_many_repairs_gives_up():
    """Repairs cost more than an exact path past about one per 24 ops, so a replay that needs more gives up. Demo:
    pairs (put v_i, a short get of v_i called right after it): each get's midpoint comes before its put's, one
    repair per pair. The replay gives up, the part is still decided (linearizable, by another path); with the
    allowance raised the same replay ends with a linearization (so the allowance is what stopped it)."""
    h = []
    for i in range(24):
        h.append(op(2 * i, "a", "put", "k", 10 * i, 10 * i + 8, value=f"v{i}".encode()))
        h.append(op(2 * i + 1, "b", "get", "k", 10 * i + 0.5, 10 * i + 1, f"v{i}".encode()))
    assert replay_order(("k",), h, KV_MODEL) is None
    v = check(h)
    assert v.linearizable is True and "replay" not in v.methods
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(linearizability_replay, "_FREE_REPAIRS", 1_000)
        order = replay_order(("k",), h, KV_MODEL)
    assert order is not None and linearization_holds(("k",), h, [h.index(o) for o in order], KV_MODEL)


def test_splitting_while_partitioning_is_partitioning_the_split():
    """`split_parts` (one pass) gives the parts `partitions(split(ops))` gives: the same keys, the same ops (the
    multi-key reads cut into the same pieces) in the same order; a multi-key write, which the split keeps whole and
    which joins keys, takes the general way."""
    def shape(parts):
        return [(keys, [(o.id, o.path, o.keys, o.result) for o in ops]) for keys, ops in parts]

    for seed in range(3):
        ops = synthetic_history(seed, n_ops=400, n_keys=6, n_callers=4, pending=0.05).ops
        assert any(len(o.keys) > 1 for o in ops)
        assert shape(split_parts(ops, KV_MODEL.split)) == shape(partitions(KV_MODEL.split(ops)))
    ops.append(Op(10_000, "z", "delete", ("k0", "k1"), invoked=1.0, completed=2.0, completions=1))
    parts = split_parts(ops, KV_MODEL.split)
    assert shape(parts) == shape(partitions(KV_MODEL.split(ops))) and any(len(k) > 1 for k, _ in parts)



def test_the_sweep_budget_counts_only_the_steps_going_back():
    """`over_budget` is asked once the sweep has spent `budget` steps beyond the deepest decision it reached (going
    back, or trying a second choice), not after `budget` steps in all: a long linearizable part whose sweep goes
    back a few steps here and there is not asked about with a budget of those few; a violation late in a part is,
    once the sweep goes back there, and the part is still decided (by the zones)."""
    [(_, ops)] = split_parts(synthetic_history(1, n_ops=2_000, n_keys=1, n_callers=8).ops, KV_MODEL.split)
    inst = linearizability_sweep.build(ops, KV_MODEL.register_view)
    chosen, deepest, steps = linearizability_sweep.sweep(inst, max_states=100_000)
    extra = steps - deepest
    assert chosen is not None and 0 < extra < steps // 10
    asked: list[int] = []

    def stop() -> bool:
        asked.append(1)
        return True

    assert linearizability_sweep.sweep(inst, max_states=100_000, budget=extra, over_budget=stop)[0] is not None
    assert not asked
    ops = []
    for i in range(60):
        ops.append(op(2 * i, "a", "put", "k", 4 * i, 4 * i + 1, value=f"v{i}".encode()))
        ops.append(op(2 * i + 1, "b", "get", "k", 4 * i + 2, 4 * i + 3, f"v{i}".encode()))
    ops[-1].result = b"v57"  # overwritten by v58 before this read was called
    inst = linearizability_sweep.build(ops, KV_MODEL.register_view)
    with pytest.raises(linearizability_sweep.OverBudget) as stopped:
        linearizability_sweep.sweep(inst, max_states=10_000, budget=5, over_budget=stop)
    assert asked == [1] and stopped.value.steps > len(inst.T) - 10
    assert check(ops).linearizable is False and check(ops).unplaceable == ops[-1].id


@pytest.mark.skipif(native.status()["checking.linearizability"]["compiled"],
                    reason="replaces functions that compiled code calls directly: runs in the pure pass (SHARDCHECK_PURE=1)")
def test_the_replay_puts_a_pending_put_where_its_reads_want_it():
    """A put that never completed goes, in the replay's first order, right before the earliest get of its value (not
    before its call), and is left out when no get returned its value: no repair is needed for either. Demo: with the
    placement off, the same histories need a repair (with repairs off, the replay gives up)."""
    seen = [op(0, "a", "put", "k", 0, None, value=b"v1"), op(1, "b", "put", "k", 1, 2, value=b"v2"),
            op(2, "c", "get", "k", 3, 4, b"v1")]
    unseen = [op(0, "a", "put", "k", 0, None, value=b"v9"), op(1, "b", "get", "k", 1, 2, None)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(linearizability_replay, "_repair", lambda *args: None)
        for h in (seen, unseen):
            order = replay_order(("k",), h, KV_MODEL)
            assert order is not None and linearization_holds(("k",), h, [h.index(o) for o in order], KV_MODEL)
        assert replay_order(("k",), unseen, KV_MODEL) == [unseen[1]]
        mp.setattr(linearizability_replay, "_place_pending_puts", lambda *args: None)
        assert replay_order(("k",), seen, KV_MODEL) is None and replay_order(("k",), unseen, KV_MODEL) is None
