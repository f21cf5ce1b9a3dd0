"""Trace JSON round-trip and the errors a malformed file gives."""
import json

import pytest

from model.faults import Eviction, FaultPlan
from model.harness import Case, run_case
from model.trace import Trace, TraceError, decode, encode
from model.effects import GetAsync, Handle, TIMED_OUT
from model.variants import EarlyExitOnMiss, UnboundedWaitAsync


def _trace():
    case = Case(2, 3, faults=FaultPlan(evict_during_load=[Eviction(1, step=1)], lost=[(0, 0)]))
    out = run_case(EarlyExitOnMiss(), case)
    return Trace.from_outcome(out, protocol_ref="model.variants:EarlyExitOnMiss", origin="test")


def test_round_trip_is_exact(tmp_path):
    """A trace saved and loaded is equal, and replays to the same verdict."""
    t = _trace()
    p = t.save(tmp_path / "t.json")
    back = Trace.load(p)
    assert back == t
    assert run_case(EarlyExitOnMiss(), back.case()).violated() == sorted({v["property"] for v in t.verdict["violations"]})


def test_values_round_trip():
    """Bytes, TIMED_OUT, handles, effects and int-keyed maps survive encode/decode."""
    v = {"m": {0: b"\x00\xff", 1: TIMED_OUT}, "h": Handle(1, 2, "k"), "e": GetAsync("k")}
    assert decode(json.loads(json.dumps(encode(v)))) == v


def test_save_never_overwrites(tmp_path):
    """Saving onto an existing file refuses instead of replacing it."""
    t = _trace()
    t.save(tmp_path / "t.json")
    with pytest.raises(FileExistsError):
        t.save(tmp_path / "t.json")


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.update(version=99), "version"),
    (lambda d: d.update(schema="x"), "schema"),
    (lambda d: d.pop("config"), "config"),
    (lambda d: d["config"].update(n_ranks=0), "config.n_ranks"),
    (lambda d: d.update(schedule=[5]), "schedule"),
    (lambda d: d.update(kind="movie"), "kind"),
    (lambda d: d["faults"].update(lost=[[1]]), "faults"),
    (lambda d: d.update(expect={"model": "maybe"}), "expect.model"),
    (lambda d: d.update(surprise=1), "surprise"),
    (lambda d: d.pop("property"), "property"),
    (lambda d: d.pop("faults"), "faults"),
    (lambda d: d["config"].update(step_bound="abc"), "config.step_bound"),
    (lambda d: d["faults"].update(evict_before_lookup=[{"chunk": 99}]), "faults.evict_before_lookup[0]"),
    (lambda d: d["faults"].update(lost=[[7, 0]]), "faults.lost[0]"),
])
def test_malformed_file_names_file_and_field(tmp_path, mutate, field):
    """Every malformed field gives a TraceError naming the file and that field."""
    data = _trace().to_json()
    mutate(data)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(data))
    with pytest.raises(TraceError) as info:
        Trace.load(p)
    assert info.value.field == field and str(p) in str(info.value)


def test_not_json_and_missing_file(tmp_path):
    """A non-JSON file and a missing file are TraceErrors naming the file."""
    p = tmp_path / "x.json"
    p.write_text("{nope")
    with pytest.raises(TraceError, match="x.json.*not valid JSON"):
        Trace.load(p)
    with pytest.raises(TraceError, match="cannot read"):
        Trace.load(tmp_path / "missing.json")


def test_hang_trace_records_the_stuck_rank():
    """A hang's trace carries the property and the rank/key in its verdict detail."""
    out = run_case(UnboundedWaitAsync(), Case(1, 1, faults=FaultPlan(lost=[(0, 0)])))
    t = Trace.from_outcome(out, protocol_ref="model.variants:UnboundedWaitAsync")
    assert t.property == "hang" and t.verdict["violations"][0]["detail"]["rank"] == 0



# -- store-ops and concurrent traces: a trace that cannot have shown what it records is refused ---------------
def _store_ops_trace() -> dict:
    return Trace(kind="store-ops", property="store-roundtrip", summary="s", protocol={"name": "-", "ref": None},
                 client="model", config={"n_ranks": 2, "op_timeout": 1.0},
                 ops=[{"rank": 0, "op": "put", "key": "k", "value": encode(b"v")},
                      {"rank": 1, "op": "get_batch", "keys": ["k"]}, {"rank": 0, "op": "get_async", "key": "k",
                                                                      "wait": False}],
                 verdict={"violations": [{"property": "store-roundtrip", "summary": "s", "detail": {"index": 1}}]}
                 ).to_json()


