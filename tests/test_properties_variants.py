"""The protocol layer can fail: it catches every demo variant, and each written trace replays its violation."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings

from model.harness import run_case
from model.protocols import REFERENCE_PROTOCOLS
from model.trace import Trace
from model.variants import DEMO_VARIANTS, ByteOffByOne
from properties.machine_search import caught
from properties.machines import ProtocolMachine

#: Derandomized, no database: the same search every run. Finding is quick; shrinking (seconds per variant) is
#: left to `test_shrunk_counterexample_replays` so the whole file stays fast.
FIND = settings(max_examples=400, stateful_step_count=25, derandomize=True, deadline=None,
                phases=(Phase.generate,), report_multiple_bugs=False, suppress_health_check=list(HealthCheck))


def _caught(protocol, found_dir, how=FIND) -> set[str]:
    return caught(ProtocolMachine, how, protocol=protocol, client=None, found_dir=found_dir)


@pytest.mark.parametrize("variant", list(DEMO_VARIANTS), ids=lambda v: v.__name__)
def test_protocol_layer_catches_variant(variant, tmp_path):
    """The machine fails on the variant with its property named, and the trace it writes leads with it (its first
    violation) and replays to it."""
    prop = DEMO_VARIANTS[variant]
    assert prop in _caught(variant(), tmp_path)
    traces = [Trace.load(path) for path in tmp_path.glob("*.json")]
    assert [t.property for t in traces] == [prop]
    assert run_case(variant(), traces[0].case()).violations[0].property == prop


def test_shrunk_counterexample_replays(tmp_path):
    """With shrinking on, the minimal failing episode is small and its trace still replays to the violation."""
    shrink = settings(FIND, phases=(Phase.generate, Phase.shrink))
    assert "integrity" in _caught(ByteOffByOne(), tmp_path, shrink)
    (path,) = tmp_path.glob("*.json")
    assert path.name.startswith("byte-off-by-one-integrity-")
    trace = Trace.load(path)
    assert (trace.config["n_ranks"], trace.config["n_chunks"]) == (1, 1)
    assert "integrity" in run_case(ByteOffByOne(), trace.case()).violated()


@pytest.mark.parametrize("name", list(REFERENCE_PROTOCOLS))
def test_reference_protocols_hold(name, tmp_path):
    """Every reference protocol passes the protocol layer (and so no trace is written)."""
    assert _caught(REFERENCE_PROTOCOLS[name](), tmp_path, settings(FIND, max_examples=150)) == set()
    assert not list(tmp_path.iterdir())
