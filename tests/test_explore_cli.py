"""`shardcheck explore`: exit codes, JSON, local workers equal to one process, failing shards, Ctrl-C."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardcheck.cli import main
from tests.conftest import default_signals

ROOT = Path(__file__).resolve().parents[1]


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    """Run the command line in this process: (exit code, stdout, stderr)."""
    code = main(["explore", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_held_prints_json_with_the_contract_fields(capsys):
    """A held configuration exits 0 and its JSON has verdict, states, seconds, workers (and peak memory)."""
    code, out, _ = run(["--protocol", "paper", "--ranks", "3", "--chunks", "4", "--json"], capsys)
    got = json.loads(out)
    assert code == 0 and got["verdict"] == "held" and got["workers"] == 1 and got["states"] > 0
    assert {"verdict", "states", "seconds", "workers", "peak_rss_mb"} <= set(got) and got["lazy"] is True


def test_violated_exits_1_and_writes_a_trace(capsys, tmp_path):
    """A flawed variant exits 1, names its property and writes a trace under --out."""
    code, out, _ = run(["--protocol", "model.variants:MaxCombine", "--ranks", "2", "--chunks", "3", "--json",
                        "--out", str(tmp_path)], capsys)
    got = json.loads(out)
    assert code == 1 and got["verdict"] == "violated" and got["violation"]["property"] == "soundness"
    assert Path(got["counterexample"]).is_file() and Path(got["counterexample"]).parent == tmp_path


@pytest.mark.parametrize("argv, named", [
    (["--protocol", "nope:X", "--ranks", "2", "--chunks", "3"], "protocol 'nope:X'"),
    (["--protocol", "paper", "--ranks", "0", "--chunks", "3"], "--ranks 0"),
    (["--protocol", "paper", "--ranks", "2", "--chunks", "3", "--faults", "-1"], "--faults -1"),
    (["--protocol", "paper", "--ranks", "2", "--chunks", "3", "--cached", "0,9"], "--cached '0,9'"),
    (["--protocol", "paper", "--ranks", "2", "--chunks", "3", "--cached", "x"], "--cached 'x'"),
    (["--protocol", "paper", "--ranks", "2", "--chunks", "3", "--workers", "0"], "--workers 0"),
    (["--protocol", "paper", "--ranks", "2", "--chunks", "3", "--shards", "0"], "--shards 0"),
    (["--protocol", "paper", "--ranks", "2", "--chunks", "3", "--ray", "nonsense"], "--ray 'nonsense'"),
    (["--protocol", "paper", "--ranks", "2", "--chunks", "3", "--ray", "127.0.0.1:1"], "cannot reach 127.0.0.1:1"),
])
def test_bad_input_exits_2_with_one_line_naming_it(argv, named, capsys):
    """Each unusable input exits 2 with one stderr line that names it."""
    code, out, err = run(argv, capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and named in err


def test_two_workers_equal_one_process(capsys):
    """--workers 2 (and 5 shards on 2 workers) give the one-process states and verdict, eager and lazy, held and violated."""
    for extra in (["--protocol", "paper-async", "--ranks", "3", "--chunks", "5"],
                  ["--protocol", "paper-async", "--ranks", "3", "--chunks", "5", "--eager"],
                  ["--protocol", "model.variants:GiveUpOnLocalMiss", "--ranks", "2", "--chunks", "3"]):
        one = json.loads(run([*extra, "--json"], capsys)[1])
        two = json.loads(run([*extra, "--json", "--workers", "2"], capsys)[1])
        five = json.loads(run([*extra, "--json", "--workers", "2", "--shards", "5"], capsys)[1])
        assert two["workers"] == 2 and (two["verdict"], two["states"], two.get("violation")) == \
            (one["verdict"], one["states"], one.get("violation")) == \
            (five["verdict"], five["states"], five.get("violation"))


def test_a_shard_that_keeps_failing_is_reported(capsys):
    """A shard whose worker always dies is retried, then named; the run exits 2 as incomplete."""
    code, out, err = run(["--protocol", "tests.dying:DiesInWorkers", "--ranks", "2", "--chunks", "3",
                          "--workers", "2", "--json"], capsys)
    got = json.loads(out)
    assert code == 2 and got["verdict"] == "incomplete"
    assert sorted(f["shard"] for f in got["failed_shards"]) == [0, 1]
    assert "exited with code 3" in got["failed_shards"][0]["error"] and "did not complete" in err


def test_a_shard_that_fails_once_is_retried(capsys, tmp_path, monkeypatch):
    """A worker that dies once is replaced, and the merged result is the one-process result."""
    monkeypatch.setenv("SHARDCHECK_TEST_MARKERS", str(tmp_path))
    code, out, _ = run(["--protocol", "tests.dying:DiesOnce", "--ranks", "2", "--chunks", "3", "--workers", "2",
                        "--json"], capsys)
    one = json.loads(run(["--protocol", "paper", "--ranks", "2", "--chunks", "3", "--json"], capsys)[1])
    got = json.loads(out)
    assert (tmp_path / "died").exists() and code == 0
    assert (got["verdict"], got["states"]) == (one["verdict"], one["states"]) and "failed_shards" not in got


def _children(pid: int) -> set[int]:
    """Every descendant process of `pid` (from /proc)."""
    parents: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parents[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        kids = {c for c, pp in parents.items() if pp == p}
        todo.extend(kids - out)
        out |= kids
    return out


def test_ctrl_c_leaves_no_process_behind():
    """SIGINT during a 2-worker run ends the command (exit 130) and every worker process it started."""
    proc = subprocess.Popen([sys.executable, "-m", "shardcheck", "explore", "--protocol", "paper", "--ranks", "8",
                             "--chunks", "16", "--workers", "2"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            preexec_fn=default_signals)
    try:
        workers: set[int] = set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(workers) < 2 and proc.poll() is None:
            workers = {p for p in _children(proc.pid)
                       if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()} if Path("/proc").exists() else set()
            time.sleep(0.2)
        assert len(workers) >= 2, "the workers did not start"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 130 and b"interrupted" in err
    time.sleep(0.5)
    assert not [p for p in workers if Path(f"/proc/{p}").exists()
                and "Z" not in Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]]


def test_worker_progress_is_one_aggregate():
    """explore_workers reports one running total of states and shards, ending with every shard done."""
    from checking.explore.shards import ShardSpec
    from checking.explore.workers import explore_workers
    seen: list[dict] = []
    spec = ShardSpec(protocol="paper-async", n_ranks=3, n_chunks=5, max_faults=2, lazy=True)
    res = explore_workers(spec, 2, shards=3, progress=seen.append)
    assert seen and all(s["shards"] == 3 and s["workers"] == 2 for s in seen)
    assert seen[-1]["done"] == 3 and seen[-1]["states"] == res.states and res.verdict == "held"
    assert [s["done"] for s in seen] == sorted(s["done"] for s in seen)


def test_the_timeout_ends_every_worker_and_names_the_shards(capsys):
    """--timeout stops a 2-worker run that needs longer: exit 2, each unfinished shard named, no worker left."""
    import multiprocessing
    code, out, err = run(["--protocol", "paper", "--ranks", "8", "--chunks", "16", "--workers", "2",
                          "--timeout", "1", "--json"], capsys)
    got = json.loads(out)
    assert code == 2 and got["verdict"] == "incomplete" and "did not complete" in err
    assert sorted(f["shard"] for f in got["failed_shards"]) == [0, 1]
    assert all("timed out after 1 s" in f["error"] for f in got["failed_shards"])
    assert multiprocessing.active_children() == []


def test_check_shares_the_explorer_out_to_worker_processes(tmp_path):
    """`check --explore-workers 2` runs the explorer's configurations on local worker processes and reports them."""
    from tests.conftest import run_cli
    # (a check that holds runs to its whole budget, the interpreter's start and the reserves at its end included;
    # 24 s leaves the explorer about 4.5 s: beside a CPU burner it exhausted a configuration from 10 s on, none at 6 s)
    r = run_cli("check", "--budget", "24", "--explore-workers", "2", "--json", "--out", str(tmp_path), timeout=120)
    data = json.loads(r.stdout)
    assert r.returncode == 0 and data["stats"]["coverage"]["explore"]["exhausted"], r.stderr[-2000:]
