"""Real-client replays in children forked from one process per pytest worker that imported LMCache once.

Each fresh Python that imports LMCache spends about 5 s of CPU (torch, transformers). `LMCacheForks.run(job, *args,
timeout=...)` runs `job(*args)` (a function of this module) in a child forked from a server process that imported
LMCache's store clients once, with no other thread running (checked: it refuses to serve otherwise). What a child
process per replay gave is kept: each job has a process of its own (a wedged stock client's threads die with it; a
glide replay still forks a fresh child per run, `replays_in_forks`), every wait is bounded (past its timeout the job's
process group is killed and `run` raises `ForkedJobFailed` saying so), its output goes to a log whose tail a failure
shows, and nothing is left behind: `stop()` (at session end, at exit, after any failure of the server) ends the server
and the job's whole process group, and the server ends itself when its parent goes away.

Not `multiprocessing`'s forkserver: that is one per process with one preload list, which adapters.processes,
adapters.tier_measure and adapters.lmcache_engine.process_deployment already set for their own processes in the same
pytest worker.
"""
from __future__ import annotations

import atexit
import importlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
#: What the server imports before it forks (adapters.lmcache_stores first: it sets LMCache's log level), then the
#: modules `adapters.storeops_findings._LMCACHE_MODULES` names.
PRELOAD = ("adapters.lmcache_stores", "adapters.lmcache_native", "adapters.patched", "adapters.storeops_findings",
           "adapters.racy_findings", "checking.replay", "runtime.registry", "model.trace")
#: Seconds the server may take to import LMCache (about 5 s of CPU; generous for a busy 2-core machine).
START_SECONDS = 180.0
#: Seconds the server may take to say it forked a job.
FORK_SECONDS = 30.0
_SERVER_CONN: Any = None


class ForkedJobFailed(RuntimeError):
    """A forked job raised, died, or gave no answer within its timeout (its process group was killed)."""


# --------------------------------------------------------------------------- the jobs (run in a forked child)

def repeat_replays(path: str, runs: int = 10) -> list[tuple[str, str]]:
    """(outcome, why) of `runs` replays of a store-ops trace on the client it records."""
    from adapters.storeops_findings import _factory, replay, replays_in_forks
    from model.trace import Trace
    t = Trace.load(path)
    if t.client == "lmcache-valkey":  # a failed glide connect leaves retrying threads: each replay in a fresh fork
        return replays_in_forks(path.rsplit("lmcache-", 1)[1][:-5], t.client, runs)
    return [replay(t, _factory(t.client)) for _ in range(runs)]


def removable_ops(path: str) -> list[int]:
    """The ops of a store-ops trace whose removal keeps its violation on the client it records."""
    from adapters.storeops_findings import _factory, kept_by_removal
    from model.trace import Trace
    t = Trace.load(path)
    return kept_by_removal(t, _factory(t.client))


def racy_verdicts(path: str) -> list[tuple[str, str]]:
    """(outcome, why) of a racy trace judged by its rate on the client it records, then on lmcache-patched."""
    from adapters.racy_findings import OPTIONS
    from checking.layers import ReplayOn
    from checking.replay import judge
    from model.trace import Trace
    from runtime.registry import resolve_client
    from adapters.catalogue import CLIENTS
    t = Trace.load(path)
    out = []
    for name in (t.client, "lmcache-patched"):
        client = resolve_client(name, CLIENTS)
        verdict = judge(t, ReplayOn(client=client, options=client.accepted(OPTIONS)))
        out.append((verdict.outcome, verdict.why))
    return out


def forked_replay_failures() -> list:
    """`replays_in_forks` on a finding that does not exist (its error, the forks left), then beside a thread."""
    from adapters.storeops_findings import replays_in_forks
    out: list = []
    try:
        replays_in_forks("no-such-finding", "lmcache-valkey", 3, at_once=3)
    except RuntimeError as exc:
        out.append(str(exc))
    out.append(len(multiprocessing.active_children()))
    threading.Thread(target=time.sleep, args=(1,)).start()
    try:
        replays_in_forks("valkey-auth-swapped", "lmcache-valkey", 1)
    except RuntimeError as exc:
        out.append(str(exc))
    return out


# --------------------------------------------------------------------------- the server and its children

