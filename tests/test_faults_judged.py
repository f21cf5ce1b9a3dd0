"""Real-server faults as data and as judged, without servers: the fault kinds' codec and validation, store-ops runs
through faults (a fake `ServerControl` over in-memory stores), the lossy register, protocol cases through faults."""
from __future__ import annotations

import json
import re

import pytest

from checking.concurrency_judge import judge
from checking.faulted import fault_op
from checking.linearizability import check
from checking.storeops import run_ops
from model.faults import SERVER_KIND_NAMES, SERVER_KINDS, FaultPlan, ServerFault, server_fault_kinds
from model.harness import Case, run_case
from model.history import LOSSY_KV_MODEL, History, Op
from model.protocols import PaperProtocol
from model.store import MemoryStore
from model.trace import Trace, TraceError


class FakeControl:
    """A `ServerControl` over in-memory stores: a fault happens at once and is over at once; a restart empty clears
    the rank's store; `broken` stores raise while `down` says so."""

    def __init__(self, stores):
        self.stores, self.struck = stores, []

    def _hit(self, what, rank, **kw):
        self.struck.append((what, rank, kw))

    def pause(self, rank, seconds):
        self._hit("pause", rank)

    def kill_restart(self, rank, *, keep_data, seconds):
        self._hit("restart", rank, keep_data=keep_data)
        if not keep_data:
            self.stores[rank].data.clear()

    def kill_connections(self, rank):
        self._hit("kill", rank)

    def debug_sleep(self, rank, seconds):
        self._hit("sleep", rank)

    def client_pause(self, rank, seconds):
        self._hit("client-pause", rank)

    def evict_by_policy(self, rank):
        self._hit("evict", rank)
        self.stores[rank].data.clear()

    def healed(self, timeout):
        import time
        return time.monotonic()

    def close(self):
        pass


def test_every_kind_round_trips_and_bad_entries_name_the_field():
    """Each real-server kind's items round-trip through a trace's `faults`; a malformed one names kind and entry."""
    plan = FaultPlan(**{k.field: (ServerFault(1, "during-load", 2, 1.5),) for k in SERVER_KINDS})
    assert FaultPlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    assert FaultPlan().to_json() == FaultPlan.from_json({}).to_json()  # no server kind written when none strikes
    for bad, why in (({"rank": 0, "at": "somewhere"}, "'at' must be one of"), ({"rank": 0, "at": "run"}, "needs 'step'"),
                     ({"rank": 0, "seconds": -1}, "'seconds'"), ({"at": "op"}, "integer 'rank'")):
        with pytest.raises(ValueError, match=rf"server_pause\[0\]: .*{why}"):
            FaultPlan.from_json({"server_pause": [bad]})
    assert server_fault_kinds("pause,evict") == (SERVER_KIND_NAMES["pause"], SERVER_KIND_NAMES["evict"])
    assert server_fault_kinds("none") == () and server_fault_kinds("all") == SERVER_KINDS
    with pytest.raises(ValueError, match="unknown fault kind 'nap'"):
        server_fault_kinds("pause,nap")


def test_a_store_ops_trace_validates_its_fault_ops(tmp_path):
    """A store-ops trace's fault ops are validated by the kind's codec: an unknown kind or a bad rank names the op."""
    base = Trace(kind="store-ops", property="recovery", summary="s", protocol={"name": "-", "ref": None},
                 client="lmcache", config={"n_ranks": 1}, ops=[fault_op("server_pause", 0, 1.0), {"op": "recover"}])
    Trace.from_json(base.to_json())
    for op, field in (({"op": "fault", "fault": "server_nap", "rank": 0}, "ops[0].fault"),
                      ({"op": "fault", "fault": "evict_after_lookup", "rank": 0}, "ops[0].fault"),
                      ({"op": "fault", "fault": "server_pause", "rank": 3}, "ops[0].rank")):
        data = base.to_json()
        data["ops"] = [op]
        with pytest.raises(TraceError, match=re.escape(f"field '{field}'")):
            Trace.from_json(data)


def _run(stores, ops, **kw):
    return run_ops(stores, ops, wait_bound=0.5, control=FakeControl(stores), recovery_seconds=0.2, **kw)


def test_a_fault_that_loses_data_allows_a_miss_and_a_lossless_one_does_not_after_recovery():
    """After a restart empty a key may read as a miss for good; after a pause, once recovered, it may not."""
    def ops(kind):
        return [{"rank": 0, "op": "put", "key": "k", "value": b"v"}, fault_op(kind, 0), {"op": "recover"},
                {"rank": 0, "op": "get", "key": "k"}]
    stores = [MemoryStore()]
    assert _run(stores, ops("server_restart_empty"))[1] == []

    class Forgetful(MemoryStore):  # answers a miss for everything once a fault struck it
        def get(self, key):
            return None if key == "k" else super().get(key)
    records, violations = _run([Forgetful()], ops("server_pause"))
    assert [v.property for v in violations] == ["recovery"] and "a miss for a key its server holds" in violations[0].summary


def test_while_a_fault_lasts_errors_and_misses_are_fine_wrong_bytes_are_not():
    """Within the window an error or a miss is fine; another key's bytes are `fault-integrity`, named."""
    class Flaky(MemoryStore):
        mode = "ok"

        def get(self, key):  # (the recovery probe's own key is answered right: the client recovered)
            if self.mode == "raise" and key == "b":
                raise ConnectionError("socket writev failed")
            if self.mode == "other" and key == "b":
                return self.data.get("a")
            return super().get(key)

    store = Flaky()
    ops = [{"rank": 0, "op": "put", "key": "a", "value": b"bytes-of-a"}, fault_op("server_kill_connections", 0),
           {"rank": 0, "op": "get", "key": "b"}]
    store.mode = "raise"
    assert _run([store], ops)[1] == []
    store.mode = "other"
    (v,) = _run([store], ops)[1]
    assert v.property == "fault-integrity" and "the bytes put under 'a'" in v.summary and v.detail["owner"] == "a"


