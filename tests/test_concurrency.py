"""The concurrent driver and its judge: racy clients are caught, correct ones never flagged."""
from __future__ import annotations

import threading

import pytest

from checking.concurrency import Layout, make_layout, measure, run_layout, thread_safe
from checking.concurrency_judge import judge
from model.contract import declared_paths
from checking.storeops import run_ops
from model.store import MemoryStore
from properties.bad_stores import RACY_STORES, DoubleCompletionStore, JitterStore

#: Runs per layout: each racy store shows its bug in most runs, so missing it in all of these is ~impossible.
RUNS = 10


def racy_layout(store, seed=0):
    return make_layout(seed, threads=4, ops=10, keys=2, paths=declared_paths(store))


@pytest.mark.parametrize("name", list(RACY_STORES))
def test_racy_store_is_caught_with_its_property(name):
    """Each racy client shows its own property in the runs of one fixed layout: the one most failing runs lead with
    (a race shows others now and then, e.g. a crossed reply that carried a miss is only `linearizability`)."""
    factory, prop = RACY_STORES[name]
    store = factory(1)[0]
    try:
        rate = measure(store, racy_layout(store), runs=RUNS, bound=0.5)
    finally:
        store.close()
    assert rate.k >= 1, f"{name}: no violation in {rate.n} runs"
    assert max(rate.properties, key=rate.properties.get) == prop, rate.properties


@pytest.mark.parametrize("name", list(RACY_STORES))
def test_racy_store_is_correct_one_op_at_a_time(name):
    """Called one op at a time (every async read awaited), each racy client agrees with the oracle."""
    factory, _ = RACY_STORES[name]
    store = factory(1)[0]
    ops = []
    for i in range(30):
        key = f"k{i % 3}"
        ops += [{"rank": 0, "op": "put", "key": key, "value": bytes([i])}, {"rank": 0, "op": "get", "key": key},
                {"rank": 0, "op": "get_async", "key": key}, {"rank": 0, "op": "contains", "key": key}]
        if i % 4 == 3:
            ops += [{"rank": 0, "op": "delete", "key": key}, {"rank": 0, "op": "get", "key": key},
                    {"rank": 0, "op": "get_async", "key": key}]
    try:
        _, violations = run_ops([store], ops, wait_bound=1.0)
    finally:
        store.close()
    assert violations == []


@pytest.mark.parametrize("store_cls", [MemoryStore, JitterStore])
def test_correct_clients_are_never_flagged(store_cls):
    """The in-memory model and the correct jittery client hold over several layouts and runs."""
    store = store_cls()
    try:
        for seed in range(3):
            rate = measure(store, make_layout(seed, threads=4, ops=10, keys=2, paths=declared_paths(store)),
                           runs=3, bound=2.0)
            assert rate.k == 0, rate.first.violations if rate.first else None
    finally:
        store.close()


def test_layout_is_seeded_and_round_trips():
    """The same seed gives the same layout, another seed another; the flat op form rebuilds it."""
    a, b = make_layout(7, paths=("get", "get_batch")), make_layout(7, paths=("get", "get_batch"))
    assert a == b and a != make_layout(8, paths=("get", "get_batch"))
    assert Layout.from_ops(a.to_ops(), seed=7) == a
    assert any(len(op["keys"]) > 1 for t in a.threads for op in t if op["path"] == "get_batch")


class StuckStore(MemoryStore):
    def __init__(self):
        super().__init__()
        self.release = threading.Event()

    def contains(self, key):
        self.release.wait(30)
        return False


class RaisingStore(MemoryStore):
    def get(self, key):
        raise ConnectionError("reset by peer")


def one(path, keys=("k0",)):
    return Layout([[{"path": "put", "keys": ["k0"], "pad": 1}, {"path": path, "keys": list(keys)}]])


def test_double_completion_is_reported():
    """A completion delivered twice to one op is a double-completion violation."""
    violations, _ = judge(run_layout(DoubleCompletionStore(), one("get_async"), bound=1.0))
    assert [v.property for v in violations] == ["double-completion"]


