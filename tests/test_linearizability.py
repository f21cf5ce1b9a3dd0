"""The linearizability checker on hand-made histories, each able to fail either way."""
from __future__ import annotations

import json

import pytest

from checking.linearizability import check, partitions
from model.history import History, KVModel, Op, lanes

V, W = b"v", b"w"


def op(i, caller, path, keys, inv, ret, result=None, value=None, error=None):
    keys = (keys,) if isinstance(keys, str) else tuple(keys)
    return Op(i, caller, path, keys, value, float(inv), None if ret is None else float(ret), result, error, 1)


def test_read_overlapping_a_put_may_see_either_value():
    """A read overlapping a put may return the old or the new value."""
    for seen in (None, V):
        h = [op(0, "a", "put", "k", 0, 10, value=V), op(1, "b", "get", "k", 1, 2, seen)]
        assert check(h).linearizable is True


def test_read_after_a_completed_put_must_see_it():
    """A read that starts after a put completed and misses is not linearizable."""
    h = [op(0, "a", "put", "k", 0, 1, value=V), op(1, "b", "get", "k", 2, 3, None)]
    v = check(h)
    assert v.linearizable is False
    assert v.unplaceable == 1 and v.prefix == [0] and v.keys == ("k",)


def test_new_then_old_inversion_is_caught():
    """Two reads in sequence during one put may not see the new value and then the old one."""
    h = [op(0, "a", "put", "k", 0, 10, value=V), op(1, "b", "get", "k", 1, 2, V), op(2, "b", "get", "k", 3, 4, None)]
    assert check(h).linearizable is False
    h[2].result = V
    assert check(h).linearizable is True


def test_pending_put_may_take_effect_late_but_then_stays():
    """A put that never completed may take effect at any time after its call, but not undo itself."""
    h = [op(0, "a", "put", "k", 0, None, value=V), op(1, "b", "get", "k", 5, 6, None), op(2, "b", "get", "k", 7, 8, V)]
    assert check(h).linearizable is True
    h.append(op(3, "b", "get", "k", 9, 10, None))
    assert check(h).linearizable is False


def test_pending_read_constrains_nothing():
    """A read that never answered is linearizable whatever it holds."""
    h = [op(0, "a", "put", "k", 0, 1, value=V), op(1, "b", "get", "k", 2, None, b"junk")]
    assert check(h).linearizable is True


def test_delete_and_contains():
    """contains follows puts and deletes; a contains true after a completed delete is caught."""
    h = [op(0, "a", "put", "k", 0, 1, value=V), op(1, "a", "delete", "k", 2, 3), op(2, "b", "contains", "k", 4, 5, False)]
    assert check(h).linearizable is True
    h[2].result = True
    assert check(h).linearizable is False


def test_keys_are_independent_parts():
    """Ops on different keys are judged in separate parts; a bad part is named by its keys."""
    h = [op(0, "a", "put", "x", 0, 1, value=V), op(1, "b", "get", "y", 2, 3, None),
         op(2, "b", "get", "x", 2, 3, W)]
    parts = partitions(h)
    assert [keys for keys, _ in parts] == [("x",), ("y",)]
    v = check(h)
    assert v.linearizable is False and v.keys == ("x",) and v.parts == 2


def test_multi_key_reads_are_judged_per_key():
    """A batch or prefix read says something about each key; a wrong part of it is caught on that key."""
    h = [op(0, "a", "put", "x", 0, 1, value=V), op(1, "a", "put", "y", 2, 3, value=W),
         op(2, "b", "get_batch", ["x", "y"], 4, 5, [V, W]), op(3, "b", "contains_batch", ["x", "y"], 4, 5, 2),
         op(4, "b", "get_prefix", ["y", "z"], 4, 5, [W])]
    assert check(h).linearizable is True
    h[3].result = 1  # y reported missing after its put completed
    v = check(h)
    assert v.linearizable is False and v.keys == ("y",) and v.unplaceable == 3
    h[3].result = 7  # more hits than keys
    assert check(h).linearizable is False


def test_snapshot_mode_needs_one_instant_of_all_keys():
    """A batch that saw x before a swap and y after it is fine per key but not as one snapshot."""
    h = [op(0, "a", "put", "x", 0, 1, value=V), op(1, "c", "delete", "x", 5, 6), op(2, "c", "put", "y", 7, 8, value=W),
         op(3, "b", "get_batch", ["x", "y"], 4, 9, [V, W])]
    assert check(h).linearizable is True
    assert check(h, snapshot=True).linearizable is False
    assert len(partitions(h)) == 1


