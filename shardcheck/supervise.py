"""A backstop for protocol code stuck in C: `check` runs in a child process that its parent ends at a deadline.

The watchdog (`runtime.watchdog`) interrupts protocol code that blocks in Python, but it is a Python thread: code
that holds the interpreter in C (a catastrophic regular expression, a C extension's loop) starves it, and no signal
handler runs either. The parent here needs nothing from the child: at `deadline(budget)` it asks the child for its
stack (faulthandler on `DUMP_SIGNAL`, which works without the interpreter), kills it (its Valkey servers die with it:
PDEATHSIG), and exits `EXIT_UNINTERRUPTIBLE` with one line saying why. Output passes straight through; Ctrl-C and
SIGTERM are passed on to the child, which ends cleanly, or is killed after `STOP_SECONDS`. Only the first Ctrl-C
counts, here and in the child (`shardcheck.cli`): a second one never cuts the clean-up short.

The budget counts from the command's start (`started`: this process's start, handed to the child in `STARTED`), and
the child, once its clean-up ran, ends without the interpreter's slow finalisation (`quick_exit`).
"""
from __future__ import annotations

import faulthandler
import os
import signal
import subprocess
import sys
import time

from model.timing import HarnessStarved, wait_judged
from runtime import starvation
from runtime.watchdog import EXIT_UNINTERRUPTIBLE
from shardcheck.errors import EXIT_UNDECIDED

__all__ = ["SUPERVISED", "STARTED", "DUMP_SIGNAL", "deadline", "supervise", "in_child", "started", "quick_exit"]

#: Set in the child's environment; its presence means "do not supervise again".
SUPERVISED = "SHARDCHECK_SUPERVISED"
#: Set in the child's environment: the monotonic time the command started (Linux's CLOCK_MONOTONIC is one clock for
#: every process), so that the child's budget counts the supervisor's start and its own.
STARTED = "SHARDCHECK_STARTED"
#: The most seconds a child may have started after its supervisor for the supervisor's start to count (a stale
#: `STARTED` inherited from elsewhere is not this command's).
STARTED_SLACK = 60.0
#: Extra seconds past `--budget` before the parent ends the child (`SHARDCHECK_SUPERVISOR_GRACE` overrides).
GRACE_SECONDS = 30.0
#: Seconds a child may take to end after Ctrl-C before it is killed (its servers then die with it, but their dirs
#: stay): more than its own bounded clean-up (an engine deployment's close, 4 s, then its servers' stops).
STOP_SECONDS = 15.0
DUMP_SIGNAL = signal.SIGUSR1


def deadline(budget: float) -> float:
    """Seconds the child may run: the budget, the time `check` may take past it to minimise and measure a finding
    (`checking.check.FINISH_GRACE`, one store call's worth more), and a grace for the interpreter's start."""
    from checking.check import FINISH_GRACE
    grace = float(os.environ.get("SHARDCHECK_SUPERVISOR_GRACE", GRACE_SECONDS))
    return budget + 2 * FINISH_GRACE + grace


def _own_start() -> float:
    """When this process started, in `time.monotonic()` seconds (its age from /proc; now where there is none)."""
    now = time.monotonic()
    try:
        with open("/proc/self/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])  # (field 22, starttime: clock ticks since boot)
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return now
    return now - age if 0.0 <= age < 3600.0 else now


def started() -> float | None:
    """In a supervised child, when its command started (monotonic seconds): its supervisor's start (else its own);
    `check` counts its budget from there. None elsewhere: an in-process call counts from its own call."""
    if os.environ.get(SUPERVISED) != "1":
        return None
    own = _own_start()
    try:
        value = float(os.environ.get(STARTED, own))
    except ValueError:
        return own
    return value if own - STARTED_SLACK <= value <= own + 1.0 else own


def quick_exit(code: int) -> None:
    """End a supervised child whose work and clean-up are done: the exit hooks run (servers stopped, files removed),
    the output is flushed, and the interpreter's finalisation, which takes seconds once LMCache and torch are
    imported, is skipped (`os._exit`)."""
    import atexit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def in_child() -> bool:
    """Whether this process is a supervised child (then: install the stack dump on `DUMP_SIGNAL`, and have the
    kernel kill it when its supervisor goes, however it goes: a child stuck in C could not notice)."""
    if os.environ.get(SUPERVISED) != "1":
        return False
    faulthandler.register(DUMP_SIGNAL, all_threads=False)
    _die_with_supervisor()
    return True


def _die_with_supervisor() -> None:
    """PR_SET_PDEATHSIG=SIGKILL (Linux); when the supervisor is already gone, exit at once."""
    parent = os.getppid()
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent or parent == 1:
        os._exit(EXIT_UNINTERRUPTIBLE)


def _exited(child: subprocess.Popen, seconds: float) -> bool:
    try:
        child.wait(timeout=seconds)
        return True
    except subprocess.TimeoutExpired:
        return False


def supervise(argv: list[str], seconds: float, command: str) -> int:
    """Run `python -m shardcheck ARGV` as a child; its exit status, or `EXIT_UNINTERRUPTIBLE` after `seconds`."""
    child = subprocess.Popen([sys.executable, "-m", "shardcheck", *argv],
                             env={**os.environ, SUPERVISED: "1", STARTED: repr(_own_start())})
    previous = signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
    try:
        starvation.start()
        t0 = time.monotonic()
        starved = None
        while True:
            try:  # the deadline judged as every timing is (`model.timing`): in the time the machine let the run have
                waited = wait_judged(lambda s: _exited(child, s), seconds, command, t0=t0)
                if waited is None:
                    return child.wait()
                break
            except HarnessStarved as exc:
                starved = exc.reason
                break
            except KeyboardInterrupt:  # a terminal's Ctrl-C reaches the child too: give it a moment, then pass it on
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # (until exit: a second Ctrl-C must not cut the child's
                #                                                clean-up short, nor end this process before it)
                try:
                    return child.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    child.send_signal(signal.SIGINT)
                try:
                    return child.wait(timeout=STOP_SECONDS)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
                    return 130
        if starved is not None:
            child.kill()
            child.wait()
            print(f"shardcheck {command}: undecided: {starved} (exit {EXIT_UNDECIDED})", file=sys.stderr, flush=True)
            return EXIT_UNDECIDED
        print(f"shardcheck {command}: error: still running {seconds:g} s after it started (its --budget and a "
              "grace); protocol code that cannot be interrupted (stuck in C?) is the likely cause. Its stack:",
              file=sys.stderr, flush=True)
        child.send_signal(DUMP_SIGNAL)
        time.sleep(0.5)
        child.kill()
        child.wait()
        print(f"shardcheck {command}: error: ended the run (exit {EXIT_UNINTERRUPTIBLE})", file=sys.stderr, flush=True)
        return EXIT_UNINTERRUPTIBLE
    finally:
        signal.signal(signal.SIGTERM, previous)
        if child.poll() is None:
            child.kill()
            child.wait()
