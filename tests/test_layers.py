"""The layers under test as one table (`checking.layers.LAYERS`): every trace kind has its row, and a new layer is
a kind and a row — `check` minimises, measures, reports and saves its findings and `replay` judges its traces
through that row alone."""
from __future__ import annotations

import contextlib
import sys
import types

import attrs
import pytest

from checking import layers as layers_mod
from checking.api import SearchContext, Target
from checking.layers import LAYERS, SUBJECTS, Layer, ReplayError, ReplayOn, layer_of
from checking.replay import judge
from model.finding import Finding
from model.outcome import Violation
from model.trace import KINDS, Trace
from runtime.registry import CHECK_SCHEDULE
from shardcheck.tables import STRATEGIES


def test_every_trace_kind_is_one_layer():
    """One row per trace kind, in `model.trace.KINDS`' order, each with a session and a subject of `SUBJECTS`."""
    assert tuple(LAYERS) == KINDS
    for kind, layer in LAYERS.items():
        assert layer.kind == kind and layer.subject in SUBJECTS and callable(layer.session) and layer.what


def test_a_kind_without_a_layer_is_a_replay_error():
    trace = Trace(kind="nothing", property="p", summary="", protocol={}, client="model", config={})
    with pytest.raises(ReplayError, match="cannot replay a 'nothing' trace here"):
        layer_of(trace)


def test_a_finding_is_saved_under_its_layers_subject():
    """A protocol finding under the protocol's name, a client layer's under the client's, a serving one's under the
    engine's."""
    named = lambda name: types.SimpleNamespace(name=name)  # noqa: E731
    target = Target(protocol=named("paper"), client=named("model"), engine=named("lmcache"))
    assert [LAYERS[k].saved_under(target) for k in KINDS] == ["paper", "model", "model", "lmcache", "lmcache"]


def test_only_the_simulator_over_memory_is_deterministic():
    memory = types.SimpleNamespace(in_memory=True)
    real = types.SimpleNamespace(in_memory=False)
    assert LAYERS["protocol"].deterministic(ReplayOn(client=memory))
    assert LAYERS["store-ops"].deterministic(ReplayOn(client=memory))
    assert not LAYERS["store-ops"].deterministic(ReplayOn(client=memory, runner_name="processes"))
    assert not LAYERS["protocol"].deterministic(ReplayOn(client=real))
    assert not LAYERS["concurrent"].deterministic(ReplayOn(client=memory))
    assert not LAYERS["engine"].deterministic(ReplayOn())


# -- a toy layer: a kind and a row, nothing else -----------------------------------------------------------------------
def _toy_trace(n: int) -> Trace:
    return Trace.of("toy", [Violation("soundness", "a toy violation")], summary=f"{n} toy steps", client="model",
                    config={"steps": n})


class _ToyStrategy:
    """Finds a toy trace of 8 steps on its first try."""

    name = "toy"

    def search(self, ctx: SearchContext) -> Finding | None:
        return Finding(self.name, [Violation("soundness", "a toy violation")], _toy_trace(8))


@contextlib.contextmanager
def _toy_session(trace: Trace, on: ReplayOn):
    """Shows the property while the trace has at least 3 steps."""
    yield lambda: ([Violation("soundness", "toy")] if trace.config["steps"] >= 3 else [], "")


def _toy_minimise(ctx: SearchContext, finding: Finding, stop) -> Finding:
    smallest = 3
    return attrs.evolve(finding, trace=_toy_trace(smallest), notes=[*finding.notes, "toy-minimised to 3"])


@pytest.fixture
def toy_layer(monkeypatch):
    module = types.ModuleType("toy_layer_strategy")
    module.ToyStrategy = _ToyStrategy
    monkeypatch.setitem(sys.modules, "toy_layer_strategy", module)
    monkeypatch.setitem(STRATEGIES, "toy", "toy_layer_strategy:ToyStrategy")
    monkeypatch.setitem(CHECK_SCHEDULE, "in-memory", (("toy", "rest"),))
    monkeypatch.setitem(layers_mod.LAYERS, "toy", Layer(
        kind="toy", what="a toy", subject="client", session=_toy_session, minimise=_toy_minimise,
        stats=lambda f: {"steps": f.trace.config["steps"]}))


def test_a_new_layer_is_a_kind_and_one_row(toy_layer, tmp_path):
    """`check` minimises its finding by the row's minimiser, measures it by the row's session, reports the row's
    stats and saves it under the row's subject; `replay` judges its trace by the row's session."""
    from shardcheck.check_cmd import run_check
    result = run_check(None, None, budget=3.0, out_dir=str(tmp_path))
    ce = result["stats"]["counterexample"]
    assert result["verdict"] == "violated" and ce["kind"] == "toy" and ce["steps"] == 3
    assert "toy-minimised to 3" in ce["notes"] and ce["rate"]["k"] >= 1
    (saved,) = tmp_path.iterdir()
    assert saved.name.startswith("model-")
    assert judge(_toy_trace(3), ReplayOn()).outcome == "reproduces"
    assert judge(_toy_trace(2), ReplayOn()).outcome == "fixed"


# -- the case of every layer ------------------------------------------------------------------------------------------
def _cases() -> list:
    """(name, kind, case) of every curated corpus trace, and of generated stack cases (the corpus has none)."""
    import random
    from pathlib import Path
    from checking.serving.stack_cases import stack_random_case
    root = Path(__file__).resolve().parent.parent / "counterexamples"
    out = [(str(p.relative_to(root)), t.kind, t.case()) for p in sorted(root.rglob("*.json"))
           if "found" not in p.parts for t in [Trace.load(p)]]
    rng = random.Random(0)
    return out + [(f"stack-{i}", "stack", stack_random_case(rng, 2)) for i in range(8)]


def test_every_layers_case_is_rebuilt_from_its_parts():
    """What the one delta-debugging shrinker asks of every layer's case (`Layer.codec`): all its parts rebuild the
    case itself, and each part fewer a case with one part fewer; every kind is covered."""
    seen = set()
    for name, kind, case in _cases():
        codec = LAYERS[kind].codec
        assert codec.kind == kind
        parts = codec.parts(case)
        assert codec.rebuild(case, parts) == case, name
        for i in range(len(parts)):
            assert len(codec.parts(codec.rebuild(case, parts[:i] + parts[i + 1:]))) == len(parts) - 1, (name, i)
        seen.add(kind)
    assert seen == set(KINDS)


def test_a_trace_reads_its_kinds_case():
    """`Trace.case()` is the codec's `read`: a typed case for every kind."""
    from model.concurrent_case import Layout
    from model.engine_case import EngineCase
    from model.harness import Case
    types_of = {"protocol": Case, "store-ops": list, "concurrent": Layout, "engine": EngineCase}
    for name, kind, case in _cases():
        if kind in types_of:
            assert isinstance(case, types_of[kind]), name


def test_a_findings_case_is_its_traces_unless_given():
    """One `Finding(case, violations, rate)` for every layer: a finding with no case given has its trace's, and a
    minimiser that replaces the trace replaces the case with it."""
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent / "counterexamples"
    trace = Trace.load(root / "lmcache-missing-get-hangs.json")
    finding = Finding(strategy="scenarios", violations=[Violation("store-hang", "s")], trace=trace)
    assert finding.case == list(trace.ops) and finding.case
    shorter = attrs.evolve(trace, ops=trace.ops[-1:])
    assert attrs.evolve(finding, trace=shorter).case == list(shorter.ops)
    assert attrs.evolve(finding, case=["given"]).case == ["given"]
