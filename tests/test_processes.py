"""The process runner: rank programs as OS processes with gloo collectives, judged like the simulator."""
import os
import time

import attrs
import pytest

from adapters.processes import ProcessRunner
from model.effects import Get
from model.faults import Eviction, FaultPlan
from model.harness import run_case
from model.outcome import Case
from model.protocols import REFERENCE_PROTOCOLS, PaperProtocol
from model.trace import Trace
from model.variants import EarlyExitOnMiss, SkipEmptyGather
from tests.conftest import default_signals


@pytest.fixture(scope="module")
def runner():
    with ProcessRunner(timeout=2.0) as r:
        yield r


def _gone(pids):
    """Whether every pid has exited and been reaped (polled briefly: the forkserver reaps asynchronously)."""
    for _ in range(50):
        if not any(os.path.exists(f"/proc/{p}") for p in pids):
            return True
        time.sleep(0.1)
    return False


def _cases(n):
    k = 2 * n
    yield Case(n, k)
    yield Case(n, k, faults=FaultPlan(evict_before_lookup=[Eviction(k - 1)]))
    yield Case(n, k, faults=FaultPlan(evict_after_lookup=[Eviction(1 % k)], lost=[(n - 1, 0)]))


@pytest.mark.parametrize("name", sorted(REFERENCE_PROTOCOLS))
def test_reference_protocols_hold_at_one_to_four_ranks(runner, name):
    """Every reference protocol holds at 1-4 ranks with faults, and each rank loads what the simulator loads."""
    protocol = REFERENCE_PROTOCOLS[name]()
    for n in (1, 2, 3, 4):
        for case in _cases(n):
            out = runner.run(protocol, case)
            assert out.violations == [], (name, case, out.violations)
            sim = run_case(protocol, case)
            assert (out.planned, out.lcp) == (sim.planned, sim.lcp)
            assert {r: sorted(v) for r, v in out.results.items()} == {r: sorted(v) for r, v in sim.results.items()}


def test_early_exit_desync_is_named_in_gloo(runner):
    """A rank that skips the agreement after a miss is a desync naming collective #0 and both ranks' kinds."""
    out = runner.run(EarlyExitOnMiss(), Case(2, 4, faults=FaultPlan(evict_after_lookup=[Eviction(1)])))
    assert out.violated() == ["desync"]
    v = out.violations[0]
    assert v.detail["collective"] == 0
    assert v.detail["ranks"] == {0: "AllReduceMin", 1: "AllGather"}
    assert _gone(runner.last_pids)


def test_skip_empty_gather_deadlock_names_waiting_and_finished_ranks(runner):
    """A rank that skips the AllGather is a deadlock: the others wait in collective #1 for it."""
    out = runner.run(SkipEmptyGather(), Case(3, 2))
    assert out.violated() == ["deadlock"]
    d = out.violations[0].detail
    assert (d["collective"], d["stuck"], d["finished"]) == (1, [0, 1], [2])
    assert _gone(runner.last_pids)


@attrs.define(frozen=True)
class DiesOnRank1(PaperProtocol):
    """Rank 1's process exits in the middle of its load."""

    name = "dies-on-rank1"

    def rank_load(self, rank, n_ranks, chunk_hashes, planned):
        if rank == 1:
            os._exit(7)
        return (yield from super().rank_load(rank, n_ranks, chunk_hashes, planned))


@attrs.define(frozen=True)
class StuckOnRank0(PaperProtocol):
    """Rank 0 blocks in its own code before its first effect, for longer than any bound."""

    name = "stuck-on-rank0"

    def rank_load(self, rank, n_ranks, chunk_hashes, planned):
        if rank == 0:
            time.sleep(600)
        return (yield from super().rank_load(rank, n_ranks, chunk_hashes, planned))


@attrs.define(frozen=True)
class RaisesOnRank1(PaperProtocol):
    """Rank 1's load raises after its first GET (of its own chunk; needs n_chunks >= n_ranks)."""

    name = "raises-on-rank1"

    def rank_load(self, rank, n_ranks, chunk_hashes, planned):
        yield Get(self.key(rank, chunk_hashes[rank], rank, n_ranks))
        if rank == 1:
            raise ValueError("boom")
        return (yield from super().rank_load(rank, n_ranks, chunk_hashes, planned))