def test_model_answers_every_read_path():
    """The sequential register answers each read path as the contract says."""
    m = KVModel(("a", "b", "c"))
    s = (V, None, W)
    assert m.answer(s, "get", ["a"]) == V and m.answer(s, "get_sync", ["b"]) is None
    assert m.answer(s, "contains", ["c"]) is True
    assert m.answer(s, "get_batch", ["a", "b", "c"]) == [V, None, W]
    assert m.answer(s, "get_prefix", ["a", "b", "c"]) == [V]
    assert m.answer(s, "contains_async", ["c", "a", "b"]) == 2
    with pytest.raises(ValueError, match="unknown read path"):
        m.answer(s, "scan", ["a"])


def test_search_bound_makes_it_undecided():
    """A search cut off by its memory bound answers None (undecided), says why and names the part left; the
    register path decides the same history at once."""
    h = [op(i, f"c{i}", "put", "k", 0, 100, value=bytes([i])) for i in range(10)]
    h.append(op(10, "r", "get", "k", 101, 102, b"nothing-wrote-this"))
    v = check(h, max_states=50, fast=False)
    assert v.linearizable is None and "memory bound" in v.why and v.undecided == [("k",)]
    assert v.to_json()["undecided"] == [["k"]]
    assert check(h, fast=False).linearizable is False
    fast = check(h, max_states=50)
    assert fast.linearizable is False and fast.unplaceable == 10 and fast.methods == {"register": 1}


def test_lanes_data_form():
    """The picture data has one lane per caller, pending ops flagged, and the violation's prefix and op."""
    h = History([op(0, "a", "put", "k", 0, 1, value=V), op(1, "b", "get", "k", 2, 3, None),
                 op(2, "b", "get_async", "k", 4, None)])
    data = lanes(h, verdict=check(h).to_json())
    assert [lane["caller"] for lane in data["lanes"]] == ["a", "b"]
    assert data["pending"] == [2] and data["lanes"][1]["ops"][1]["end"] is None
    assert data["linearizable_prefix"] == [0] and data["unplaceable"] == 1


def test_history_json_round_trip():
    """A history survives its JSON form, bytes results included."""
    h = History([op(0, "a", "put", "k", 0, 1, value=V), op(1, "b", "get_batch", ["k", "j"], 2, 3, [V, None])])
    back = History.from_json(h.to_json())
    assert back == h


def test_synthetic_bench_history_is_linearizable_until_one_read_lies():
    """The bench's generated history (1,000 ops) is linearizable, and one altered read makes it not."""
    from checking.concurrency_bench import synthetic_history
    h = synthetic_history(3, n_ops=1000, n_keys=10, n_callers=8)
    assert check(h).linearizable is True
    liar = next(o for o in h.ops if o.path == "get" and o.result is not None)
    liar.result = b"never written"
    v = check(h)
    assert v.linearizable is False and v.unplaceable == liar.id


def test_bench_reports_both_concurrency_figures():
    """`shardcheck bench` gets the checker's seconds and the driver's ops per second."""
    from checking.concurrency_bench import bench
    got = bench(0.2, million=False)
    assert got["checker_linearizable"] is True and got["checker_10k_s"] > 0 and got["driver_ops_per_s"] > 0
    assert got["checker_100k_linearizable"] is True and got["checker_100k_s"] > 0
    assert got["checker_1m_s"] is None  # (left out: its generation alone takes about 10 s)


# -- the register path (the sweep, exact simplifications) and the search against a brute force -------------

def _brute_force(ops):
    """Linearizable? By trying every order of every admissible subset (small histories only): an op that never
    completed (or a write that raised) may be left out; a read that never answered or failed constrains nothing."""
    import itertools
    from model.history import KV_MODEL
    optional = [o for o in ops if o.pending or (o.error is not None and o.path in ("put", "delete"))]
    must = [o for o in ops if o not in optional and not (o.error is not None)]
    keys = tuple(sorted({k for o in ops for k in o.keys}))
    for r in range(len(optional) + 1):
        for extra in itertools.combinations(optional, r):
            chosen = must + list(extra)
            for perm in itertools.permutations(chosen):
                ok, state = True, KV_MODEL.init(keys)
                for a, x in enumerate(perm):
                    if any(y.completed is not None and y.completed < x.invoked for y in perm[a + 1:]):
                        ok = False
                        break
                    fine, state = KV_MODEL.step(keys, state, x)
                    if not fine:
                        ok = False
                        break
                if ok:
                    return True
    return False


