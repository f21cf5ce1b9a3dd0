"""Verdicts that hold on a loaded machine: `check` with CPU hogs beside it (twice the cores, bounded, stopped by PID).

Not a timing benchmark: it asserts verdicts. A correct client or engine patch is never `violated` (nor saved), and
every demo is violated by its own property, while the machine is busy with other work. Run in its own session by
`make test` (`-m load`): its hogs would slow every test beside it.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.load

#: Seconds a hog may live, whatever happens to the test session.
HOG_SECONDS = 1200


@pytest.fixture(scope="module")
def hogs():
    """2 x cores busy processes, each its own process group, killed at the end of the module."""
    procs = [subprocess.Popen(["timeout", str(HOG_SECONDS), sys.executable, "-c", "while True: pass"],
                              start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for _ in range(2 * (os.cpu_count() or 1))]
    try:
        yield procs
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(10)


def _check(tmp_path: Path, *args: str, budget: float) -> tuple[dict, list[Path]]:
    out = tmp_path / "found"
    proc = subprocess.run([sys.executable, "-m", "shardcheck", "check", *args, "--budget", str(budget), "--json",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=budget * 6 + 300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode in (0, 1, 4), proc.stderr[-3000:]
    return json.loads(proc.stdout), sorted(out.glob("*.json")) if out.exists() else []


HOLDS = [
    ("the user's valkey-py client, its socket timeout its op timeout", ["--client", "tests.user_clients:valkey_factory"],
     20),
    ("lmcache-patched", ["--client", "lmcache-patched"], 20),
    ("lmcache-patched with a correct engine patch", ["--engine", "lmcache-patched", "--engine-patch",
                                                     "tests.engine_patches:counting_fork"], 40),
]


@pytest.mark.parametrize("what,args,budget", HOLDS, ids=[h[0] for h in HOLDS])
def test_a_correct_subject_holds_under_load(hogs, tmp_path, what, args, budget):
    result, saved = _check(tmp_path, *args, budget=budget)
    assert result["verdict"] == "held", (what, result["violations"], result.get("undecided"))
    assert saved == []


DEMOS = [
    ("a 1 s TTL", ["--client", "tests.user_twins:ttl_factory"], "retention", 20),
    ("a client-local read cache", ["--client", "tests.user_twins:local_cache_factory"], "shared-tier", 20),
    ("the scheduler taking the maximum", ["--engine", "lmcache-patched", "--engine-patch",
                                          "adapters.engine_demos:take_max"], "engine-soundness", 60),
    ("a protocol combining by the maximum", ["--protocol", "model.variants:MaxCombine"], "soundness", 10),
]


@pytest.mark.parametrize("what,args,prop,budget", DEMOS, ids=[d[0] for d in DEMOS])
def test_a_demo_is_violated_by_its_own_property_under_load(hogs, tmp_path, what, args, prop, budget):
    result, saved = _check(tmp_path, *args, budget=budget)
    assert result["verdict"] == "violated", (what, result.get("undecided"))
    assert result["violations"][0]["property"] == prop, (what, result["violations"])
    assert len(saved) == 1
