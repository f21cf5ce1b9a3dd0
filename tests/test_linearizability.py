"""The linearizability checker on hand-made histories, each able to fail either way."""
from __future__ import annotations

import pytest

from engines.linearizability import check, partitions
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
    zones decide the same history at once."""
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
    from engines.concurrency_bench import synthetic_history
    h = synthetic_history(3, n_ops=1000, n_keys=10, n_callers=8)
    assert check(h).linearizable is True
    liar = next(o for o in h.ops if o.path == "get" and o.result is not None)
    liar.result = b"never written"
    v = check(h)
    assert v.linearizable is False and v.unplaceable == liar.id


def test_bench_reports_both_concurrency_figures():
    """`shardcheck bench` gets the checker's seconds and the driver's ops per second."""
    from engines.concurrency_bench import bench
    got = bench(0.2)
    assert got["checker_linearizable"] is True and got["checker_10k_s"] > 0 and got["driver_ops_per_s"] > 0