MAX_FUZZ_OPS = 6


def _random_history(draw):
    from hypothesis import strategies as st
    n = draw(st.integers(1, MAX_FUZZ_OPS))
    values = [b"a", b"b", b"c"]
    ops = []
    for i in range(n):
        path = draw(st.sampled_from(["put", "put", "delete", "get", "get", "contains"]))
        inv = draw(st.integers(0, 8))
        length = draw(st.integers(0, 4))
        pending = draw(st.integers(0, 5)) == 0
        value = draw(st.sampled_from(values)) if path == "put" else None
        result = None
        if path == "get":
            result = draw(st.sampled_from(values + [None]))
        elif path == "contains":
            result = draw(st.booleans())
        ops.append(op(i, f"c{i}", path, "k", inv, None if pending else inv + length, result, value))
    return ops


def test_register_path_and_search_agree_with_a_brute_force():
    """On many random one-key histories (duplicate values, deletes, misses, contains, pending ops) the verdict
    of the register path, of the plain search and of a brute force are the same."""
    from hypothesis import given, settings, strategies as st, HealthCheck
    from checking.linearizability.greedy import greedy_order
    from checking.linearizability.register import linearization_holds
    from checking.linearizability.midpoints import replay_order
    from model.history import KV_MODEL

    @settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
    @given(st.data())
    def run(data):
        ops = _random_history(data.draw)
        want = _brute_force(ops)
        assert check(ops).linearizable is want
        assert check(ops, fast=False).linearizable is want
        order = greedy_order(("k",), ops, KV_MODEL)  # (duplicate values too: the model checks each step)
        assert order is None or (want is True and linearization_holds(("k",), ops, order, KV_MODEL))
        replayed = replay_order(("k",), ops, KV_MODEL)
        assert replayed is None or (want is True and linearization_holds(
            ("k",), ops, [next(j for j, o in enumerate(ops) if o is x) for x in replayed], KV_MODEL))

    run()


def _register_path(ops):
    """The register path's own verdict on a one-key part (what `check` takes when the greedy pass gives up)."""
    from checking.linearizability.register import decide_register
    from model.history import KV_MODEL
    return decide_register(("k",), ops, KV_MODEL, max_states=1_000_000, deadline=None)


def test_unique_value_histories_are_decided_by_the_register_path_both_ways():
    """Unique values: the greedy pass or the register path decides (no search); a stale read is rejected and
    named."""
    h = [op(0, "a", "put", "k", 0, 4, value=V), op(1, "b", "get", "k", 1, 2, V), op(2, "a", "put", "k", 5, 6, value=W),
         op(3, "b", "get", "k", 7, 8, W), op(4, "c", "get", "k", 0, 0.5, None)]  # V seen before V's midpoint
    v = check(h)
    assert v.linearizable is True and set(v.methods) <= {"replay", "greedy"}
    v, method = _register_path(h)
    assert v.linearizable is True and method == "register"
    h[3].result = V  # V was overwritten by W, which completed before the read was called
    v = check(h)
    assert v.linearizable is False and v.methods == {"register": 1}
    assert v.unplaceable == 3 and v.prefix == [4, 0, 1, 2]


def test_pending_put_is_taken_exactly_when_a_read_returns_its_value():
    """A put that never completed, observed by a read, must have happened before that read returned: a later
    read of the old value is then a violation; unobserved, it may never happen."""
    h = [op(0, "a", "put", "k", 0, 1, value=V), op(1, "b", "put", "k", 2, None, value=W),
         op(2, "c", "get", "k", 3, 4, W), op(3, "c", "get", "k", 5, 6, V)]
    assert check(h).linearizable is False
    assert check(h, fast=False).linearizable is False
    del h[2]  # nobody saw W: the pending put may never have taken effect
    v = check(h)
    assert v.linearizable is True and set(v.methods) <= {"replay", "greedy"}
    v, method = _register_path(h)
    assert v.linearizable is True and method == "register"


