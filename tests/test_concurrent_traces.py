"""Every failure of `pytest properties/`'s concurrent layer writes a `concurrent` trace with its measured rate, also
when the race does not show again on Hypothesis's final run (reported as flaky)."""
from __future__ import annotations

import os
import subprocess
import sys
import threading

from model.store import MemoryStore
from model.trace import Trace
from tests.conftest import ROOT


class OnceWrongStore(MemoryStore):
    """Answers one read with bytes nobody wrote, the first time only (per process): a failure that never shows again."""

    paths = ("get", "get_async", "contains")
    _spent = threading.Event()

    def get(self, key):
        value = super().get(key)
        if value is not None and not self._spent.is_set():
            self._spent.set()
            return b"\x00 nobody wrote this"
        return value


def once_wrong_factory(n_ranks, **options):
    return [OnceWrongStore() for _ in range(n_ranks)]


def _pytest(client: str, found, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "properties/test_concurrent_layer.py", "-q", "-n", "0",
                           "-p", "no:randomly", "--client", client, "--found-dir", str(found), *extra],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "HYPOTHESIS_PROFILE": "ci"})


def test_a_racy_client_failure_writes_a_concurrent_trace_that_replays(tmp_path):
    done = _pytest("properties.bad_stores:crossed_replies_factory", tmp_path)
    assert done.returncode == 1, done.stdout[-2000:]
    traces = [Trace.load(p) for p in tmp_path.glob("*.json")]
    assert traces and all(t.kind == "concurrent" for t in traces), done.stdout[-2000:]
    assert {t.property for t in traces} <= {"wrong-caller", "linearizability", "wrong-key"}
    rate = traces[0].config["rate"]
    assert 0 < rate["k"] <= rate["n"] and "counterexample trace:" in done.stdout
    from checking.layers import ReplayOn
    from checking.replay import judge
    from runtime.registry import resolve_client
    from adapters.catalogue import CLIENTS
    on = ReplayOn(client=resolve_client("properties.bad_stores:crossed_replies_factory", CLIENTS))
    assert judge(traces[0], on).outcome == "reproduces"


def test_a_failure_that_does_not_show_again_still_writes_its_trace(tmp_path):
    done = _pytest("tests.test_concurrent_traces:once_wrong_factory", tmp_path, "-k", "batches_hold")
    assert done.returncode == 1, done.stdout[-2000:]
    (path,) = tmp_path.glob("*.json")
    trace = Trace.load(path)
    assert trace.kind == "concurrent" and trace.property == "store-roundtrip"
    assert "the race did not show again" in done.stdout and str(path) in done.stdout
