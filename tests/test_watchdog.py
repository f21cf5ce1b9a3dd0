"""Protocol code that blocks becomes a termination violation (runtime.watchdog), in every engine and command."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from checking.explore import explore
from model.harness import Case, run_case
from runtime.watchdog import EXIT_UNINTERRUPTIBLE, watching
from tests.stalling import CatchOnceLookup, KeyLoopLookup, SleepsByLength, LockedLoad, PollingLookup, SleepyLookup, SlowSteps, SwallowingLookup
from tests.test_cli import ROOT, sc


def _only(out):
    assert out.violations and {v.property for v in out.violations} == {"termination"}, out.violations
    return out.violations[0]


def test_stalled_lookup_is_a_termination_violation_naming_rank_method_and_line():
    """A lookup that sleeps is interrupted and reported with its rank, method and source line."""
    with watching(0.5) as on:
        assert on
        v = _only(run_case(SleepyLookup(), Case(2, 2)))
    assert "rank 1's SleepyLookup.rank_lookup did not return within its bound of 0.5 s (+0.2 s grace" in v.summary
    assert "stalling.py:" in v.summary and v.detail["stalled"] == "SleepyLookup.rank_lookup"


def test_stalled_load_step_in_the_simulator_and_the_explorer():
    """A load step that waits forever is a termination violation in the simulator and in the explorer."""
    with watching(0.5):
        v = _only(run_case(LockedLoad(), Case(1, 3)))
        assert "rank 0's LockedLoad.rank_load did not return" in v.summary and v.detail["rank"] == 0
        res = explore(LockedLoad(), 1, 3, cached=[0, 1, 2], max_faults=0)
    assert res.verdict == "violated" and res.violation.property == "termination"
    assert "LockedLoad.rank_load did not return" in res.violation.summary


def test_a_line_that_stalled_before_is_called_sooner_and_says_so():
    """The second stall at the same line uses the short limit and names why."""
    with watching(0.5, again=0.2):
        first = _only(run_case(LockedLoad(), Case(1, 3)))
        second = _only(run_case(LockedLoad(), Case(2, 4)))
    assert "stalled before" not in first.summary
    assert "within 0.2 s" in second.summary and "this line stalled before" in second.summary


#: Protocols whose lookup never returns, however it spends the time, and what the report must say.
STALLING_LOOKUPS = [
    (SwallowingLookup, "SwallowingLookup.rank_lookup did not return"),  # `except Exception` cannot see Stalled
    (PollingLookup, "PollingLookup.rank_lookup did not return within its bound of 0.5 s (+0.2 s grace"),  # store time counts
    (KeyLoopLookup, "KeyLoopLookup.rank_lookup did not return within its bound of 0.5 s (+0.2 s grace"),  # the harness's call is timed
    (CatchOnceLookup, "it caught the interruption and went on"),  # caught and returned: still a stall
]


@pytest.mark.parametrize("protocol, says", STALLING_LOOKUPS, ids=lambda p: getattr(p, "name", "says"))
def test_a_lookup_that_never_returns_is_caught(protocol, says):
    """Sleeping behind `except Exception`, polling the store, looping through `key()`, catching the interruption:
    each is a termination violation of the lookup."""
    with watching(0.5):
        v = _only(run_case(protocol(), Case(1, 1)))
    assert says in v.summary, v.summary


def test_many_short_steps_are_not_a_stall():
    """A rank program whose every step is short is not flagged, however long the whole load takes."""
    with watching(0.5):
        out = run_case(SlowSteps(), Case(1, 4))
    assert out.violations == []


def test_watching_rejects_a_non_positive_limit():
    """A zero limit is an error, not a watchdog that fires at once."""
    with pytest.raises(ValueError, match="must be > 0"):
        with watching(0):
            pass


def test_uninterruptible_protocol_code_ends_the_process_with_a_report(tmp_path):
    """Protocol code that blocks the watchdog's signal cannot be interrupted: the process says where and exits 3."""
    script = tmp_path / "blocked.py"
    script.write_text(textwrap.dedent("""
        import signal, time
        from model.protocols import PaperProtocol
        from runtime.watchdog import SIGNAL, watching

        class P(PaperProtocol):
            def rank_lookup(self):
                signal.pthread_sigmask(signal.SIG_BLOCK, {SIGNAL})
                time.sleep(3600)

        with watching(0.3, hard_grace=0.5):
            P().rank_lookup()
    """))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == EXIT_UNINTERRUPTIBLE, run.stderr
    assert "could not be interrupted" in run.stderr and "blocked.py:9 in rank_lookup" in run.stderr


