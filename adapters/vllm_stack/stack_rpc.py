"""The parent's side of the vLLM process (`adapters.vllm_stack.stack_child`): started clean and tied to this process,
every call bounded, always stopped.

`StackChild(spec, env=..., start_timeout=...)` spawns `python -m adapters.vllm_stack.stack_child FD` through
`adapters.spawning` (PR_SET_PDEATHSIG=SIGKILL from the spawner's long-lived thread: the kernel kills it if this
process dies), in a session of its own (so its tensor-parallel workers share its process group), with its own run
dir as cwd, TMPDIR and VLLM_RPC_BASE_PATH (LMCache's and vLLM's ZMQ socket files, torch's compile cache, the log
`vllm.log`), a marker variable (`SHARDCHECK_VLLM_RUN`) by which anything it left is found in /proc, and the parent's
`sys.path` on PYTHONPATH (a user's `MOD:ATTR` connector must be importable there); `argv_prefix` runs its command
under another that execs it in place (the Mooncake stack's `nsenter --net=...`: the child joins the masters' private
network namespace). The environment:
`VLLM_ENABLE_V1_MULTIPROCESSING=0` (the engine core in the child's own process: the scheduler and its connector can
be read), `HF_HUB_OFFLINE=1`, `LMCACHE_TRACK_USAGE=false`, `VLLM_NO_USAGE_STATS=1`, `PYTHONHASHSEED=0` (LMCache
hashes chunks with Python's `hash()`: without a fixed seed, ranks and processes never agree on a key).

The connection is one end of a `socket.socketpair()` passed as an inherited fd (`multiprocessing.connection`: pickled
messages). `call(name, *args, timeout=...)` sends one request and polls for its answer in slices, checking the child
is alive: a child that dies, or that has not answered within `timeout`, is `StackChildError` carrying the tail of its
log, and is killed (its whole process group) at once: it never hangs the caller. `close()` asks it to shut the engine
core down and waits at most `close_timeout`, then SIGKILLs its process group, kills whatever still carries the marker
and removes the run dir; it returns what was still running afterwards (nothing, normally), and keeps in `close_notes`
what it had to kill. Each child is registered with `runtime.reaper`, whose `atexit` hook kills every one still alive
(and removes its run dir); none starts once the exit began.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from multiprocessing.connection import Connection
from typing import Any

from adapters.spawning import SPAWNER, kill_spawned
from runtime import reaper

__all__ = ["StackChild", "StackChildError", "marked_pids", "MARKER"]

MARKER = "SHARDCHECK_VLLM_RUN"
#: Seconds between liveness checks while waiting for an answer.
_SLICE = 0.2


class StackChildError(RuntimeError):
    """The vLLM process died, did not answer in time, or raised; the message carries the tail of its log."""


def marked_pids(marker: str) -> list[int]:
    """Pids of the processes whose environment carries `SHARDCHECK_VLLM_RUN=marker`."""
    needle = f"{MARKER}={marker}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    out.append(int(entry))
        except OSError:
            continue
    return out


def _kill_marked(marker: str) -> None:
    for pid in marked_pids(marker):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


class StackChild:
    """One vLLM process (see the module docstring)."""

    def __init__(self, spec: dict, *, env: dict[str, str], start_timeout: float, call_timeout: float,
                 close_timeout: float, argv_prefix: list[str] | None = None) -> None:
        self.marker = uuid.uuid4().hex[:12]
        self.run_dir = reaper.temp_dir("shardcheck-vllm-")
        self.log_path = os.path.join(self.run_dir, "vllm.log")
        self.call_timeout, self.close_timeout = call_timeout, close_timeout
        self.close_notes: list[str] = []
        self.proc: subprocess.Popen | None = None
        self.conn: Connection | None = None
        self.dead: str | None = None
        self.info: dict = {}
        #: What the child's command runs under (e.g. `nsenter --net=...`, which execs it: same pid).
        self.argv_prefix = list(argv_prefix or ())
        self._lock = threading.Lock()  # one call at a time on the connection
        try:
            reaper.register(self, self._reap)
        except reaper.Exiting:
            reaper.remove_dir(self.run_dir)
            raise
        try:
            self._start({**spec, "run_dir": self.run_dir}, env, start_timeout)
        except BaseException:
            self.close()
            raise

    def _env(self, extra: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "LMCACHE_"))}
        prefixes = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})
        path = [os.path.abspath(p or os.getcwd()) for p in sys.path]  # the user's dirs, not the interpreter's own
        path = [p for p in path if not p.startswith(prefixes)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env.update({
            MARKER: self.marker, "PYTHONPATH": os.pathsep.join(dict.fromkeys(path)),
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "LMCACHE_TRACK_USAGE": "false", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "PYTHONHASHSEED": "0",
            "TMPDIR": self.run_dir, "VLLM_RPC_BASE_PATH": self.run_dir, "PYTHONUNBUFFERED": "1",
            "TORCHINDUCTOR_CACHE_DIR": os.path.join(self.run_dir, "inductor"),
        })
        env.update(extra)
        return env

    def _start(self, spec: dict, env: dict[str, str], timeout: float) -> None:
        ours, theirs = socket.socketpair()
        try:
            with open(self.log_path, "wb") as log:
                self.proc = SPAWNER.popen(
                    [*self.argv_prefix, sys.executable, "-m", "adapters.vllm_stack.stack_child", str(theirs.fileno())],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                    close_fds=True, pass_fds=(theirs.fileno(),), env=self._env(env), cwd=self.run_dir)
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())
        self.conn.send(spec)
        status, value = self._answer("start", timeout)
        if status != "ready":
            self._fail(f"the vLLM process could not start:\n{value}")
        self.info = value

    # -- calls --------------------------------------------------------------------------------------------------------
    def log_tail(self, lines: int = 30) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no log)"

    def _fail(self, what: str) -> None:
        self.dead = what
        self._kill()
        raise StackChildError(f"{what}\n--- the vLLM process's log, last lines ---\n{self.log_tail()}")

    def _answer(self, name: str, timeout: float) -> tuple[str, Any]:
        assert self.conn is not None and self.proc is not None
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.conn.poll(min(_SLICE, max(0.0, deadline - time.monotonic()))):
                    return self.conn.recv()
                broken = False
            except (EOFError, OSError):
                broken = True
            if not broken and self.proc.poll() is None:
                if time.monotonic() < deadline:
                    continue
                self._fail(f"the vLLM process did not answer {name} within {timeout:g} s")
            try:
                code = self.proc.wait(5.0)
            except subprocess.TimeoutExpired:
                code = None
            how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
            self._fail(f"the vLLM process died during {name} ({how})")

    def call(self, name: str, *args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        """`name(*args, **kwargs)` on the child's driver, answered within `timeout` (default `call_timeout`)."""
        with self._lock:
            if self.dead is not None:
                raise StackChildError(f"the vLLM process is gone ({self.dead})")
            assert self.conn is not None
            try:
                self.conn.send((name, args, kwargs))
            except OSError as exc:
                self._fail(f"the vLLM process's connection broke sending {name}: {exc}")
            status, value = self._answer(name, self.call_timeout if timeout is None else timeout)
        if status == "err":
            raise StackChildError(f"{name} raised in the vLLM process:\n{value}")
        return value

    def alive(self) -> bool:
        return self.dead is None and self.proc is not None and self.proc.poll() is None

    # -- stopping -------------------------------------------------------------------------------------------------------
    def _kill(self) -> None:
        proc = self.proc
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            kill_spawned(proc)
        _kill_marked(self.marker)
        if self.conn is not None:
            with contextlib.suppress(OSError):
                self.conn.close()

    def _reap(self) -> None:
        """At exit (`runtime.reaper`): kill it and whatever carries its marker, remove its run dir."""
        self._kill()
        reaper.remove_dir(self.run_dir)

    def close(self) -> list[str]:
        """Stop the child (see the module docstring); what was still running afterwards."""
        if self.proc is not None and self.alive():
            t = time.monotonic()
            try:
                self.call("close", timeout=self.close_timeout)
                self.proc.wait(max(1.0, self.close_timeout - (time.monotonic() - t)))
            except (StackChildError, subprocess.TimeoutExpired) as exc:
                self.close_notes.append(f"the vLLM process did not end within {self.close_timeout:g} s of its "
                                        f"shutdown: killed ({str(exc).splitlines()[0]})")
        self._kill()
        deadline = time.monotonic() + 5.0
        left = marked_pids(self.marker)
        while left and time.monotonic() < deadline:
            _kill_marked(self.marker)
            time.sleep(0.1)
            left = marked_pids(self.marker)
        reaper.unregister(self)
        reaper.remove_dir(self.run_dir)
        return [f"process {pid} of the vLLM run {self.marker} is still running" for pid in left]

