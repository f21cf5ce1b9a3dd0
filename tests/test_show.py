"""`shardcheck show`: the terminal timeline and the SVG sequence diagram of a trace."""
from __future__ import annotations

import concurrent.futures
import hashlib
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import ClassVar

import attrs
import pytest

from model.effects import TIMED_OUT
from model.faults import Eviction, FaultPlan
from model.harness import Case, run_case
from model.protocols import PaperProtocol, PaperProtocolAsync
from model.store import MemoryStore
from checking.storeops import run_ops
from model.trace import Trace, encode
from model.variants import (DEMO_VARIANTS, EarlyExitOnMiss, RetryUntilPresent, SkipEmptyGather, UnboundedWaitAsync,
                            WrongAsyncKey)
from shardcheck.show import show_command, svg, timeline

SVG_NS = "{http://www.w3.org/2000/svg}"
COUNTEREXAMPLES = Path(__file__).resolve().parent.parent / "counterexamples"


def _trace(protocol, case: Case) -> Trace:
    outcome = run_case(protocol, case)
    return Trace.from_outcome(outcome, protocol_ref=f"model.variants.{type(protocol).__name__}")


@pytest.fixture(scope="module")
def hang() -> Trace:
    """Rank 1's first async completion is lost and it waits with no timeout."""
    return _trace(UnboundedWaitAsync(), Case(2, 3, faults=FaultPlan(lost=[(1, 0)])))


@pytest.fixture(scope="module")
def hang1() -> Trace:
    """The one-rank hang of the brief."""
    return _trace(UnboundedWaitAsync(), Case(1, 1, faults=FaultPlan(lost=[(0, 0)])))


@pytest.fixture(scope="module")
def desync() -> Trace:
    """Chunk 0 is evicted before rank 0 reads it: rank 0 skips the AllReduceMin."""
    return _trace(EarlyExitOnMiss(), Case(2, 1, faults=FaultPlan(evict_during_load=[Eviction(0, step=0)])))


@pytest.fixture(scope="module")
def deadlock() -> Trace:
    """Rank 1 owns no chunk below the plan and skips the AllGather."""
    return _trace(SkipEmptyGather(), Case(2, 1))


@pytest.fixture(scope="module")
def held() -> Trace:
    """A clean run of the paper's protocol."""
    return _trace(PaperProtocol(), Case(2, 3))


def _store_ops_trace() -> Trace:
    return Trace(kind="store-ops", property="hang", summary="rank 1: get_async never completed",
                 protocol={"name": "lmcache-client", "ref": None}, client="lmcache", config={"n_ranks": 2},
                 ops=[{"rank": 0, "op": "put", "key": "kv:aa:r0", "value": encode(b"x" * 23), "elapsed": 0.002},
                      {"rank": 1, "op": "put", "key": "kv:bb:r1", "value": encode(b"y" * 10)},
                      {"rank": 0, "op": "get", "key": "kv:aa:r0", "result": encode(b"x" * 23)},
                      {"rank": 1, "op": "get", "key": "kv:zz:r1", "result": None},
                      {"rank": 1, "op": "wait", "key": "kv:bb:r1", "result": encode(TIMED_OUT), "timeout": 1.0},
                      {"rank": 1, "op": "get_async", "key": "kv:bb:r1", "hung": True}],
                 verdict={"violations": [{"property": "hang", "summary": "rank 1: get_async never completed",
                                          "detail": {"rank": 1, "key": "kv:bb:r1"}}]})


class _StuckAsyncStore(MemoryStore):
    """A store whose async GET never completes."""

    def get_async(self, key: str) -> concurrent.futures.Future:
        return concurrent.futures.Future()


