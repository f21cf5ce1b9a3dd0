"""The serving-stack layer end to end on the in-memory stack, through the command line: check finds a patched
lookup, saves its trace, replay reproduces it (and says fixed without the patch), show draws it."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PATCH = "tests.stack_patches:max_over_ranks"


def _cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shardcheck", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=Path(__file__).resolve().parent.parent)


def test_a_max_over_ranks_lookup_is_found_saved_replayed_and_drawn(tmp_path):
    out = _cli("check", "--engine", "memory-stack", "--engine-option", "tp=2", "--engine-patch", PATCH,
               "--budget", "30", "--seed", "1", "--out", str(tmp_path), "--json")
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    props = {v["property"] for v in report["violations"]}
    assert "engine-soundness" in props or "hit-accuracy" in props, report
    trace = next(tmp_path.glob("*.json"))
    saved = json.loads(trace.read_text())
    assert saved["kind"] == "stack" and saved["config"]["patches"] == [PATCH]
    ce = report["stats"]["counterexample"]  # minimised and measured by the stack's row (`checking.layers`)
    assert ce["strategy"] == "stack-cases" and ce["notes"][0].startswith("minimised from"), ce
    assert ce["rate"]["n"] >= 3 and ce["steps"] == len(saved["config"]["case"]["steps"]), ce
    replayed = _cli("replay", str(trace), "--json")
    assert replayed.returncode == 1, replayed.stdout + replayed.stderr
    assert json.loads(replayed.stdout)["results"][0]["outcome"] == "reproduces"
    stock = _cli("replay", str(trace), "--engine", "memory-stack", "--json")  # (the engine without the patch)
    assert stock.returncode == 0 and json.loads(stock.stdout)["results"][0]["outcome"] == "fixed", stock.stdout
    shown = _cli("show", str(trace))
    assert shown.returncode == 0 and ">>" in shown.stdout and "reported" in shown.stdout, shown.stdout


def test_the_reference_memory_stack_holds(tmp_path):
    out = _cli("check", "--engine", "memory-stack", "--engine-option", "tp=2", "--budget", "10", "--seed", "1",
               "--out", str(tmp_path), "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)["verdict"] == "held" and not list(tmp_path.glob("*.json"))
