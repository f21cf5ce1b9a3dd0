"""The backstop for protocol code stuck in C: `check` ends with exit 3, a stack and one line, at its deadline."""
import os
import signal
import subprocess
import sys
import textwrap
import time

from tests.conftest import ROOT, run_cli

STUCK = textwrap.dedent('''
    import re
    from model.protocols import PaperProtocol

    class RegexLookup(PaperProtocol):
        name = "regex-lookup"

        def rank_lookup(self, rank, n_ranks, chunk_hashes, contains):
            re.match(r"(a+)+$", "a" * 64 + "b")  # backtracks for ages, in C
            return super().rank_lookup(rank, n_ranks, chunk_hashes, contains)
''')


def test_a_lookup_stuck_in_c_ends_check_with_exit_3(tmp_path, monkeypatch):
    """A catastrophic regular expression in rank_lookup (the watchdog cannot run) ends check with exit 3."""
    (tmp_path / "stuck.py").write_text(STUCK)
    monkeypatch.setenv("SHARDCHECK_SUPERVISOR_GRACE", "2")
    r = run_cli("check", "--protocol", "stuck:RegexLookup", "--budget", "2", "--out", str(tmp_path / "o"),
                env_extra=[str(tmp_path)], timeout=300)  # (a busy machine stretches the deadline: `model.timing`)
    assert r.returncode == 3, r.stderr
    assert "stuck.py" in r.stderr and "rank_lookup" in r.stderr  # the child's stack, from faulthandler
    assert r.stderr.rstrip().endswith("ended the run (exit 3)")


def test_a_supervised_check_passes_its_exit_status_and_output_through(tmp_path):
    """A check that ends by itself keeps its exit status and its JSON output under the supervisor."""
    r = run_cli("check", "--protocol", "model.variants:MaxCombine", "--budget", "2", "--json",
                "--out", str(tmp_path), timeout=60)
    assert r.returncode == 1 and '"verdict": "violated"' in r.stdout, r.stderr


def _children(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(c) for c in f.read().split()]
    return out


def test_a_supervisor_killed_takes_its_child_along(tmp_path):
    """A supervisor that is killed outright (a CI job cancelled, a test's timeout) leaves no child stuck in C
    behind: the kernel kills the child (PR_SET_PDEATHSIG)."""
    (tmp_path / "stuck.py").write_text(STUCK)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    sup = subprocess.Popen([sys.executable, "-m", "shardcheck", "check", "--protocol", "stuck:RegexLookup", "--budget",
                            "300", "--out", str(tmp_path / "o")], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 60
        while not _children(sup.pid) and time.monotonic() < end:
            time.sleep(0.1)
        child = _children(sup.pid)[0]
        time.sleep(1.0)  # (into its work)
    finally:
        sup.kill()
        sup.wait()
    end = time.monotonic() + 10
    while _alive(child) and time.monotonic() < end:
        time.sleep(0.1)
    alive = _alive(child)
    if alive:
        os.kill(child, signal.SIGKILL)
    assert not alive, "the supervised child outlived its supervisor"


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting for init to reap it is gone all the same)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