def test_check_reports_a_blocking_protocol_within_its_budget_and_replay_reproduces(tmp_path):
    """`check` on a protocol whose lookup sleeps exits 1 with a termination counterexample that replays."""
    r = sc("check", "--json", "--budget", "4", "--out", str(tmp_path), "--protocol", "tests.stalling:SleepyLookup")
    assert r.returncode == 1, r.stderr
    data = json.loads(r.stdout)
    v = data["violations"][0]
    assert v["property"] == "termination" and "SleepyLookup.rank_lookup did not return" in v["summary"]
    # it ends by itself, well before the supervisor's backstop (budget x 1.5 + 30 s) would end it with exit 3
    assert data["stats"]["seconds"] < 4 * 1.5 + 30
    assert "stalled before" not in v["summary"]  # reported at the full limit, not the shortcut
    trace = json.loads(Path(v["counterexample"]).read_text())
    assert trace["config"]["n_ranks"] == 2 and trace["config"]["n_chunks"] >= 2  # rank 1 stalls from 2 chunks on
    rr = sc("replay", v["counterexample"], "--json")
    assert rr.returncode == 1 and json.loads(rr.stdout)["results"][0]["outcome"] == "reproduces", rr.stderr


def test_pytest_plugin_fails_a_blocking_protocol_instead_of_hanging(tmp_path):
    """`pytest properties/ --protocol <blocking> --stall-seconds 0.5` fails with a termination violation."""
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                          str(ROOT / "properties" / "test_protocol_layer.py"), "--protocol",
                          "tests.stalling:LockedLoad", "--stall-seconds", "0.5", "--found-dir", str(tmp_path)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "HYPOTHESIS_PROFILE": "ci"})
    assert run.returncode == 1, run.stdout + run.stderr
    assert "TerminationViolated" in run.stdout and "LockedLoad.rank_load did not return" in run.stdout
    bad = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                          str(ROOT / "properties" / "test_protocol_layer.py"), "--stall-seconds", "0"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert bad.returncode == 4 and "--stall-seconds and --op-timeout must be > 0" in bad.stderr
    short = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                            str(ROOT / "properties" / "test_store_layer.py"), "--client", "lmcache",
                            "--stall-seconds", "1"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert short.returncode == 4 and "must exceed --op-timeout (2)" in short.stderr, short.stderr


def test_a_stall_in_the_explorer_lookup_is_a_termination_violation():
    """A lookup that stalls in the explorer is a termination violation of that configuration, as in run_case."""
    from checking.api import SearchContext, Target
    from checking.explore.strategy import Explorer
    from runtime.registry import resolve_client, resolve_protocol
    from adapters.catalogue import CLIENTS

    ctx = SearchContext(target=Target(protocol=resolve_protocol(SleepyLookup()), client=resolve_client("model", CLIENTS)),
                        run=run_case)
    with watching(0.3):
        found = Explorer().search(ctx)
    assert found is not None and found.strategy == "explore"
    assert [v.property for v in found.outcome.violations] == ["termination"]
    assert "SleepyLookup.rank_lookup did not return" in found.outcome.violations[0].summary
    with watching(0.3):  # the lazy initial state enumerates each rank's lookup on its own: the same finding
        lazy = explore(SleepyLookup(), 2, 3, lazy=True)
    assert lazy.violation.property == "termination" and "SleepyLookup.rank_lookup" in lazy.violation.summary


def test_pytest_timeout_still_works_under_the_watch(tmp_path):
    """The watch uses its own signal: pytest-timeout (SIGALRM) still fails a test that hangs outside protocol code."""
    (tmp_path / "test_hangs.py").write_text("import time\n\ndef test_hangs():\n    time.sleep(30)\n")
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_hangs.py",
                          "--timeout", "1", "--timeout-method", "signal"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 1 and "Timeout (>1.0s)" in run.stdout, run.stdout + run.stderr


def test_a_protocol_that_catches_every_interruption_ends_the_process(tmp_path):
    """A lookup that swallows every interruption in a loop cannot be stopped: exit 3 with a report, not a hang."""
    script = tmp_path / "swallows.py"
    script.write_text(textwrap.dedent("""
        import time
        from model.protocols import PaperProtocol
        from runtime.watchdog import watching

        class P(PaperProtocol):
            def rank_lookup(self):
                while True:
                    try:
                        time.sleep(3600)
                    except BaseException:
                        pass

        with watching(0.3, hard_grace=0.5):
            P().rank_lookup()
    """))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == EXIT_UNINTERRUPTIBLE, run.stderr
    assert "caught the Stalled raised in it" in run.stderr


def test_the_short_limit_applies_only_where_a_stall_was_raised():
    """After a stall at one line, a legitimately slow call that never sits at that line gets the full limit."""
    with watching(1.0, again=0.1):
        stalled = _only(run_case(SleepsByLength(), Case(1, 2)))
        slow = run_case(SleepsByLength(), Case(1, 1))  # 0.3 s at another line: within the 1 s limit
    assert "SleepsByLength.rank_lookup did not return within its bound of 1 s (+0.25 s grace" in stalled.summary
    assert slow.violations == []