def _replayed_ops_trace() -> Trace:
    """A store-ops trace as `checking.storeops.run_ops` records it: rank 1's get_async times out."""
    ops = [{"rank": 0, "op": "put", "key": "a", "value": b"x" * 5}, {"rank": 0, "op": "get", "key": "a"},
           {"rank": 1, "op": "contains", "key": "a"}, {"rank": 1, "op": "get_async", "key": "a"}]
    records, violations = run_ops([MemoryStore(), _StuckAsyncStore()], ops, wait_bound=0.01)
    return Trace(kind="store-ops", property=violations[0].property, summary=violations[0].summary,
                 protocol={"name": "-", "ref": None}, client="stuck", config={"n_ranks": 2},
                 ops=[{k: encode(v) for k, v in rec.items()} for rec in records],
                 verdict={"violations": [{"property": v.property, "summary": v.summary, "detail": encode(v.detail)}
                                         for v in violations]})


def _machine_ops_trace() -> Trace:
    """A store-ops trace as the property tests write it: bare ops, the last one failed, no detail."""
    ops = [{"op": "put", "rank": 0, "key": "k", "value": encode(b"v")}, {"op": "get_async", "rank": 1, "key": "k"},
           {"op": "wait", "rank": 1, "key": "k", "handle": 0}, {"op": "get", "rank": 0, "key": "k"}]
    return Trace(kind="store-ops", property="store-roundtrip", summary="rank 0: get('k') returned None, expected 1 bytes",
                 protocol={"name": "-", "ref": None}, client="x", config={"n_ranks": 2}, ops=ops,
                 verdict={"violations": [{"property": "store-roundtrip", "detail": {},
                                          "summary": "rank 0: get('k') returned None, expected 1 bytes"}]})


def _parse(trace: Trace) -> ET.Element:
    return ET.fromstring(svg(trace))


def _all(root: ET.Element, cls: str) -> list[ET.Element]:
    return [e for e in root.iter() if cls in (e.get("class") or "").split()]


def _lifeline_x(root: ET.Element) -> dict[int, float]:
    return {int(e.get("data-rank")): float(e.get("x1")) for e in _all(root, "lifeline")}


def _text(e: ET.Element) -> str:
    return " ".join("".join(t.itertext()) for t in e.iter(f"{SVG_NS}text"))


# -- the SVG ---------------------------------------------------------------------------------------------
def test_svg_hang_marks_the_hung_rank(hang):
    """A hang is a red mark at the end of the hung rank's lifeline, which stops there."""
    root = _parse(hang)
    xs = _lifeline_x(root)
    assert sorted(xs) == [0, 1]
    first = root.find(".//*[@id='violation']")
    assert first is not None and "violation" in first.get("class") and first.get("data-rank") == "1"
    marks = [e for e in _all(root, "violation") if e.get("data-property") == "hang"]
    assert {e.get("data-rank") for e in marks} == {"1"}
    cross = [p for e in marks for p in e.iter(f"{SVG_NS}path")]
    assert cross and all(p.get("d").startswith(f"M{xs[1] - 9:g},") for p in cross)
    assert any("waits forever" in _text(e) for e in marks)
    lines = {int(e.get("data-rank")): e for e in _all(root, "lifeline")}
    assert float(lines[1].get("y2")) < float(lines[0].get("y2"))  # rank 1's lifeline ends at the hang


def test_svg_one_rank_hang(hang1):
    """The one-rank hang of a lost completion renders with its single lifeline marked."""
    root = _parse(hang1)
    assert list(_lifeline_x(root)) == [0]
    assert root.find(".//*[@id='violation']").get("data-rank") == "0"


def test_svg_desync_marks_the_mismatched_arrivals(desync):
    """The disagreeing arrivals at collective #0 are red, on both ranks' lifelines, and boxed."""
    root = _parse(desync)
    xs = _lifeline_x(root)
    marks = [e for e in _all(root, "violation") if e.get("data-property") == "desync"]
    arrivals = [e for e in marks if list(e.iter(f"{SVG_NS}circle"))]
    assert {e.get("data-rank") for e in arrivals} == {"0", "1"}
    for e in arrivals:
        assert float(next(e.iter(f"{SVG_NS}circle")).get("cx")) == xs[int(e.get("data-rank"))]
    text = " ".join(_text(e) for e in marks)
    assert "AllGather" in text and "AllReduceMin" in text and "mismatch" in text
    assert any(e.get("data-collective") == "0" for e in marks)
    assert "evict c0" in ET.tostring(root, encoding="unicode")


