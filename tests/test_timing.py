"""Timing judged against the bound the subject was handed, plus a grace, in the time the machine let it run; the
harness's own set-up and its starvation are never the subject's fault (`model.timing`, `runtime.starvation`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from model import timing
from model.contract import StoreCallTimeout
from model.timing import HarnessStarved, SetupTimeout, allowance, grace, rerun_starved, wait_judged
from runtime import starvation
from runtime.bounded import call_bounded
from tests.test_cli import ROOT


@pytest.fixture
def machine():
    """Install a fake measure of stolen time (a fraction of every window) and put the real one back after."""
    saved = timing._measure[0]
    share = [0.0]
    timing.measure_with(lambda t0, t1: share[0] * (t1 - t0))
    yield share
    timing.measure_with(saved)


def test_the_grace_is_a_quarter_of_the_bound_and_at_least_a_fifth_of_a_second():
    assert grace(2.0) == 0.5 and allowance(2.0) == 2.5
    assert grace(0.1) == 0.2 and allowance(0.1) == pytest.approx(0.3)


def test_a_call_that_returns_at_exactly_its_bound_holds(machine):
    """A client that bounds its own calls by the op timeout it was given (a socket timeout) is not a hang."""
    assert call_bounded(0.3, "get", "k", time.sleep, 0.3) is None


def test_a_call_past_its_allowance_is_a_timeout_naming_the_bound_the_grace_and_the_wait(machine):
    with pytest.raises(StoreCallTimeout) as exc:
        call_bounded(0.3, "get", "k", time.sleep, 5)
    text = str(exc.value)
    assert "store call get('k') did not return within its bound of 0.3 s (+0.2 s grace; waited 0.5" in text, text
    assert exc.value.waited == pytest.approx(0.5, abs=0.2)


def test_time_the_machine_took_is_not_counted_against_the_subject(machine):
    """With 80% of every window stolen, a call of twice its allowance in wall time had less than its allowance."""
    machine[0] = 0.8
    assert call_bounded(0.1, "get", "k", time.sleep, 0.6) is None  # allowance 0.3 s; 0.6 s wall, 0.12 s its own


def test_a_starved_call_is_harness_starved_never_a_timeout(machine):
    """With every window stolen the subject never has its allowance: past `STARVED_FACTOR` allowances the harness
    gives up judging (`HarnessStarved`), and says why."""
    machine[0] = 1.0
    t0 = time.monotonic()
    with pytest.raises(HarnessStarved) as exc:
        call_bounded(0.05, "get", "k", time.sleep, 30)
    assert time.monotonic() - t0 >= timing.STARVED_FACTOR * allowance(0.05) - 0.05
    assert "cannot be judged" in exc.value.reason and "get('k')" in exc.value.reason


def test_wait_judged_answers_none_once_done_and_the_wait_once_over(machine):
    assert wait_judged(lambda s: True, 1.0, "x") is None
    waited = wait_judged(lambda s: time.sleep(s) or False, 0.05, "x")
    assert waited is not None and waited >= allowance(0.05)


def test_what_must_settle_is_judged_in_the_machines_time(machine):
    """`settle_judged` (the ranks' pins after the last request, a stack's leaks): true once it settles; false once the
    subject had its whole allowance and it did not; with most of the window stolen it is still waited for (a loaded
    machine gave a patched engine's queued lookup no time to release its pin within 3 s of wall time, and the engine
    was judged to leak it); with all of it stolen, `HarnessStarved`."""
    t0 = time.monotonic()
    assert timing.settle_judged(lambda: time.monotonic() - t0 >= 0.1, 1.0, "x")
    assert not timing.settle_judged(lambda: False, 0.1, "x")
    machine[0] = 0.8  # allowance 0.3 s: 1.5 s of wall time before it had that
    t0 = time.monotonic()
    assert timing.settle_judged(lambda: time.monotonic() - t0 >= 0.6, 0.1, "x")
    machine[0] = 1.0
    with pytest.raises(HarnessStarved):
        timing.settle_judged(lambda: False, 0.1, "the pins to be released")


def test_rerun_starved_runs_again_and_lets_the_last_outcome_through():
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise HarnessStarved("busy")
        return "judged"
    assert rerun_starved(flaky) == "judged" and len(calls) == 3
    calls.clear()
    with pytest.raises(SetupTimeout):
        rerun_starved(lambda: calls.append(1) or (_ for _ in ()).throw(SetupTimeout("slow")))
    assert len(calls) == timing.RERUNS


def _hog(seconds: float) -> None:
    """A CPU hog outside this process tree (reparented away: its run-queue delay is not the harness's)."""
    subprocess.run(["sh", "-c", f"timeout {seconds} sh -c 'while :; do :; done' >/dev/null 2>&1 &"], check=True)


@pytest.mark.skipif(not os.path.exists("/proc/self/schedstat") or not hasattr(os, "sched_setaffinity"),
                    reason="needs Linux schedstat and CPU affinity")
def test_the_run_queue_delay_tells_a_starved_thread_from_a_blocked_one():
    """Pinned to one CPU with hogs on it, a busy thread gathers run-queue delay; a sleeping one does not."""
    starvation.start()
    assert starvation.measures_run_queue()
    cpu = min(os.sched_getaffinity(0))
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        for _ in range(3):
            subprocess.run(["sh", "-c", f"timeout 3 taskset -c {cpu} sh -c 'while :; do :; done' >/dev/null 2>&1 &"],
                           check=True)
        time.sleep(0.2)
        t0 = time.monotonic()
        end = t0 + 1.0
        while time.monotonic() < end:
            pass
        busy = starvation.stolen(t0, time.monotonic())
        t0 = time.monotonic()
        time.sleep(1.0)
        idle = starvation.stolen(t0, time.monotonic())
    finally:
        os.sched_setaffinity(0, saved)
    assert busy >= 0.3, busy
    assert idle <= 0.2, idle


def test_a_deployment_that_is_never_built_is_undecided_not_an_engine_violation(tmp_path):
    """Building a deployment is the harness's work: past --setup-timeout the case runs again, then `check` says
    `undecided` (exit 4, the reason in JSON) and saves nothing."""
    out = tmp_path / "found"
    proc = subprocess.run([sys.executable, "-m", "shardcheck", "check", "--engine", "tests.slow_engines:never_built",
                           "--setup-timeout", "0.2", "--budget", "20", "--out", str(out), "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 4, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result["verdict"] == "undecided" and result["violations"] == []
    assert any("--setup-timeout" in why for why in result["undecided"]), result["undecided"]
    assert not out.exists() or not any(out.iterdir())


def test_a_bad_setup_timeout_is_one_line_and_exit_2():
    proc = subprocess.run([sys.executable, "-m", "shardcheck", "check", "--setup-timeout", "0", "--budget", "5"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].endswith("got 0.0"), proc.stderr


def test_a_subjects_own_timeout_on_a_starved_machine_runs_again(machine):
    """A client that gives up at its own timeout while the machine kept it off the CPU is not judged: the harness
    was starved (`HarnessStarved`); on a machine that let it run, its timeout is its own answer."""
    def own_timeout() -> None:
        time.sleep(0.3)
        raise TimeoutError("the client's own bound")
    with pytest.raises(TimeoutError):
        call_bounded(1.0, "get", "k", own_timeout)
    machine[0] = 0.9
    with pytest.raises(HarnessStarved) as exc:
        call_bounded(1.0, "get", "k", own_timeout)
    assert "gave up at its own timeout" in exc.value.reason


def test_a_test_the_machine_starved_is_skipped_as_undecided_and_a_real_failure_still_fails(tmp_path):
    """`adapters.pytest_runner.pytest_runtest_call`: a `HarnessOutcome` escaping a test is a skip naming the reason;
    an assertion beside it still fails."""
    from pathlib import Path
    (tmp_path / "test_starved.py").write_text(
        "from model.timing import HarnessStarved\n\n"
        "def test_starved():\n    raise HarnessStarved('the machine kept it from running')\n\n"
        "def test_wrong():\n    assert 1 == 2\n")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "adapters.pytest_runner", "-p",
                          "no:cacheprovider", str(tmp_path / "test_starved.py")], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(root)})
    assert "undecided: the machine kept it from running" in out.stdout, out.stdout[-2000:]
    assert "1 failed, 1 skipped" in out.stdout, out.stdout[-2000:]
