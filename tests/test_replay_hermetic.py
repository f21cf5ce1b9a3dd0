"""Replays of engine traces are hermetic, and a patch on `lmcache-patched` reaches the classes that run: two traces
replayed together (one recorded with an `--engine-patch`, one without) each get the outcome they get alone; a racy
engine trace replayed on another engine is judged against its recorded subject (with its patch, in a process of its
own) run alternately beside it; a class a patch puts in place of LMCache's async lookup client reaches
`lmcache-patched`'s deployments built after it; a patch of the one method a fix replaces is refused in one line; and
Ctrl-C during a replay with a patched arm leaves nothing behind."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adapters.catalogue import SERVING_ENGINES
from checking.serving.engine_run import run_engine_case
from checking.serving.engine_search import engine_target, facts_of, shows
from model.engine_case import case_from_json
from runtime.registry import ResolveError
from runtime.serving import apply_engine_patches
from shardcheck.replay_cmd import run_replay
from tests.conftest import default_signals
from tests.engine_forks import FORK_ANSWERS, fork_async_client, max_answer_loop

pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parents[1]
#: A patch that breaks `pins` on any engine (every time: no race).
DROP_UNPIN = "adapters.engine_demos:drop_lookup_unpin"
#: Store a prompt, look it up (every rank holds it all), end the request.
CASE = {"n_ranks": 1, "lookup": "sync", "models": ["m"], "prompts": [{"name": "p0", "chunks": 2}],
        "steps": [{"kind": "store", "prompt": "p0"},
                  {"kind": "lookup", "request": "q1", "prompt": "p0", "wait": True, "scheduled": True},
                  {"kind": "end", "request": "q1"}]}
ASYNC_CASE = dict(CASE, lookup="async")


def _trace(path: Path, *, patches: list[str], prop: str = "pins", rate: dict | None = None, case: dict = CASE,
           expect: dict | None = None) -> str:
    """A hand-recorded engine trace on `lmcache-patched` with `patches`."""
    path.write_text(json.dumps({
        "schema": "shardcheck-trace", "version": 1, "kind": "engine", "property": prop, "summary": "hand-recorded",
        "protocol": {"name": "-", "ref": None}, "client": "-", "events": [], "verdict": {"violations": []},
        "config": {"engine": "lmcache-patched", "case": case, "options": {}, "patches": patches,
                   "runner": "in-process", "rate": rate or {"k": 1, "n": 1}},
        "expect": expect or {}}))
    return str(path)


def test_two_engine_traces_replayed_together_get_each_the_outcome_it_gets_alone(tmp_path):
    """The trace recorded with the patch first: its patch stays in its own process, so the trace recorded without it
    is `fixed` (it reproduced when the patch leaked into this process); each row names the engine with its patches,
    and `expect` keyed by engine plus patches matches."""
    patched = _trace(tmp_path / "a-patched.json", patches=[DROP_UNPIN],
                     expect={f"lmcache-patched+{DROP_UNPIN}": "reproduces", "lmcache-patched": "fixed"})
    plain = _trace(tmp_path / "b-plain.json", patches=[],
                   expect={f"lmcache-patched+{DROP_UNPIN}": "reproduces", "lmcache-patched": "fixed"})
    before = list(apply_engine_patches(()))
    rows = run_replay([patched, plain])
    assert [(r["outcome"], r["client"], r["matches"]) for r in rows] == [
        ("reproduces", f"lmcache-patched+{DROP_UNPIN}", True), ("fixed", "lmcache-patched", True)], rows
    assert rows[0]["patches"] == [DROP_UNPIN] and rows[1]["patches"] == []
    assert apply_engine_patches(()) == before  # (nothing was applied in this process)


def test_a_racy_engine_trace_is_judged_against_its_recorded_subject_with_its_patch(tmp_path):
    """A trace recorded on `lmcache-patched` with a patch, at a racy rate, replayed on `lmcache-patched` without it:
    the recorded subject runs beside it as the control (in a process of its own), and `fixed` comes with both
    counts once the control showed it 7 times."""
    path = _trace(tmp_path / "racy.json", patches=[DROP_UNPIN], rate={"k": 9, "n": 10})
    [row] = run_replay([path], engine="lmcache-patched")
    assert row["outcome"] == "fixed", row
    assert row["control"]["subject"] == f"lmcache-patched+{DROP_UNPIN}" and row["control"]["k"] >= 7, row
    assert row["candidate"]["k"] == 0 and row["runs"] == row["candidate"]["n"] + row["control"]["n"], row
    assert "Fisher" in row["why"] and "load" in row["why"], row


def test_a_class_a_patch_puts_in_place_of_lmcaches_async_client_reaches_lmcache_patched(monkeypatch):
    """A user's fork of LMCache's async lookup client, put in place of LMCache's class after an `lmcache-patched`
    deployment was built in this process: the next deployment's client is the fork under E5 (its `lookup_cache`
    answers one chunk more: `engine-soundness`, and it counts that in the deployment's `facts`)."""
    from lmcache.v1.lookup_client import lmcache_async_lookup_client as module
    case = case_from_json(ASYNC_CASE)
    target = engine_target("lmcache-patched", lookup="async", engines=SERVING_ENGINES)
    before = run_engine_case(target.make, case)
    assert not shows(before.violations, "engine-soundness") and FORK_ANSWERS not in facts_of(before)
    monkeypatch.setattr(module, "LMCacheAsyncLookupClient", module.LMCacheAsyncLookupClient)  # (put back after)
    fork_async_client()
    after = run_engine_case(target.make, case)
    assert shows(after.violations, "engine-soundness"), after.violations
    assert facts_of(after).get(FORK_ANSWERS, 0) >= 1, facts_of(after)