def _concurrent_trace() -> dict:
    return Trace(kind="concurrent", property="linearizability", summary="s", protocol={"name": "-", "ref": None},
                 client="model", config={"n_ranks": 1, "threads": 2, "bound": 1.0,
                                         "rate": {"k": 3, "n": 10, "seeds": [0]}},
                 ops=[{"thread": 0, "path": "put", "keys": ["k0"], "pad": 4},
                      {"thread": 1, "path": "get_batch", "keys": ["k0", "k1"]}],
                 verdict={"violations": [{"property": "linearizability", "summary": "s", "detail": {"op": 1}}]}
                 ).to_json()


@pytest.mark.parametrize("make, mutate, field", [
    (_store_ops_trace, lambda d: d.update(ops=[]), "ops"),
    (_store_ops_trace, lambda d: d["ops"][0].update(rank="0"), "ops[0].rank"),
    (_store_ops_trace, lambda d: d["ops"][0].update(rank=2), "ops[0].rank"),
    (_store_ops_trace, lambda d: d["ops"][0].update(op="fetch"), "ops[0].op"),
    (_store_ops_trace, lambda d: d["ops"][0].update(key=3), "ops[0].key"),
    (_store_ops_trace, lambda d: d["ops"][0].pop("value"), "ops[0].value"),
    (_store_ops_trace, lambda d: d["ops"][0].update(value="abc"), "ops[0].value"),
    (_store_ops_trace, lambda d: d["ops"][0].update(value=[1, 300]), "ops[0].value"),
    (_store_ops_trace, lambda d: d["ops"][1].update(keys=[1]), "ops[1].keys"),
    (_store_ops_trace, lambda d: d["ops"][2].update(wait="no"), "ops[2].wait"),
    (_store_ops_trace, lambda d: d["ops"][0].update(colour="red"), "ops[0].colour"),
    (_store_ops_trace, lambda d: d["config"].update(op_timeout="2"), "config.op_timeout"),
    (_store_ops_trace, lambda d: d["config"].update(rate={"k": 5, "n": 3}), "config.rate"),
    (_store_ops_trace, lambda d: d["verdict"].update(violations=["junk"]), "verdict.violations[0]"),
    (_store_ops_trace, lambda d: d.update(notes=3), "notes"),
    (_concurrent_trace, lambda d: d.update(ops=[]), "ops"),
    (_concurrent_trace, lambda d: d["config"].update(threads="two"), "config.threads"),
    (_concurrent_trace, lambda d: d["config"].update(threads=3), "config.threads"),
    (_concurrent_trace, lambda d: d["ops"][1].update(thread=2), "config.threads"),
    (_concurrent_trace, lambda d: d["ops"][0].update(thread=True), "ops[0].thread"),
    (_concurrent_trace, lambda d: d["ops"][0].update(pad=-1), "ops[0].pad"),
    (_concurrent_trace, lambda d: d["ops"][0].update(keys=["k0", "k1"]), "ops[0].keys"),
    (_concurrent_trace, lambda d: d["ops"][1].update(keys="k0"), "ops[1].keys"),
    (_concurrent_trace, lambda d: d["config"].update(rate={"k": 0, "n": 10, "seeds": []}), "config.rate"),
    (_concurrent_trace, lambda d: d["config"].update(rate={"k": 11, "n": 10, "seeds": []}), "config.rate"),
    (_concurrent_trace, lambda d: d["config"].update(rate={"k": 1.5, "n": 10, "seeds": []}), "config.rate"),
    (_concurrent_trace, lambda d: d["config"]["rate"].update(seeds="0"), "config.rate.seeds"),
    (_concurrent_trace, lambda d: d["config"].update(bound=0), "config.bound"),
    (_concurrent_trace, lambda d: d["config"].update(n_ranks=2), "config.n_ranks"),
])
def test_op_traces_that_cannot_have_shown_their_violation_are_refused(tmp_path, make, mutate, field):
    """No ops, a wrong type in any op or config field, a rate that is not a rate, a thread count that disagrees
    with the ops: a TraceError naming the field."""
    data = make()
    Trace.from_json(json.loads(json.dumps(data)))  # the unmutated trace is fine
    mutate(data)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(data))
    with pytest.raises(TraceError) as info:
        Trace.load(p)
    assert info.value.field == field, str(info.value)


def test_a_factory_failure_needs_no_ops():
    """A store-error of building the client (detail index -1) is the one store-ops trace with no ops."""
    data = _store_ops_trace()
    data.update(ops=[], property="store-error",
                verdict={"violations": [{"property": "store-error", "summary": "s", "detail": {"index": -1}}]})
    assert Trace.from_json(data).ops == []
