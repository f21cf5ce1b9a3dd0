"""Processes tied to this one: every valkey-server (and helper process) is spawned from one long-lived daemon thread,
through a small exec wrapper that sets PR_SET_PDEATHSIG=SIGKILL, so the kernel kills them when this process goes.

PR_SET_PDEATHSIG fires when the *thread* that spawned the child exits, hence one thread that lives as long as the
process (not a short-lived worker). A caller interrupted while it waits (Ctrl-C) abandons its job, and the process
made for it is killed and reaped; an `owner` (a `ValkeyServer`) holds the process as its `fresh` one from the spawner's
side, before the caller gets it back, so an interrupt landing in between leaves nothing its stop does not reap.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from typing import Any

__all__ = ["SPAWNER", "Spawner", "kill_spawned", "spawn_tied", "with_deathsig"]

#: The wrapper: asks the kernel to SIGKILL it when its parent thread goes (PR_SET_PDEATHSIG = 1, kept across exec),
#: checks that parent is still there, and execs the program in place (same pid). Doing it in the wrapper rather than in
#: a `preexec_fn` lets Python spawn without running fork handlers: a client library's handler (valkey-glide's) stalled
#: forked children for seconds before exec.
_DEATHSIG_EXEC = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(1)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n")


def with_deathsig(argv: list[str]) -> list[str]:
    """`argv` run through the wrapper."""
    return [sys.executable, "-S", "-c", _DEATHSIG_EXEC, str(os.getpid()), *argv]


class Spawner:
    """One daemon thread that spawns every process (see the module doc)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._jobs: list[tuple[list[str], dict, list, Any]] = []
        self._thread: threading.Thread | None = None

    def popen(self, argv: list[str], owner: Any = None, **kw) -> subprocess.Popen:
        """The process spawned from the spawner thread; a caller interrupted while it waits abandons the job (its
        process is killed and reaped), and `owner` (a server) holds it as `fresh` from the moment it exists."""
        box: list = []
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="shardcheck-valkey-spawner", daemon=True)
                self._thread.start()
            self._jobs.append((argv, kw, box, owner))
            self._cond.notify_all()
            try:
                while not box:
                    self._cond.wait()
            except BaseException:
                if box:
                    kill_spawned(box[0])
                else:
                    box.append(_ABANDONED)
                raise
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs:
                    self._cond.wait()
                argv, kw, box, owner = self._jobs.pop(0)
            try:
                result: object = None if box else subprocess.Popen(with_deathsig(argv), **kw)
            except BaseException as e:  # handed back to the caller
                result = e
            with self._cond:
                if box:  # the caller gave up waiting: nobody owns this process
                    kill_spawned(result)
                else:
                    box.append(result)
                    if owner is not None and not isinstance(result, BaseException):
                        owner.fresh = result  # (no signal handler runs on this thread: no exception between)
                self._cond.notify_all()


#: What an interrupted caller leaves in its job's box: the spawner kills what it spawns for it.
_ABANDONED = object()


def kill_spawned(*results: object) -> None:
    """Kill and reap each spawned process given (None, an exception or an abandoned job's mark: nothing to do)."""
    for result in results:
        if result is not None and result is not _ABANDONED and not isinstance(result, BaseException):
            with contextlib.suppress(ProcessLookupError):
                result.kill()  # type: ignore[attr-defined]
            result.wait()  # type: ignore[attr-defined]


SPAWNER = Spawner()


def spawn_tied(argv: list[str]) -> subprocess.Popen:
    """A helper process that dies with this one (PR_SET_PDEATHSIG from the spawner thread), no stdio."""
    return SPAWNER.popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         close_fds=True)