def test_a_patch_of_the_answer_loop_lmcache_patched_replaces_is_refused_in_one_line(monkeypatch):
    """E5 replaces the async client's answer loop: a patch of it would not run on `lmcache-patched`, and building a
    deployment says so, naming the method, the fix and what to do instead."""
    from lmcache.v1.lookup_client.lmcache_async_lookup_client import LMCacheAsyncLookupClient
    monkeypatch.setattr(LMCacheAsyncLookupClient, "process_responses_from_workers",
                        LMCacheAsyncLookupClient.process_responses_from_workers)  # (put back after)
    max_answer_loop()
    with pytest.raises(ResolveError) as raised:
        engine_target("lmcache-patched", lookup="async", engines=SERVING_ENGINES).make(case_from_json(ASYNC_CASE))
    said = str(raised.value)
    assert "process_responses_from_workers" in said and "E5" in said and "--engine lmcache" in said
    assert "\n" not in said


def test_ctrl_c_during_a_replay_with_a_patched_arm_leaves_nothing_behind(tmp_path, request):
    """Ctrl-C (SIGINT to the process group) while the fresh process of a patched trace runs: exit 130, no process of
    the replay left, nothing left in its temp dir (the servers' dirs, the sockets)."""
    import shutil
    import tempfile
    tmp = Path(tempfile.mkdtemp(prefix="sc-", dir="/tmp"))  # (ZMQ socket paths must stay within 107 bytes)
    request.addfinalizer(lambda: shutil.rmtree(tmp, ignore_errors=True))
    path = _trace(tmp_path / "patched.json", patches=[DROP_UNPIN], rate={"k": 9, "n": 10})
    p = subprocess.Popen([sys.executable, "-m", "shardcheck", "replay", path, "--engine", "lmcache-patched"],
                         cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "TMPDIR": str(tmp)},
                         preexec_fn=default_signals)

    def group() -> list[str]:
        """The command lines of the replay's process group."""
        out = []
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                if os.getpgid(int(proc.name)) == p.pid:
                    out.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except (OSError, ProcessLookupError):
                continue
        return out

    try:
        for _ in range(1800):  # (the arm's process is up: a spawned child in the group)
            if any("spawn_main" in line for line in group()) or p.poll() is not None:
                break
            time.sleep(0.1)
        assert p.poll() is None, p.stderr.read()[-2000:]
        time.sleep(5.0)  # (importing LMCache, or building a deployment, or running a case: wherever it is)
        os.killpg(p.pid, signal.SIGINT)
        code = p.wait(90)
        assert code == 130, p.stderr.read()[-2000:]
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
        p.stderr.close()
    for _ in range(300):
        if not group():
            break
        time.sleep(0.1)
    assert group() == []
    assert sorted(str(q.relative_to(tmp)) for q in tmp.rglob("*")) == []  # (servers' dirs, sockets)
