"""The compiled hot paths (`checking.native`): the build runs when it is there and current, `SHARDCHECK_PURE=1` and a
stale build run the source, and both paths give the same verdicts, linearization orders and explorer state counts
(this process runs whichever `make venv` left; a child with `SHARDCHECK_PURE=1` runs the source)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from checking import native
from tests.conftest import ROOT

COMPILED = all(s["compiled"] for s in native.status().values())
BUILT = os.path.exists(os.path.join(native.BUILD_DIR, native.MANIFEST))


def _child(code: str, **env: str) -> subprocess.CompletedProcess:
    """`python -c code` from the repository's root with `env` added (and no inherited SHARDCHECK_PURE)."""
    base = {k: v for k, v in os.environ.items() if k != native.ENV_PURE}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**base, "PYTHONPATH": str(ROOT), **env}, timeout=600)


def fingerprint() -> dict:
    """What must not depend on the path: verdicts (with the violation's op and prefix order, the methods and steps)
    of histories that take every path of the checker, each path's own linearization order per part, and explorer
    state counts (held and violated, reduced and not)."""
    from checking.concurrency_bench import synthetic_history
    from checking.manifest import load, observed, run_entry
    from checking.linearizability import check, split_parts
    from checking.linearizability.greedy import greedy_order
    from checking.linearizability.midpoints import replay_order
    from checking.linearizability.sweep import build, sweep, witness
    from model.history import KV_MODEL

    out: dict = {"verdicts": [], "orders": [], "explore": []}
    for seed, n, keys, callers, pending, stale in [(1, 3000, 4, 4, 0.0, False), (2, 3000, 4, 16, 0.01, True),
                                                   (3, 2000, 64, 4, 0.01, False), (4, 3000, 4, 4, 0.1, True),
                                                   (5, 600, 2, 8, 0.05, False), (6, 3000, 256, 16, 0.0, True)]:
        h = synthetic_history(seed, n_ops=n, n_keys=keys, n_callers=callers, pending=pending, stale=stale)
        out["verdicts"].append(check(h).to_json())
        out["verdicts"].append(check(h.ops[:300], fast=False, max_states=100_000).to_json())  # the search alone
        for k, ops in split_parts(h.ops, KV_MODEL.split)[:3]:
            replayed = replay_order(k, ops, KV_MODEL)
            inst = build(ops, KV_MODEL.register_view)
            chosen = sweep(inst, max_states=1_000_000)[0] if inst is not None else None
            out["orders"].append([greedy_order(k, ops, KV_MODEL), None if replayed is None else [o.id for o in replayed],
                                  None if chosen is None else witness(inst, chosen)])
    entries = load()["entries"]
    for entry in [e for e in entries if e["expect"]["verdict"] == "violated"][::4] + [
            e for e in entries if e["name"] in ("PaperProtocol-4x6-all-f1-full", "PaperProtocolAsync-3x5-all-f2-full")]:
        r = run_entry(entry)
        out["explore"].append([entry["name"], observed(r), r.transitions, r.depth])
    return out


@pytest.mark.skipif(not COMPILED, reason="the compiled hot paths are not running here (no build, or "
                                         "SHARDCHECK_PURE=1): nothing to compare with the source")
def test_the_compiled_and_the_pure_paths_agree():
    """Verdicts, linearization orders and explorer state counts are the same in this process (compiled) and in a
    child running the source."""
    child = _child("import json, tests.test_native as t; print(json.dumps(t.fingerprint()))",
                   **{native.ENV_PURE: "1"})
    assert child.returncode == 0, child.stderr
    pure = json.loads(child.stdout)
    mine = json.loads(json.dumps(fingerprint()))
    for what in ("verdicts", "orders", "explore"):
        assert mine[what] == pure[what], what
    assert any(v["linearizable"] is False for v in mine["verdicts"])
    assert any(v["linearizable"] is True for v in mine["verdicts"])


_STATUS = "import json; from checking import native; import checking.explore, checking.linearizability; " \
          "print(json.dumps(native.status()))"


def test_shardcheck_pure_runs_the_source():
    """With SHARDCHECK_PURE=1 every compiled package runs its `.py` files, and says why."""
    child = _child(_STATUS, **{native.ENV_PURE: "1"})
    assert child.returncode == 0, child.stderr
    status = json.loads(child.stdout)
    assert set(status) == set(native.COMPILED)
    assert all(not s["compiled"] and native.ENV_PURE in s["why"] for s in status.values()), status


@pytest.mark.skipif(not BUILT, reason="no build of the compiled hot paths (`make venv` made none)")
def test_the_build_runs_unless_told_otherwise_and_a_stale_one_never(tmp_path):
    """A current build is what runs; a build whose recorded source digest differs (the source changed since) runs
    the source of that package, with a one-line notice."""
    child = _child(_STATUS)
    assert child.returncode == 0, child.stderr
    assert all(s["compiled"] for s in json.loads(child.stdout).values()), child.stdout
    stale = tmp_path / "native"
    shutil.copytree(native.BUILD_DIR, stale)
    manifest = json.loads((stale / native.MANIFEST).read_text())
    manifest["modules"]["checking.linearizability.sweep"] = "0" * 64
    (stale / native.MANIFEST).write_text(json.dumps(manifest))
    child = _child(_STATUS, SHARDCHECK_NATIVE_DIR=str(stale))
    assert child.returncode == 0, child.stderr
    status = json.loads(child.stdout)
    assert not status["checking.linearizability"]["compiled"] and status["checking.explore"]["compiled"]
    assert child.stderr.count("\n") == 1 and "sweep's source changed" in child.stderr, child.stderr


def test_a_failed_build_leaves_no_build_and_says_so_in_one_line(tmp_path):
    """The build script, made to fail (mypyc cannot be imported), exits 0 with one line and leaves no build."""
    target = tmp_path / "native"
    target.mkdir()
    (target / native.MANIFEST).write_text("{}")
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "mypyc").mkdir()
    (blocker / "mypyc" / "__init__.py").write_text("raise ImportError('no mypyc here')\n")
    env = {**{k: v for k, v in os.environ.items() if k != native.ENV_PURE}, "SHARDCHECK_NATIVE_DIR": str(target),
           "PYTHONPATH": str(blocker)}
    got = subprocess.run([sys.executable, "tools/build_native.py"], capture_output=True, text=True, cwd=ROOT, env=env,
                         timeout=120)
    assert got.returncode == 0
    assert got.stderr.count("\n") == 1 and "did not build" in got.stderr and "pure Python runs" in got.stderr
    assert not target.exists()


def test_bench_says_whether_the_compiled_path_ran(tmp_path, capsys):
    """`bench --histories DIR --json` marks each row with whether the checker ran compiled, as `bench --json` marks
    the explorer's and the checker's figures (`native_status`)."""
    from checking.concurrency_bench import write_histories
    from shardcheck.bench import histories_command, native_status
    write_histories(str(tmp_path), [("small", 200, 4, 4, 0.0, False)])
    assert histories_command(str(tmp_path), None, as_json=True) == 0
    rows = json.loads(capsys.readouterr().out)
    status = native_status()
    assert [r["compiled"] for r in rows] == [status["checking.linearizability"]["compiled"]]
    assert status["checking.explore"]["compiled"] == status["checking.linearizability"]["compiled"] == (
        BUILT and not native.pure_requested())
