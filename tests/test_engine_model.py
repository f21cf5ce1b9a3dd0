"""The engine layer's pure parts: engine cases as data, the oracle's checks, the engine trace kind, the case
generators and the case minimiser (no engine runs here)."""
import json
import random

import attrs
import pytest

from checking.serving.engine_cases import enumeration, random_case, recurring
from checking.serving.serving_minimise import minimise_case
from model.contract import EngineRetrieve
from model.engine_case import CaseError, EngineCase, EnginePrompt, Step, case_from_json, kv_identity, prompt_tokens
from model.engine_oracle import Ledger, RankView, check_lookup, check_pins, check_retrieve, kv_bytes
from model.trace import Trace, TraceError


def _case(**changes):
    return attrs.evolve(recurring(2, "async"), **changes)


def test_case_json_round_trip_and_field_errors():
    """A case survives JSON; a malformed one names the field that is wrong."""
    case = _case()
    assert case_from_json(json.loads(json.dumps(case.to_json()))) == case
    bad = [({"steps": [{"kind": "jump"}]}, "steps[0].kind"),
           ({"steps": [{"kind": "evict", "prompt": "p0", "rank": 5, "chunk": 0, "tier": "local"}]}, "steps[0].rank"),
           ({"steps": [{"kind": "evict", "prompt": "p0", "rank": 0, "chunk": 0, "tier": "disk"}]}, "steps[0].tier"),
           ({"steps": [{"kind": "retrieve", "request": "q9"}]}, "steps[0].request"),
           ({"prompts": [{"name": "p0", "chunks": -1}]}, "prompts[0].chunks"),
           ({"lookup": "sometimes"}, "lookup"), ({"colour": 1}, "colour")]
    for change, field in bad:
        with pytest.raises(CaseError) as exc:
            case_from_json({**case.to_json(), **change})
        assert exc.value.field == field, (change, exc.value)


def test_vllm_order_is_required():
    """Steps vLLM would never take are inconsistent: a request looked up again after it ended, a sync lookup left
    in flight."""
    steps = recurring(1, "async").steps + (Step(kind="retrieve", request="q1"),)
    assert any("ended before" in p for _, p in _case(steps=steps).problems()), steps
    sync = EngineCase(n_ranks=1, lookup="sync", prompts=(EnginePrompt(name="p0", chunks=1),),
                      steps=(Step(kind="lookup", request="q1", prompt="p0", wait=False),))
    assert ("steps[0].wait", "only an async lookup can be left in flight") in sync.problems()


def test_tokens_and_identities():
    """Shared prefixes share tokens and KV identities; a tenant or adapter changes the identity, not the tokens; an
    image fills chunk 0's placeholder span; a salt gives a run its own token space."""
    p0 = EnginePrompt(name="p0", chunks=3)
    p1 = EnginePrompt(name="p1", chunks=3, stem="p0", shared=2)
    p2 = EnginePrompt(name="p2", chunks=3, stem="p0", shared=3, adapter="a2")
    p3 = EnginePrompt(name="p3", chunks=3, stem="p0", shared=3, image="i3")
    case = EngineCase(n_ranks=1, prompts=(p0, p1, p2, p3))
    t = {p.name: prompt_tokens(case, p, 8) for p in case.prompts}
    assert t["p0"][:16] == t["p1"][:16] and t["p0"][16:] != t["p1"][16:] and t["p2"] == t["p0"]
    assert t["p3"][1:7] == [7] * 6 and t["p3"][8:] == t["p0"][8:]
    assert prompt_tokens(case, p0, 8, "other-") != t["p0"]
    assert kv_identity(case, p1, 1) == kv_identity(case, p0, 1) != kv_identity(case, p1, 2)
    assert kv_identity(case, p2, 0) != kv_identity(case, p0, 0)
    assert kv_bytes(kv_identity(case, p0, 0), 0, 0, 2, 256) != kv_bytes(kv_identity(case, p0, 0), 1, 0, 2, 256)


