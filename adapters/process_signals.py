"""The one process-fault primitive: SIGSTOP a process and wait until the kernel has stopped it, SIGCONT it.

SIGSTOP is delivered asynchronously: `kill` returns before the process stops, so a caller that goes on at once (a
PING that should time out, a client call that should meet a paused server) may still be answered. `stop_process`
waits, bounded, until the process is in state `T` (/proc/PID/stat), and `pause_process` (a fault's) says when it was
not: `HarnessStarved`, the fault not struck, never judged as the subject's; `continue_process` resumes it, a process
already gone being no error. `ValkeyServer.pause`/`resume`, `MooncakeMaster.pause`/`resume` and so the nemesis
(timed and held faults alike) all go through here; a timed pause is also ended by a small process of its own that sends SIGCONT
(`adapters.nemesis.pause`: a client holding the GIL while it waits on the paused server would starve a thread).
"""
from __future__ import annotations

import contextlib
import os
import signal
import time

from model.timing import HarnessStarved

__all__ = ["STOP_WAIT", "process_state", "until_state", "stop_process", "continue_process", "pause_process"]

#: How long `stop_process` waits for the stop to land, at most (seconds).
STOP_WAIT = 1.0


def process_state(pid: int) -> str | None:
    """The state letter of process `pid` (`R`, `S`, `T` for stopped, `Z`...), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def until_state(pid: int, state: str, limit: float) -> bool:
    """Wait (at most `limit` s) until process `pid` is in `state`; whether it is (False: gone, or not in time)."""
    deadline = time.monotonic() + limit
    while True:
        now = process_state(pid)
        if now == state:
            return True
        if now is None or time.monotonic() >= deadline:
            return False
        time.sleep(0.001)


def stop_process(pid: int, limit: float = STOP_WAIT) -> bool:
    """SIGSTOP `pid` and wait (at most `limit` s) until it is stopped; whether it is (False: it is gone)."""
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        return False
    return until_state(pid, "T", limit)


def pause_process(pid: int, what: str, limit: float = STOP_WAIT) -> None:
    """`stop_process`, for a fault: a process still running but not stopped within `limit` s is resumed and the
    machine's doing (`model.timing.HarnessStarved`: the fault did not strike, so nothing about the subject may be
    judged); one that is gone is left to its owner (it died: what follows meets a dead process)."""
    if not stop_process(pid, limit) and process_state(pid) not in (None, "Z"):
        continue_process(pid)  # (left as found: a SIGSTOP that lands late is ended)
        raise HarnessStarved(f"{what} (pid {pid}) was not stopped within {limit:g} s of its SIGSTOP")


def continue_process(pid: int) -> None:
    """SIGCONT `pid` (a process already gone is no error)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)