def test_dead_rank_process_is_a_violation_and_nothing_is_left(runner):
    """A rank process that dies is a termination violation naming it and its exit code; every process is reaped."""
    out = runner.run(DiesOnRank1(), Case(3, 3))
    assert out.violated() == ["termination"]
    assert out.violations[0].detail["rank"] == 1 and out.violations[0].detail["exitcode"] == 7
    assert _gone(runner.last_pids)


def test_stuck_rank_is_a_termination_within_the_bound():
    """A rank stuck in its own code is a termination violation naming it; the stuck process is killed."""
    with ProcessRunner(timeout=0.5) as runner:
        out = runner.run(StuckOnRank0(), Case(2, 2))
    assert out.violated() == ["termination"]
    assert out.violations[0].detail["rank"] == 0
    assert "did not finish the load phase within its bound of 1 s (+0.25 s grace" in out.violations[0].summary
    assert _gone(runner.last_pids)


def test_raising_rank_stops_every_rank(runner):
    """A rank program that raises is a termination naming it; the other ranks learn it instead of waiting."""
    out = runner.run(RaisesOnRank1(), Case(2, 2))
    assert out.violated() == ["termination"]
    assert "rank 1's rank_load raised ValueError: boom" in out.violations[0].summary


def test_process_outcome_saves_as_a_trace_the_simulator_replays(runner, tmp_path):
    """A process-runner outcome is a `protocol` trace; the simulator re-runs it to the same violation."""
    out = runner.run(SkipEmptyGather(), Case(2, 1))
    trace = Trace.from_outcome(out, protocol_ref="model.variants:SkipEmptyGather")
    again = Trace.load(trace.save(tmp_path / "t.json"))
    assert again.property == "deadlock"
    assert "deadlock" in run_case(SkipEmptyGather(), again.case()).violated()


def test_shardcheck_run_fixture_honours_runner_option(shardcheck_run):
    """Whichever `--runner` runs it, the deadlock demo variant is caught and the reference holds."""
    assert "deadlock" in shardcheck_run(SkipEmptyGather(), Case(3, 2)).violated()
    assert shardcheck_run(PaperProtocol(), Case(3, 4)).violations == []


def test_ctrl_c_leaves_no_rank_process_behind():
    """Ctrl-C (SIGINT to the process group) during `check --runner processes`: exit 130, every process gone."""
    import signal
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    p = subprocess.Popen([sys.executable, "-m", "shardcheck", "check", "--runner", "processes", "--budget", "60"],
                         cwd=root, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, preexec_fn=default_signals)
    try:
        for line in p.stderr:  # the first progress line: rank processes have been running for a while
            if "cases" in line:
                break
        os.killpg(p.pid, signal.SIGINT)
        assert p.wait(30) == 130
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
        p.stderr.close()

    def group():
        out = subprocess.run(["ps", "-eo", "pgid="], capture_output=True, text=True).stdout.split()
        return [g for g in out if g == str(p.pid)]

    for _ in range(300):  # the forkserver notices its parent is gone within moments (bounded: 30 s on a busy machine)
        if not group():
            break
        time.sleep(0.1)
    rows = subprocess.run(["ps", "-eo", "pgid=,pid=,ppid=,stat=,etime=,args="], capture_output=True, text=True).stdout
    left = "\n".join(r for r in rows.splitlines() if r.split() and r.split()[0] == str(p.pid))
    assert group() == [], f"left in the command's process group 30 s after Ctrl-C:\n{left}"