def test_lookup_checks():
    """Above what every rank holds: soundness; above what holds this request's KV: isolation; below what every rank
    held throughout with nothing failed: completeness (not when something failed)."""
    views = [RankView(own_lo=2, own_hi=2, any_hi=3), RankView(own_lo=3, own_hi=3, any_hi=3)]
    kw = dict(request="q1", prompt="p0")
    assert check_lookup(16, views, 8, failed="", **kw) == []
    assert [v.property for v in check_lookup(24, views, 8, failed="", **kw)] == ["engine-isolation"]
    assert [v.property for v in check_lookup(32, views, 8, failed="", **kw)] == ["engine-soundness"]
    assert [v.property for v in check_lookup(8, views, 8, failed="", **kw)] == ["engine-completeness"]
    assert check_lookup(8, views, 8, failed="a server could not be reached", **kw) == []
    assert [v.property for v in check_lookup(None, views, 8, failed="", **kw)] == ["engine-returns"]


def test_retrieve_checks():
    """Freed memory, another request's bytes, wrong bytes, a gap, fewer chunks with nothing disturbed: each caught."""
    ledger = Ledger()
    mine, theirs = [b"a" * 4, b"b" * 4], [b"x" * 4, b"y" * 4]
    ledger.stored(0, ["k0", "k1"], [("m", "", "", "", ("p1",))] * 2, theirs, "p1")
    kw = dict(chunk_size=8, request="q1", prompt="p0")

    def props(got, disturbed=""):
        return [v.property for v in check_retrieve(0, 2, got, mine, ledger, disturbed=disturbed, **kw)]
    assert props(EngineRetrieve(retrieved=16, chunks=mine)) == []
    assert props(EngineRetrieve(retrieved=16, chunks=mine, freed=[{"chunk": 0, "bytes": b"x" * 4}])) == [
        "engine-integrity"]
    assert props(EngineRetrieve(retrieved=16, chunks=[mine[0], theirs[1]])) == ["engine-isolation"]
    assert props(EngineRetrieve(retrieved=16, chunks=[mine[0], b"z" * 4])) == ["engine-integrity"]
    assert props(EngineRetrieve(retrieved=8, chunks=[None, mine[1]])) == ["engine-integrity"]
    assert props(EngineRetrieve(retrieved=8, chunks=[mine[0], None])) == ["engine-integrity"]
    assert props(EngineRetrieve(retrieved=8, chunks=[mine[0], None]), disturbed="an eviction") == []
    assert check_pins([0, 0], when="now") == [] and check_pins([0, 2], when="now")[0].detail["pins"] == {"1": 2}


def test_engine_trace_kind_is_validated():
    """An engine trace's case, rate, options and patches are checked, each problem naming its field."""
    good = Trace(kind="engine", property="pins", summary="x" * 50, protocol={"name": "-", "ref": None}, client="-",
                 config={"engine": "lmcache", "case": _case().to_json(), "rate": {"k": 1, "n": 2}, "options": {},
                         "patches": []}, expect={"lmcache": "reproduces"})
    assert Trace.from_json(json.loads(good.dumps())).config == good.config
    for change, field in [({"case": {**_case().to_json(), "n_ranks": 0}}, "config.case.n_ranks"),
                          ({"case": {**_case().to_json(), "steps": [{"kind": "end", "request": ""}]}},
                           "config.case.steps[0].request"),
                          ({"rate": {"k": 3, "n": 2}}, "config.rate"), ({"patches": ["nocolon"]}, "config.patches"),
                          ({"engine": ""}, "config.engine")]:
        data = json.loads(good.dumps())
        data["config"].update(change)
        with pytest.raises(TraceError) as exc:
            Trace.from_json(data)
        assert exc.value.field == field, (change, str(exc.value))


def test_generated_cases_are_consistent():
    """Every enumerated case and every seeded random case is one vLLM could drive (no problems), and a seed gives
    the same case again."""
    for _, (origin, case) in zip(range(400), enumeration(3, ("sync", "async"))):
        assert not case.problems(), (origin, case.problems())
    for seed in range(300):
        rng = random.Random(seed)
        case = random_case(rng, 1 + seed % 3, ("sync", "async")[seed % 2])
        assert not case.problems(), (seed, case.problems())
    assert random_case(random.Random(7), 2, "async") == random_case(random.Random(7), 2, "async")