def _kill_group(pid: int) -> None:
    """SIGKILL the process group a job leads (its forks included), and the job itself."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _job(job: Callable[..., Any], args: tuple, log: str, conn: Any) -> None:
    """In the forked child: its own process group, its output to `log`, the answer to the server."""
    try:
        os.setpgrp()
        _SERVER_CONN.close()  # (only the server talks to the parent: its end of that pipe is not the job's)
        fd = os.open(log, os.O_WRONLY | os.O_APPEND)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        answer: tuple = ("ok", job(*args))
    except BaseException:  # noqa: BLE001 - whatever the job raised is its answer
        answer = ("error", traceback.format_exc())
    try:
        try:
            conn.send(answer)
        except Exception:  # noqa: BLE001 - a value that cannot be sent is the job's error, not a silent death
            conn.send(("error", traceback.format_exc()))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # a failed glide connect leaves retrying threads behind: do not wait for them


def _serve_one(ctx: Any, conn: Any, job: Callable[..., Any], args: tuple, log: str) -> None:
    mine, theirs = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_job, args=(job, args, log, theirs), name="shardcheck-forked-job")
    proc.start()
    theirs.close()
    try:
        try:
            os.setpgid(proc.pid, proc.pid)  # (the child does it too: whichever runs first, the group exists now)
        except OSError:
            pass
        conn.send(("started", proc.pid))
        if mine not in multiprocessing.connection.wait([mine, conn]):
            return  # the parent spoke or went away while the job ran: it gave up on the job
        try:
            answer = mine.recv()
        except EOFError:
            answer = None
        _kill_group(proc.pid)  # (before the join: a pid not reaped yet is still the job's, never another's)
        proc.join(10)
        conn.send(answer if answer is not None else ("died", proc.exitcode))
    finally:
        if proc.exitcode is None:
            _kill_group(proc.pid)
        proc.join(5)
        mine.close()


def _serve(conn: Any, preload: tuple[str, ...]) -> None:
    """The server: import LMCache once, then fork a child per job the parent sends, until it sends None or goes."""
    global _SERVER_CONN
    _SERVER_CONN = conn
    os.chdir(ROOT)
    os.environ["LMCACHE_TRACK_USAGE"] = "false"
    cpu = time.process_time()
    for name in preload:
        importlib.import_module(name)
    from adapters.storeops_findings import _LMCACHE_MODULES
    for name in _LMCACHE_MODULES:
        importlib.import_module(name)
    threads = threading.active_count()
    conn.send(("ready", threads, round(time.process_time() - cpu, 2)))
    if threads > 1:
        return
    ctx = multiprocessing.get_context("fork")
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            return
        if request is None:
            return
        try:
            _serve_one(ctx, conn, *request)
        except (EOFError, OSError, KeyboardInterrupt):  # the parent went away: so does the server
            return


class LMCacheForks:
    """The parent's side: `run(job, *args, timeout=...)`; the server starts on the first run, `stop()` ends it."""

    def __init__(self) -> None:
        self._proc: Any = None
        self._conn: Any = None
        #: CPU seconds the server spent importing what it preloads (0.0 until it started).
        self.import_seconds = 0.0

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, theirs = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(theirs, PRELOAD), name="shardcheck-lmcache-forks")
        self._proc.start()
        theirs.close()
        atexit.register(self.stop)
        try:
            if not self._conn.poll(START_SECONDS):
                raise ForkedJobFailed(f"the LMCache fork server did not import LMCache within {START_SECONDS:g} s")
            _, threads, self.import_seconds = self._conn.recv()
        except BaseException as exc:  # (it died importing, a timeout, Ctrl-C)
            self.stop()
            if isinstance(exc, EOFError):
                raise ForkedJobFailed("the LMCache fork server died importing LMCache (its error is above)") from None
            raise
        if threads > 1:
            self.stop()
            raise ForkedJobFailed(f"the LMCache fork server runs {threads - 1} other thread(s) after importing "
                                  "LMCache: forking it could copy a lock one of them holds")

    def run(self, job: Callable[..., Any], *args: Any, timeout: float) -> Any:
        """`job(*args)` in a child forked from the server; its value, or `ForkedJobFailed` (raised, died, timed out)."""
        if self._proc is None:
            self._start()
        what = f"{job.__name__}{args!r}"
        fd, log = tempfile.mkstemp(prefix="shardcheck-forked-job-", suffix=".log")
        os.close(fd)
        pid, answered = None, False
        try:
            self._conn.send((job, args, log))
            if not self._conn.poll(FORK_SECONDS):
                raise ForkedJobFailed(f"{what}: the LMCache fork server did not fork it within {FORK_SECONDS:g} s")
            _, pid = self._conn.recv()
            if not self._conn.poll(timeout):
                raise ForkedJobFailed(f"{what}: no answer within {timeout:g} s (its processes were killed)"
                                      + _tail(log))
            status, value = self._conn.recv()
            answered = True  # (the server ends the job and its group, and waits for the next)
            if status == "ok":
                return value
            raise ForkedJobFailed(f"{what}: " + (f"raised\n{value}" if status == "error" else
                                                 f"died (exit {value}) without answering") + _tail(log))
        except (EOFError, OSError) as exc:
            if pid is not None:  # (an orphaned job, perhaps a wedged stock client: it goes too)
                _kill_group(pid)
            self.stop()
            raise ForkedJobFailed(f"{what}: the LMCache fork server went away ({type(exc).__name__})"
                                  + _tail(log)) from None
        except BaseException:  # no answer (a timeout, Ctrl-C): the job's processes and the server go
            if not answered:
                if pid is not None:
                    _kill_group(pid)
                self.stop()
            raise
        finally:
            os.unlink(log)

    def stop(self) -> None:
        """End the server (it kills a job still running) and forget it; the next `run` starts a new one."""
        proc, conn, self._proc, self._conn = self._proc, self._conn, None, None
        if proc is None:
            return
        try:
            conn.send(None)
        except OSError:
            pass
        conn.close()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join(10)
        atexit.unregister(self.stop)


def _tail(log: str, chars: int = 3000) -> str:
    text = Path(log).read_text(errors="replace")[-chars:] if os.path.exists(log) else ""
    return f"\n--- its output (last {chars} characters) ---\n{text}" if text.strip() else ""