def test_svg_deadlock_draws_the_wait_for_graph(deadlock):
    """The deadlock's wait-for graph is drawn as red arrows from the stuck rank to the rank it waits for."""
    root = _parse(deadlock)
    xs = _lifeline_x(root)
    graph = [e for e in _all(root, "violation") if e.get("data-graph") == "waits-for"]
    assert len(graph) == 1
    arrows = list(graph[0].iter(f"{SVG_NS}path"))
    assert len(arrows) == 1 and arrows[0].get("marker-end") == "url(#arrow-red)"
    start, end = re.findall(r"[-\d.]+,[-\d.]+", arrows[0].get("d"))[0], re.findall(r"[-\d.]+,[-\d.]+",
                                                                                  arrows[0].get("d"))[-1]
    assert float(start.split(",")[0]) == xs[0] and float(end.split(",")[0]) == xs[1]
    assert "rank 0 waits for rank 1" in _text(graph[0])
    completed = [e for e in _all(root, "collective") if e.get("data-collective") == "0"]
    assert completed and root.find(".//*[@id='violation']").get("data-rank") == "0"


def test_svg_held_has_no_violation(held):
    """A clean run has lifelines, both collectives as bands with their results, and no violation mark."""
    root = _parse(held)
    assert sorted(_lifeline_x(root)) == [0, 1]
    assert len(_all(root, "store-lifeline")) == 2
    assert _all(root, "violation") == [] and root.find(".//*[@id='violation']") is None
    bands = {e.get("data-collective") for e in _all(root, "collective")}
    assert bands == {"0", "1"}
    whole = ET.tostring(root, encoding="unicode")
    assert "AllReduceMin complete" in whole and "AllGather complete" in whole and "every property held" in whole


def test_svg_of_store_ops_marks_the_hung_op():
    """A store-ops trace renders its ops on per-rank lifelines with the hung op marked."""
    root = _parse(_store_ops_trace())
    assert sorted(_lifeline_x(root)) == [0, 1]
    marks = _all(root, "violation")
    assert marks and {e.get("data-rank") for e in marks if e.get("data-rank")} == {"1"}
    assert "get_async" in " ".join(_text(e) for e in marks)
    assert "TIMED_OUT" in ET.tostring(root, encoding="unicode")


def test_svg_escapes_every_text():
    """Markup and control characters in a trace's strings give well-formed XML that keeps the text."""
    nasty = "<script>&amp;\"'\x00\x1b[31m]]>"
    t = _store_ops_trace()
    t.summary, t.protocol = nasty, {"name": nasty, "ref": nasty}
    t.ops[0]["key"] = nasty
    t.verdict["violations"][0]["summary"] = nasty
    root = _parse(t)
    whole = "".join(root.itertext())
    assert "<script>&amp;\"'" in whole and "\x1b" not in whole and "\x00" not in whole
    assert "\x1b" not in timeline(t) and "\x00" not in timeline(t)


def test_svg_of_recorded_store_ops():
    """`run_ops` records (outcome, oracle, result) render, the timed-out get_async marked as a hang on rank 1."""
    t = _replayed_ops_trace()
    root = _parse(t)
    first = root.find(".//*[@id='violation']")
    assert first is not None and first.get("data-rank") == "1" and first.get("data-property") == "store-hang"
    text = timeline(t)
    assert "put a 5B -> ok" in text and "get a -> hit 5B" in text and "contains a -> no" in text
    assert re.search(r"!! X get_async a: never returns", text) and re.search(r"^end .*o done .*X HUNG", text, re.M)