def test_stuck_sync_call_is_a_lost_completion_naming_the_op():
    """A sync call that never returns is reported within the bound as a lost completion naming it."""
    store = StuckStore()
    try:
        violations, _ = judge(run_layout(store, one("contains"), bound=0.3, prefix=""))
    finally:
        store.release.set()
    assert violations[0].property == "lost-completion" and "contains(k0)" in violations[0].summary


def test_raising_call_is_a_store_error():
    """A call that raises is a store-error naming the op and the exception."""
    violations, _ = judge(run_layout(RaisingStore(), one("get"), bound=1.0))
    assert violations[0].property == "store-error" and "ConnectionError" in violations[0].summary


def test_declared_paths_and_thread_safety_are_read_with_defaults():
    """`paths` (else `read_paths`) is what the driver exercises, plus contains; `thread_safe` defaults True."""
    class Declared(MemoryStore):
        paths = ("get", "get_batch")
        thread_safe = False
    assert declared_paths(Declared()) == ("get", "get_batch", "contains")
    assert declared_paths(MemoryStore()) == ("get", "get_async", "get_batch", "contains")
    assert thread_safe(MemoryStore()) and not thread_safe(Declared())


def test_a_deterministic_wrong_key_is_no_wrong_caller():
    """One caller, an MGET that drops its misses: the hit's value lands on the missed key -- `wrong-key` (no other
    caller's read was crossed), naming the put whose value it was."""
    from properties.bad_stores import MgetDropsMissesStore
    layout = Layout([[{"path": "put", "keys": ["k1"], "pad": 2}, {"path": "get_batch", "keys": ["k0", "k1"]}]])
    violations, _ = judge(run_layout(MgetDropsMissesStore(), layout, bound=1.0))
    assert violations[0].property == "wrong-key", violations
    assert "with the value put for" in violations[0].summary and "put(" in violations[0].summary


def test_bytes_no_put_wrote_are_named_so():
    """A read answering bytes that no put of the run wrote is a round-trip violation saying so (not 'a value
    written for None')."""
    class Garbling(MemoryStore):
        def get(self, key):
            value = super().get(key)
            return None if value is None else b"\x00garbage"
    violations, _ = judge(run_layout(Garbling(), one("get"), bound=1.0))
    assert violations[0].property == "store-roundtrip"
    assert "bytes that no put wrote" in violations[0].summary and "None" not in violations[0].summary


def test_crossed_replies_are_wrong_caller_naming_the_other_read():
    """Two callers reading two keys at once through one pipeline take each other's replies: `wrong-caller`,
    naming the other caller's read."""
    from properties.bad_stores import CrossedRepliesStore
    store = CrossedRepliesStore()
    writes = [{"path": "put", "keys": ["k0"], "pad": 1}, {"path": "put", "keys": ["k1"], "pad": 1}]
    layout = Layout([writes + [{"path": "get", "keys": ["k0"]}] * 4, [{"path": "get", "keys": ["k1"]}] * 6])
    rate = measure(store, layout, runs=RUNS, bound=1.0)
    assert rate.properties.get("wrong-caller"), rate.properties
    assert "was answered with the reply to op" in rate.first.violations[0].summary


def test_a_fault_the_machine_kept_from_striking_judges_nothing():
    """A strike that raises `HarnessOutcome` (a SIGSTOP that did not land in time, the process resumed) ends the run
    with it: no history of a fault that never struck is judged."""
    from model.fault_items import ServerFault
    from model.timing import HarnessStarved

    class Kind:
        field, loses = "pause", "nothing"

        @staticmethod
        def strike(control, fault):
            raise HarnessStarved("the server was not stopped within 1 s of its SIGSTOP")

    layout = Layout([[{"path": "put", "keys": ["k0"], "pad": 1}, {"path": "get", "keys": ["k0"]}],
                     [{"path": "get", "keys": ["k0"]}]])
    with pytest.raises(HarnessStarved, match="not stopped"):
        run_layout(MemoryStore(), layout, bound=1.0, strikes=[(Kind, ServerFault(0, at="run", step=1, seconds=0.2))],
                   control=object())