def test_duplicate_values_fall_back_to_the_search():
    """Two puts of one value: not the sweep's case; the search decides, both ways (the greedy pass, whose order
    the model checks, may still find a linearization)."""
    h = [op(0, "a", "put", "k", 0, 1, value=V), op(1, "a", "put", "k", 2, 3, value=W), op(2, "a", "put", "k", 4, 8, value=V),
         op(3, "b", "get", "k", 4.5, 7, V)]  # the second V seen before its midpoint
    v = check(h)
    assert v.linearizable is True and set(v.methods) <= {"replay", "greedy"}
    v, method = _register_path(h)
    assert v.linearizable is True and method == "search"
    h[3].invoked, h[3].completed = 3.5, 3.8  # between the W put and the second V put: sees W only
    v = check(h)
    assert v.linearizable is False and v.methods == {"search": 1} and v.unplaceable == 3


def test_misses_and_deletes():
    """A miss after a completed put needs a delete in between; several deletes make reads of a miss ambiguous,
    which the register path decides too."""
    h = [op(0, "a", "put", "k", 0, 1, value=V), op(1, "b", "get", "k", 2, 3, None)]
    assert check(h).linearizable is False
    h.append(op(2, "c", "delete", "k", 1.5, 2.5))
    assert check(h).linearizable is True
    h += [op(3, "c", "delete", "k", 2.6, 2.7), op(4, "d", "contains", "k", 2.8, 2.9, True)]
    assert check(h).linearizable is False  # both deletes completed before the contains started
    g = [op(0, "a", "put", "k", 0, 1, value=V), op(1, "c", "delete", "k", 1.5, None), op(2, "b", "get", "k", 2, 3, None)]
    assert check(g).linearizable is True  # the delete that never completed is seen by the miss
    g.append(op(3, "b", "get", "k", 4, 5, V))
    assert check(g).linearizable is False  # ... and then nothing wrote V again


def test_history_files_feed_the_checker_and_are_never_overwritten(tmp_path):
    """`write_histories` writes the files `check_directory` (and `shardcheck bench --histories`) reads; the stale
    one is rejected, the others accepted; writing again into the same place refuses to overwrite."""
    from checking.concurrency_bench import check_directory, write_histories
    specs = [("a", 300, 4, 4, 0.0, False), ("b", 300, 4, 4, 0.05, True)]
    write_histories(str(tmp_path), specs)
    rows = check_directory(str(tmp_path))
    assert [(r["file"], r["verdict"]["linearizable"]) for r in rows] == [("a.json", True), ("b.json", False)]
    assert rows[1]["spec"]["pending"] == 0.05 and rows[1]["spec"]["violation"] is True
    with pytest.raises(ValueError, match="not overwritten"):
        write_histories(str(tmp_path), specs)


def test_bench_histories_reports_the_best_of_n_runs_and_refuses_bad_options(tmp_path, capsys, monkeypatch):
    """`shardcheck bench --histories DIR --repeat N`: each file checked N times, the least wall and CPU seconds
    reported (what another checker's best-of-N harness reports); a bad N, or N without a directory, is one line and
    exit 2, and so is a directory with a file that is not a history."""
    from checking.concurrency_bench import check_directory, write_histories
    from shardcheck.cli import main
    import checking.concurrency_bench as bench
    write_histories(str(tmp_path), [("a", 200, 4, 4, 0.0, False), ("b", 200, 4, 4, 0.0, True)])
    calls = []
    monkeypatch.setattr(bench, "check", lambda h, **kw: calls.append(len(h.ops)) or check(h, **kw))
    rows = check_directory(str(tmp_path), repeat=3)
    assert calls == [200] * 6
    assert [(r["runs"], r["verdict_changed"], r["verdict"]["linearizable"]) for r in rows] == [(3, False, True),
                                                                                             (3, False, False)]
    assert all(0 < r["cpu_seconds"] and 0 < r["seconds"] for r in rows)
    assert main(["bench", "--histories", str(tmp_path), "--repeat", "2", "--json"]) == 0
    assert [r["runs"] for r in json.loads(capsys.readouterr().out)] == [2, 2]
    for argv, why in ((["--histories", str(tmp_path), "--repeat", "0"], "--repeat must be at least 1, not 0"),
                      (["--repeat", "2"], "--repeat needs --histories DIR")):
        assert main(["bench", *argv]) == 2
        assert capsys.readouterr().err == f"shardcheck bench: {why}\n"
    (tmp_path / "c.json").write_text('{"nothing": 1}')
    assert main(["bench", "--histories", str(tmp_path)]) == 2
    assert "c.json: not a history" in capsys.readouterr().err