def test_svg_of_property_test_store_ops():
    """A property-test trace (bare ops, no detail) marks its last op, on the right rank."""
    t = _machine_ops_trace()
    root = _parse(t)
    first = root.find(".//*[@id='violation']")
    assert first.get("data-rank") == "0" and first.get("data-property") == "store-roundtrip"
    assert "wait h0 k" in timeline(t) and "!! store-roundtrip at op #3 (get k on rank 0):" in timeline(t)


def test_svg_key_consistency_marks_the_read():
    """A read of a key the store path never wrote is marked on that read, on each rank that made it."""
    from model.variants import WrongAsyncKey
    root = _parse(_trace(WrongAsyncKey(), Case(2, 2)))
    marks = [e for e in _all(root, "violation") if e.get("data-property") == "key-consistency" and e.get("data-row")]
    assert {e.get("data-rank") for e in marks} == {"0", "1"}
    assert all("GetAsync" in _text(e) and "unwritten key" in _text(e) for e in marks)


def test_renders_a_loadable_but_odd_trace(tmp_path, deadlock):
    """What `Trace.load` does not check (events, violation details, ranks out of range) never breaks the renderers."""
    data = deadlock.to_json()
    data["events"] = data["events"][:3] + [None, 7, {"rank": 99, "effect": {"$effect": "Get"}}, {"effect": [1]},
                                           {"rank": 0, "effect": {"$evict": {"chunk": 0, "rank": 10 ** 9}},
                                            "note": "evict"}]
    data["lookup"], data["faults"]["lost"] = {"reports": "x"}, []
    data["verdict"]["violations"].append({"property": "deadlock", "detail": {"waits_for": 3, "cycle": 1.5}})
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(data))
    t = Trace.load(path)
    assert "!! deadlock" in timeline(t) and ET.fromstring(svg(t)).find(".//*[@id='violation']") is not None


# -- the timeline ------------------------------------------------------------------------------------------
def test_timeline_hang(hang):
    """The timeline names the hung rank, the op it waits on, and ends its lifeline."""
    text = timeline(hang)
    assert "!! hang: rank 1 waits forever on Wait h0 c1 no timeout" in text
    assert "rank 1's GetAsync #0 completion lost" in text
    assert re.search(r"^end .*waits in #0 .*X HUNG", text, re.M)


def test_timeline_desync(desync):
    """The timeline names the collective and what each rank entered."""
    text = timeline(desync)
    assert "!! desync at collective #0: rank 0 AllGather vs rank 1 AllReduceMin" in text
    assert "Get c0 -> miss" in text and "evict c0 (all stores)" in text


def test_timeline_deadlock(deadlock):
    """The timeline says which rank waits for whom, and that the other finished."""
    text = timeline(deadlock)
    assert "!! deadlock: rank 0 waits in collective #1 for rank 1; rank 1 finished without entering it" in text
    assert "wait-for: rank 0 --waits for--> rank 1 (finished)" in text
    assert "#0 AllReduceMin complete -> 1 (every rank)" in text


def test_timeline_held(held):
    """A clean run has the header, the ops with results, the collectives, and no violation."""
    text = timeline(held)
    assert "!!" not in text and "every property held" in text
    for part in ("protocol paper", "N=2 ranks, K=3 chunks", "reports [3, 3] -> planned 3, LCP 3",
                 "Put c0 23B", "Get c0 -> hit 23B", "#1 AllGather complete"):
        assert part in text
    assert "\x1b" not in text and "\x1b[31m" in timeline(_trace(SkipEmptyGather(), Case(2, 1)), color=True)


def test_timeline_collapses_a_retry_loop():
    """A rank retrying the same missing Get is one row with its count, and the step bound is marked there."""
    t = _trace(RetryUntilPresent(), Case(2, 2, faults=FaultPlan(evict_after_lookup=[Eviction(1)])))
    text = timeline(t)
    assert re.search(r"!! Get c1 -> miss  \(x\d+, to step \d+\)", text)
    assert "still running" in text and len(text.splitlines()) < 60


