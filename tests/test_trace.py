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

