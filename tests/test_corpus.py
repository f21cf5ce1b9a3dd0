"""The counterexample corpus: no drift, every trace reproduces on the model, every trace is minimal."""
import attrs
import pytest

from model.harness import run_case
from model.faults import FAULT_FIELDS
from model.trace import Trace
from shardcheck.commands import protocol_of
from shardcheck.corpus import CORPUS, without_real, demo_traces
from tests.conftest import run_cli

PROTOCOL_TRACES = sorted(p for p in CORPUS.glob("*.json") if Trace.load(p).kind == "protocol")


def test_corpus_has_every_demo_variant_and_no_drift():
    """Every demo variant's shrunk counterexample is saved and equals what the model produces now (the
    real clients' measured expectations are checked by replaying them, in test_real_replay)."""
    for name, trace in demo_traces().items():
        path = CORPUS / name
        assert path.exists(), f"{name} missing: run shardcheck regen corpus"
        assert without_real(Trace.load(path)) == without_real(trace), \
            f"{name} drifted: run shardcheck regen corpus"


def test_every_trace_has_summary_and_expectations():
    """Every saved trace names a catalogued property, has a human summary and an expectation for the model."""
    from model.checks import BY_NAME
    paths = sorted(CORPUS.glob("*.json"))
    kinds = {p.name.split("-")[0] for p in paths}
    assert len(paths) >= len(demo_traces()) and kinds >= {"demo", "z3", "lmcache"}, kinds
    for p in paths:
        t = Trace.load(p)
        assert t.property in BY_NAME and len(t.summary) > 40 and "model" in t.expect, p


def test_engine_traces_ask_for_a_replay_verify_can_afford():
    """Every saved engine trace's rate asks for at most `ENGINE_MAX_RUNS` clean runs of a real deployment: a replay
    never stops short of its 99% (a capped `fixed` was false once), so a racy one must be re-measured instead."""
    from checking.layers import ReplayOn
    from checking.replay import ENGINE_MAX_RUNS, clean_runs
    from shardcheck.engine_findings import ENGINE_CORPUS
    paths = sorted(ENGINE_CORPUS.glob("*.json"))
    asks = {p.name: clean_runs(Trace.load(p), ReplayOn())[0] for p in paths}
    assert paths and all(1 <= n <= ENGINE_MAX_RUNS for n in asks.values()), asks


def test_an_engine_replay_is_never_capped():
    """An engine trace of a rare race asks for its whole 99% count, however many real deployments that takes."""
    from checking.layers import ReplayOn
    from checking.replay import ENGINE_MAX_RUNS, clean_runs
    from model.finding import Rate
    from shardcheck.engine_findings import ENGINE_CORPUS
    trace = Trace.load(sorted(ENGINE_CORPUS.glob("*.json"))[0])
    trace = attrs.evolve(trace, config={**trace.config, "rate": {"k": 2, "n": 9}})
    need, why = clean_runs(trace, ReplayOn())
    assert need == Rate(2, 9).runs_to_clear() > ENGINE_MAX_RUNS and "2/9" in why


def _reproduces(trace, case):
    protocol = protocol_of(trace.protocol["ref"]).obj
    return trace.property in run_case(protocol, case).violated()


@pytest.mark.parametrize("path", PROTOCOL_TRACES, ids=lambda p: p.name)
def test_protocol_trace_is_minimal(path):
    """Dropping any single fault, a rank or a chunk of a saved counterexample loses the violation."""
    t = Trace.load(path)
    case = attrs.evolve(t.case(), schedule=())
    assert _reproduces(t, case)
    for field in FAULT_FIELDS:
        for i in range(len(getattr(case.faults, field))):
            assert not _reproduces(t, attrs.evolve(case, faults=case.faults.without(field, i))), (field, i)
    if case.n_ranks > 1:
        assert not _reproduces(t, attrs.evolve(case, n_ranks=case.n_ranks - 1))
    if case.n_chunks > 0:
        smaller = attrs.evolve(case, n_chunks=case.n_chunks - 1, faults=attrs.evolve(
            case.faults, **{f: tuple(e for e in getattr(case.faults, f) if e.chunk < case.n_chunks - 1)
                            for f in ("evict_before_lookup", "evict_after_lookup", "evict_during_load")}))
        assert not _reproduces(t, smaller)


@pytest.mark.real
def test_replay_expect_model_client():
    """`shardcheck replay counterexamples/ --expect` passes for the model client (the racy traces of real clients run
    their recorded client beside it, the control: real Valkey)."""
    r = run_cli("replay", str(CORPUS), "--expect", "--client", "model", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