def test_timeline_fits_120_columns():
    """Every line of every demo variant's timeline fits 120 columns (for up to 4 ranks)."""
    for variant in DEMO_VARIANTS:
        for case in (Case(2, 3), Case(4, 2, faults=FaultPlan(lost=[(1, 0)], evict_during_load=[Eviction(0, step=1)]))):
            text = timeline(_trace(variant(), case))
            assert max(map(len, text.splitlines())) <= 120, variant.__name__


def test_timeline_of_store_ops():
    """A store-ops trace's timeline shows every op, its result, and the hung op."""
    text = timeline(_store_ops_trace())
    assert "put kv:aa:r0 23B -> ok in 0.002s" in text and "get kv:zz:r1 -> miss" in text
    assert "!! X get_async kv:bb:r1" in text and "!! hang: rank 1 never returns from get_async" in text


# -- every variant, every stored counterexample ---------------------------------------------------------
def _generated() -> list[Trace]:
    traces = [_trace(v(), c) for v in DEMO_VARIANTS
              for c in (Case(2, 2), Case(3, 4, faults=FaultPlan(evict_during_load=[Eviction(1, step=1)])))]
    traces.append(_trace(PaperProtocolAsync(), Case(3, 4, faults=FaultPlan(delayed=[(1, 0, 5.0)]))))
    return traces + [_store_ops_trace(), _replayed_ops_trace(), _machine_ops_trace()]


def _check_renders(trace: Trace) -> None:
    """Both renderings mark exactly the properties of the trace's verdict, and nothing when it has none."""
    text, root = timeline(trace), ET.fromstring(svg(trace))
    props = {v["property"] for v in trace.verdict.get("violations")}
    assert text.strip() and ("!!" in text) == bool(props)
    assert len(_all(root, "lifeline")) >= 1
    assert (root.find(".//*[@id='violation']") is not None) == bool(props)
    assert {e.get("data-property") for e in _all(root, "violation")} == props
    assert set(re.findall(r"^!! ([\w-]+)", text, re.M)) == props


def test_every_demo_variant_renders():
    """Each demo variant's trace renders, with a violation mark exactly when its verdict has one."""
    traces = _generated()
    assert sum(bool(t.verdict["violations"]) for t in traces) >= len(DEMO_VARIANTS)
    for t in traces:
        _check_renders(t)


def test_every_stored_counterexample_renders():
    """Every counterexamples/*.json draws a lifeline per rank and marks exactly its verdict's properties."""
    files = sorted(COUNTEREXAMPLES.glob("*.json"))
    assert len(files) >= 20, "the curated corpus is missing: this test must not pass on no files"
    for f in files:
        t = Trace.load(f)
        props = {v["property"] for v in t.verdict["violations"]}
        assert t.property in props, f.name
        _check_renders(t)
        assert len(_all(_parse(t), "lifeline")) == t.config["n_ranks"], f.name
        assert f"verdict  VIOLATED {', '.join(sorted(props))}" in timeline(t), f.name


# -- show_command --------------------------------------------------------------------------------------
def test_show_command_prints_and_writes(tmp_path, capsys, deadlock):
    """`show` prints the timeline, its layer in words under the title, and writes the SVG, overwriting an existing
    OUT."""
    path = deadlock.save(tmp_path / "d.json")
    out = tmp_path / "d.svg"
    out.write_text("old")
    assert show_command(str(path), str(out)) == 0
    head, _, rest = timeline(Trace.load(path)).partition("\n")
    layer = "layer    protocol: a protocol's rank programs over a client's stores, faults injected"
    assert capsys.readouterr().out.startswith(f"{head}\n{layer}\n{rest}")
    assert out.read_text() == svg(Trace.load(path)) and ET.fromstring(out.read_text()) is not None
    assert show_command(str(path), None) == 0