def test_a_request_looked_up_again_comes_among_the_first_cases_of_every_shape():
    """Every (ranks, lookup) shape's first cases look one request id up again after the tier changed under it
    (before and after its prompt is stored; before and after a chunk of it is evicted), right after the recurring
    episode: a client that memoises its answer per request id is found in the first cases, not at case ~100."""
    from checking.serving.engine_cases import FIRST_CASES
    cases = list(zip(range(4 * 2 * FIRST_CASES), enumeration(4, ("sync", "async"))))
    for start in range(0, len(cases), FIRST_CASES):
        origins = [origin for _, (origin, _) in cases[start:start + FIRST_CASES]]
        assert origins[:3] == ["recurring", "recurring-request-grows", "recurring-request-shrinks"], origins
    grows = dict(item for _, item in cases[:FIRST_CASES])["recurring-request-grows"]
    kinds = [(s.kind, s.request) for s in grows.steps]
    assert kinds[:3] == [("lookup", "q1"), ("store", ""), ("lookup", "q1")] and not grows.problems()


def test_minimise_case_drops_what_is_not_needed():
    """Fewest ranks, then steps, then chunks, then unused prompts, keeping the failure (a pure predicate here)."""
    case = EngineCase(n_ranks=3, lookup="async", prompts=(EnginePrompt(name="p0", chunks=3),
                                                        EnginePrompt(name="p1", chunks=2)),
                      steps=recurring(3, "async").steps + (Step(kind="evict", prompt="p0", rank=2, chunk=2,
                                                                  tier="local"),))

    def fails(c):  # the 'bug': a retrieve after a store of p0, whatever else
        kinds = [s.kind for s in c.steps]
        return "store" in kinds and "retrieve" in kinds and kinds.index("store") < kinds.index("retrieve")
    small = minimise_case(fails, case, lambda: False, kind="engine")
    assert small.n_ranks == 1 and [s.kind for s in small.steps] == ["store", "lookup", "retrieve"]
    assert {p.name for p in small.prompts} == {s.prompt for s in small.steps if s.prompt}
    assert all(p.chunks == 1 for p in small.prompts) and not small.problems()


@pytest.mark.parametrize("shows,saved", [(True, (11, 12)), (False, None)])
def test_regen_engine_measures_a_rare_race_further_and_does_not_save_one_it_cannot_clear(monkeypatch, shows, saved):
    """A finding whose rate asks a replay for more than ENGINE_MAX_RUNS runs is measured up to FIRM_RUNS runs;
    one that still asks for more is not saved, and progress says why."""
    import checking.serving.engine_search as search
    from checking.serving.engine_run import EngineOutcome
    from checking.serving.engine_search import TraceSubject, engine_finding
    from model.finding import Rate
    from model.outcome import Violation
    from shardcheck.engine_findings import FIRM_RUNS, _firm_rate
    monkeypatch.setattr(search, "measure_rate", lambda make, case, prop, runs, **kw: (runs if shows else 0, runs, None))
    said: list[str] = []
    subject = TraceSubject(engine="lmcache")
    bad = [Violation("engine-completeness", "q0 was not loaded", {})]
    found = engine_finding(subject, "regen engine", _case(), EngineOutcome(_case(), bad, [], 0.0), bad, Rate(1, 2),
                           "random:0:1")
    got = _firm_rate(found, make=None, subject=subject, progress=said.append)
    if saved is None:
        assert got is None and f"showed in 1 of {FIRM_RUNS} runs" in said[0]
    else:
        assert (got.rate.k, got.rate.n) == saved and not said
        assert got.trace.config["rate"]["n"] == saved[1] and f"in {saved[0]} of {saved[1]} runs" in got.trace.summary


def test_regen_engine_keeps_a_saved_trace_whose_rate_asks_for_fewer_runs(tmp_path):
    """A hand-forced race saved at 30/30 is not overwritten by the search's racier finding of the same property."""
    from shardcheck.engine_findings import ENGINE_CORPUS, _better_on_disk
    saved = Trace.load(ENGINE_CORPUS / "lmcache-async-pins-random.json")
    path = saved.save(tmp_path / "t.json")
    racier = attrs.evolve(saved, config={**saved.config, "rate": {"k": 11, "n": 12}})
    as_good = attrs.evolve(saved, config={**saved.config, "rate": {"k": 5, "n": 5}})
    other = attrs.evolve(racier, property="engine-returns")
    assert "asks a replay for 10 clean runs" in _better_on_disk(path, racier)
    assert _better_on_disk(path, as_good) == _better_on_disk(path, other) == ""
    assert _better_on_disk(tmp_path / "none.json", racier) == ""