def test_a_client_that_stays_broken_fails_recovery_and_a_fault_needs_a_nemesis():
    """A client that raises on every call after a fault fails the recovery probe; a fault op without a control is
    unusable input."""
    class Broken(MemoryStore):
        def put(self, key, value):
            raise ConnectionError("the connection is broken")

    (v,) = _run([Broken()], [fault_op("server_pause", 0, 0.1), {"op": "recover"}])[1]
    assert v.property == "recovery" and "still fails" in v.summary
    with pytest.raises(ValueError, match="needs a nemesis"):
        run_ops([MemoryStore()], [fault_op("server_pause", 0, 0.1)], control=None)


def _op(i, path, key, value=None, result=None, t=(0.0, 1.0), caller="t0"):
    return Op(i, caller, path, (key,), value, invoked=t[0], completed=t[1], result=result, completions=1)


def test_the_lossy_register_allows_exactly_what_each_fault_allows():
    """A restart empty wipes the key; a restart with data restores what SAVE held, not a later write; an eviction by
    policy may lose the key (a miss) but a read after the loss that saw it keeps it."""
    wipe = [_op(0, "put", "k", b"v", t=(0, 1)), _op(1, "fault-wipe", "k", t=(2, 3), caller="nemesis"),
            _op(2, "get", "k", result=None, t=(4, 5))]
    assert check(wipe, LOSSY_KV_MODEL).linearizable is True
    assert check(wipe[:2] + [_op(2, "get", "k", result=b"v", t=(4, 5))], LOSSY_KV_MODEL).linearizable is False
    snap = [_op(0, "put", "k", b"old", t=(0, 1)), _op(1, "fault-save", "k", t=(2, 3), caller="nemesis"),
            _op(2, "put", "k", b"new", t=(4, 5)), _op(3, "fault-restore", "k", t=(6, 7), caller="nemesis")]
    assert check(snap + [_op(4, "get", "k", result=b"old", t=(8, 9))], LOSSY_KV_MODEL).linearizable is True
    assert check(snap + [_op(4, "get", "k", result=b"new", t=(8, 9))], LOSSY_KV_MODEL).linearizable is False
    lose = [_op(0, "put", "k", b"v", t=(0, 1)), _op(1, "fault-lose", "k", t=(2, 3), caller="nemesis")]
    assert check(lose + [_op(2, "get", "k", result=None, t=(4, 5))], LOSSY_KV_MODEL).linearizable is True
    kept = lose + [_op(2, "get", "k", result=b"v", t=(4, 5)), _op(3, "get", "k", result=None, t=(6, 7))]
    assert check(kept, LOSSY_KV_MODEL).linearizable is False  # seen kept after the loss was over: no later miss


def test_a_faulted_concurrent_history_is_judged_with_its_window():
    """In a history through a fault, an error within the recovery bound is fine and one after it is `recovery`; a
    pending op is `fault-hang`."""
    fault = {"fault": "server_pause", "rank": 0, "seconds": 1.0, "loses": "nothing", "struck": 1.0, "struck_end": 1.0,
             "healed": 2.0, "recovery_seconds": 1.0, "op_timeout": 5.0}
    ok = History([_op(0, "get", "k", result=None, t=(0.0, 0.1)),
                  attrs_evolve(_op(1, "get", "k", t=(1.5, 1.6)), error="ConnectionError: down")], [fault])
    assert judge(ok)[0] == []
    late = History([attrs_evolve(_op(1, "get", "k", t=(3.5, 3.6)), error="ConnectionError: down")], [fault])
    assert [v.property for v in judge(late)[0]] == ["recovery"]
    hung = History([_op(1, "get", "k", t=(1.5, None))], [fault])
    assert [v.property for v in judge(hung)[0]] == ["fault-hang"]


def attrs_evolve(op, **kw):
    import attrs
    return attrs.evolve(op, **kw)


def test_a_protocol_case_through_a_fault_may_lower_the_plan_and_errors_are_misses():
    """A restart empty before the lookup lowers the plan (no completeness claimed) and the ranks still agree; a
    client error while the fault lasts is a miss to the protocol; without a control the case is refused."""
    case = Case(2, 4, faults=FaultPlan(server_restart_empty=(ServerFault(0, "before-lookup", None, 0.0),)))
    stores = [MemoryStore(), MemoryStore()]
    out = run_case(PaperProtocol(), case, stores, control=FakeControl(stores), recovery_seconds=0.2)
    assert out.violations == [] and out.planned == 0 and out.lcp == 4
    with pytest.raises(ValueError, match="needs a nemesis"):
        run_case(PaperProtocol(), case)

    class Raising(MemoryStore):  # fails the lookup's calls while the fault lasts (the probe's key works)
        def contains(self, key):
            if key.startswith("shardcheck-recovery-probe"):
                return super().contains(key)
            raise ConnectionError("down")
    stores = [Raising(), MemoryStore()]
    pause = Case(2, 4, faults=FaultPlan(server_pause=(ServerFault(0, "before-lookup", None, 0.0),)))
    out = run_case(PaperProtocol(), pause, stores, control=FakeControl(stores), recovery_seconds=0.2)
    assert out.planned == 0 and out.violations == []
    assert any("error answered as a miss" in e.note for e in out.events)