def test_show_command_refuses_a_missing_directory(tmp_path, capsys, deadlock):
    """`--svg` into a directory that does not exist is exit 2 naming it, with nothing printed or written."""
    path = deadlock.save(tmp_path / "d.json")
    assert show_command(str(path), str(tmp_path / "nope" / "d.svg")) == 2
    captured = capsys.readouterr()
    assert str(tmp_path / "nope") in captured.err and captured.out == ""
    assert not (tmp_path / "nope").exists()


def test_show_command_bad_trace(tmp_path, capsys):
    """A malformed trace is exit 2 with the file and the field on stderr."""
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "shardcheck-trace", "version": 1, "kind": "nonsense"}))
    assert show_command(str(bad), None) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "'kind'" in err
    assert show_command(str(tmp_path / "missing.json"), None) == 2


# -- keys in the trace's own format ---------------------------------------------------------------------
@attrs.define(frozen=True)
class _PositionKeys(PaperProtocol):
    """Keys name the chunk's position instead of its prefix hash."""

    name: ClassVar[str] = "position-keys"

    def key(self, chunk: int, chunk_hash: str, rank: int, n_ranks: int) -> str:
        return f"chunk/{chunk}"


@attrs.define(frozen=True)
class _TenantKeys(PaperProtocol):
    """Rank 0 keys chunks under tenant A, every other rank under tenant B."""

    name: ClassVar[str] = "tenant-keys"

    def key(self, chunk: int, chunk_hash: str, rank: int, n_ranks: int) -> str:
        return f"tenant{'A' if rank == 0 else 'B'}|{chunk_hash}"


def _legend(text: str) -> dict[str, str]:
    """The `label = key` entries of a timeline's `keys` header lines."""
    lines = text.split("\nkeys     ", 1)[1].split("\nverdict", 1)[0].splitlines()
    joined = "".join(line.strip() + (" " if line.endswith(";") else "") for line in lines)
    entries = joined.split("; ")
    return dict(e.split(" = ", 1) for e in entries)


def _foreign_ops_trace() -> Trace:
    """A store-ops trace whose keys are long, hashed, and shaped like generated labels."""
    sha = hashlib.sha256(b"prompt").hexdigest()
    keys = [f"tenantA|{sha}", f"tenantB|{sha}", "model=llama-3-70b/layer=12/chunk=0004", "k1", "c0", "short/7"]
    return Trace(kind="store-ops", property="store-roundtrip", summary="-", protocol={"name": "-", "ref": None},
                 client="x", config={"n_ranks": 1}, ops=[{"op": "put", "rank": 0, "key": k} for k in keys],
                 verdict={"violations": []})


def test_position_keys_are_shown_in_full():
    """Short keys of a foreign format (`chunk/<pos>`) are their own labels; the legend claims no `kv:` format."""
    text = timeline(_trace(_PositionKeys(), Case(2, 3)))
    assert "Put chunk/0 23B" in text and "Get chunk/2 -> hit" in text and "has chunk/1? -> yes" in text
    assert _legend(text) == {"hI": "GetAsync handle I"} and "kv:" not in text


def test_hashed_keys_of_a_foreign_format_are_chunk_labels():
    """`tenantX|<chunk hash>` keys are `cI` per template, and the legend gives each template in full."""
    t = _trace(_TenantKeys(), Case(2, 3))
    text = timeline(t)
    assert _legend(text) == {"cI": "tenantA|<hash of chunk I>", "cIa": "tenantB|<hash of chunk I>",
                             "hI": "GetAsync handle I"}
    assert re.search(r"^store .*\| Put c0 23B", text, re.M) and re.search(r"\| Put c1a 28B", text)
    assert "kv:" not in text and "tenantB|&lt;hash of chunk I&gt;" in svg(t)


def test_reference_keys_keep_the_rank_template():
    """The reference keys of two ranks share one template with `<rank>`; one rank's keys are named in full."""
    assert _legend(timeline(_trace(PaperProtocol(), Case(2, 3))))["cI"] == "kv:<hash of chunk I>:pcp2:r<rank>"
    assert _legend(timeline(_trace(PaperProtocol(), Case(2, 1))))["cI"] == "kv:<hash of chunk I>:pcp2:r0"