def test_a_forkserver_child_in_native_code_holding_the_gil_ends_with_its_harness(tmp_path):
    """`runtime.tie`: a rank process (a forkserver's child) inside native code that holds the GIL, so that its watch
    thread cannot run (torch's FileStore retried an open in a removed rendezvous directory for 300 s so after a
    Ctrl-C), is gone within moments of its harness: the kernel kills it once the forkserver, which no child keeps
    alive, has ended with the harness."""
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    from adapters.process_signals import process_state
    (tmp_path / "gil_holder.py").write_text(textwrap.dedent("""
        import ctypes
        from adapters.children import die_with_parent

        def hold(parent_pid):
            die_with_parent(parent_pid)
            ctypes.PyDLL(None).sleep(120)  # native code that keeps the GIL
        """))
    harness = textwrap.dedent(f"""
        import multiprocessing, os, sys, time
        sys.path[:0] = [{str(tmp_path)!r}, {str(Path(__file__).resolve().parents[1])!r}]
        import gil_holder
        p = multiprocessing.get_context("forkserver").Process(target=gil_holder.hold, args=(os.getpid(),))
        p.start()
        open({str(tmp_path / "pid")!r}, "w").write(str(p.pid))
        time.sleep(1.0)
        os._exit(0)  # gone without reaping it
        """)
    # (no pipes: the forkserver and its child would hold them open)
    assert subprocess.run([sys.executable, "-c", harness], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          timeout=60).returncode == 0
    pid = int((tmp_path / "pid").read_text())

    def alive() -> bool:
        return process_state(pid) not in (None, "Z")
    for _ in range(200):  # bounded: 20 s (the GIL holder sleeps 120 s)
        if not alive():
            break
        time.sleep(0.1)
    gone = not alive()
    if not gone:
        os.kill(pid, 9)
    assert gone, f"the forkserver's child {pid} outlived its harness by 20 s"


def test_check_replay_show_with_runner_processes(tmp_path, capsys):
    """`check --runner processes` saves the deadlock; `replay --runner processes` reproduces it; `show` draws it."""
    import json
    from shardcheck.cli import main
    assert main(["check", "--protocol", "model.variants:SkipEmptyGather", "--runner", "processes", "--budget", "10",
                 "--out", str(tmp_path), "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["stats"]["runner"] == "processes" and result["violations"][0]["property"] == "deadlock"
    path = result["violations"][0]["counterexample"]
    assert Trace.load(path).notes == "runner: processes"
    assert main(["replay", path, "--runner", "processes", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["results"][0]["outcome"] == "reproduces"
    assert main(["show", path]) == 0
    assert "deadlock" in capsys.readouterr().out


@pytest.mark.real
def test_real_client_stores_live_in_their_rank_processes():
    """With LMCache over one Valkey per rank process, the desync demo variant is still caught, and the reference
    protocol loads every chunk."""
    with ProcessRunner("lmcache-patched") as runner:
        bad = runner.run(EarlyExitOnMiss(), Case(2, 4, faults=FaultPlan(evict_after_lookup=[Eviction(1)])))
        good = runner.run(PaperProtocol(), Case(2, 4))
    assert bad.violated() == ["desync"]
    assert good.violations == [] and {r: sorted(v) for r, v in good.results.items()} == {0: [0, 1, 2, 3],
                                                                                         1: [0, 1, 2, 3]}


def test_curated_corpus_replays_to_its_expectations_on_processes():
    """Every curated protocol counterexample of one prompt replays with --runner processes to the outcome it records
    for `model`; one with other prompts in the tier is an error row (the runner refuses it, explicitly)."""
    from pathlib import Path
    from shardcheck.replay_cmd import run_replay
    corpus = Path(__file__).resolve().parents[1] / "counterexamples"
    rows = run_replay([str(corpus)], "model", runner="processes")
    assert len(rows) >= 14
    multi = {str(p) for p in corpus.glob("*.json") if Trace.load(p).config.get("others")}
    assert multi and all(r["outcome"] == "error" and "--runner sim" in r["why"] for r in rows if r["path"] in multi)
    assert [r["path"] for r in rows if not r["matches"] and r["path"] not in multi] == []


@attrs.define(frozen=True)
class BroadcastFromNowhere(PaperProtocol):
    """Every rank broadcasts from a root that is not a rank."""

    name = "broadcast-from-nowhere"

    def rank_load(self, rank, n_ranks, chunk_hashes, planned):
        from model.effects import Broadcast
        return dict((yield Broadcast({}, root=n_ranks)))


def test_broadcast_from_a_root_outside_the_group_is_a_desync(runner):
    """A Broadcast whose root is not a rank is a desync, as in the simulator, not an error of the runner."""
    out = runner.run(BroadcastFromNowhere(), Case(2, 2))
    assert out.violated() == ["desync"] and "Broadcast from root 2" in out.violations[0].summary
    assert run_case(BroadcastFromNowhere(), Case(2, 2)).violated() == ["desync"]