def test_wrong_key_gets_its_own_label():
    """A read of a key the store path never wrote gets a label of its own, so it cannot pass for the written one."""
    text = timeline(_trace(WrongAsyncKey(), Case(2, 2)))
    assert _legend(text)["cIa"] == "kv:<hash of chunk I>:pcp2" and "GetAsync c0a -> h0 <- unwritten key" in text


def test_long_foreign_keys_map_back_to_their_keys():
    """Every op's label in a store-ops trace with long foreign keys maps back, through the legend, to its own key."""
    t = _foreign_ops_trace()
    text = timeline(t)
    legend = _legend(text)
    labels = [re.search(rf"^ops +{i} +\| put (\S+) -> ok", text, re.M).group(1) for i in range(len(t.ops))]
    assert [legend.get(label, label) for label in labels] == [op["key"] for op in t.ops]
    assert len(set(labels)) == len(labels) and max(map(len, labels)) <= 18
    assert labels[:2] == [f"tenantA|{t.ops[0]['key'][8:12]}..", f"tenantB|{t.ops[1]['key'][8:12]}.."]
    assert labels[5] == "short/7" and labels[3] != "k1" and labels[4] != "c0"


def test_a_concurrent_history_is_drawn_as_lanes_with_its_pending_and_unplaceable_ops():
    """A racy trace shows one lane per caller, its never-completed op, its linearizable prefix and its X op."""
    from pathlib import Path
    from shardcheck.show.history_view import history_svg, history_timeline
    corpus = Path(__file__).resolve().parents[1] / "counterexamples"
    lost = Trace.load(corpus / "lmcache-sync-prefix-count-lost-completion.json")
    text = history_timeline(lost)
    assert text.count("<-- never completed") == 1 and "rate     shown in" in text
    stale = Trace.load(corpus / "lmcache-put-dropped-while-in-flight.json")
    text = history_timeline(stale)
    assert text.count("<-- cannot be placed") == 1 and "linearizable prefix (+)" in text
    assert len({line.split()[0] for line in text.splitlines() if line.startswith("t")}) == 6  # six callers' lanes
    root = ET.fromstring(history_svg(stale))
    rects = [e for e in root.iter() if e.tag.endswith("rect")]
    assert sum("unplaceable" in r.get("class", "") for r in rects) == 1
    assert sum("pending" in r.get("class", "") for r in ET.fromstring(history_svg(lost)).iter()
               if r.tag.endswith("rect")) == 1


def test_a_concurrent_svg_labels_every_op_with_its_call_and_result():
    """Each op of a concurrent history has a visible label (not only a tooltip) with its call and what its caller
    got, also for traces whose recorded picture predates the outcomes (taken from the recorded history)."""
    from pathlib import Path
    from shardcheck.show.history_view import history_svg, history_timeline
    corpus = Path(__file__).resolve().parents[1] / "counterexamples"
    for name in ("lmcache-put-dropped-while-in-flight.json", "lmcache-sync-prefix-count-lost-completion.json"):
        trace = Trace.load(corpus / name)
        root = ET.fromstring(history_svg(trace))
        labels = [e.text for e in root.iter() if e.tag.endswith("text") and e.get("class") == "label"]
        assert len(labels) == len(trace.verdict["history"])
        assert all(re.search(r"\w+\(.+\) (-> |never completed|raised )", text) for text in labels), labels
        assert any(text.endswith("-> False") for text in labels) or any("never completed" in t for t in labels)
        width = float(root.get("width"))
        assert all(float(e.get("x")) + 6.6 * len(e.text) <= width for e in root.iter() if e.get("class") == "label")
        assert all(label in history_timeline(trace).replace("  <--", "") or len(label) > 72 for label in labels)
