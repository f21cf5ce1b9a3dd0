"""Mooncake masters that shardcheck starts: one `mooncake_master` per rank, all in one private network namespace.

Why a namespace: the Mooncake client (`mooncake.store.MooncakeDistributedStore`, the transfer engine in it) binds its
handshake and TCP-transport listeners on 0.0.0.0 / [::] whatever its flags say (`MC_TCP_BIND_ADDRESS` included), and the
master's HTTP metadata server binds 0.0.0.0 whatever `--http_metadata_server_host` says. So nothing Mooncake runs here
lives in the host's network namespace: `MooncakeNet` holds a fresh one (`unshare -n`, only `lo`, brought up; one per
process, `shared_net`, kept until `shutdown()` or exit), every
master is started in it (`nsenter --net`), and every client runs its calls on threads that joined it (`setns`, per
thread: `MooncakeNet.executor`; the client's own threads are made by those and inherit it). On the host, nothing
listens; inside, the masters bind 127.0.0.1 (`--rpc_address`, `--metrics_host`) on ports free in that namespace.
Metadata is `P2PHANDSHAKE` (no metadata server).

Always stopped: every process (the namespace's holder, each master) is spawned through `adapters.spawning` (its exec
wrapper sets PR_SET_PDEATHSIG=SIGKILL: the kernel kills them when this process goes), stopped with SIGKILL (the master
does not always act on SIGTERM; a paused one never), by `MasterSet.stop()`, the context manager, `shutdown()` and at
exit (each is registered with `runtime.reaper` before it starts: none starts once the exit began);
Ctrl-C unwinds the context managers. Every wait is bounded (`READY_TIMEOUT`).

`MooncakeMaster` offers what `adapters.nemesis` strikes a server's process with: `pause()` (SIGSTOP), `resume()`,
`kill()` and `respawn()` (on its port, empty: a master keeps its metadata in memory only), `pid`, `port`, `running()`,
and `takes(kind)`, whether it can take a server fault kind (no admin commands: Mooncake speaks no RESP).

`unavailable()`: why Mooncake cannot run here (not installed, the Debian libraries missing, not root for `unshare`),
or None; the factories and tests answer that reason.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import ctypes
import os
import select
import shutil
import socket
import subprocess
import threading
import time
from typing import Any, Callable, Iterator, Sequence

from adapters.process_signals import continue_process, pause_process
from adapters.spawning import SPAWNER, kill_spawned
from model.timing import HarnessStarved
from runtime import reaper

__all__ = ["MooncakeNet", "MooncakeMaster", "MasterSet", "start_masters", "shared_net", "shutdown", "mooncake_masters", "unavailable",
           "master_binary", "live_pids", "READY_TIMEOUT", "master_takes"]

HOST = "127.0.0.1"
READY_TIMEOUT = 15.0
_CLONE_NEWNET = 0x40000000


def master_takes(kind: Any) -> bool:
    """Whether a master can take the real-server fault `kind` (a `model.faults.FaultKind`): those on its process
    that need no snapshot (it keeps nothing on disk); it takes no RESP admin command."""
    return bool(kind.needs_process) and kind.loses != "snapshot"


def live_pids() -> list[int]:
    """The pids of every Mooncake process (holders and masters) this process started and has not stopped yet."""
    return sorted(p for obj in reaper.live((MooncakeNet, MooncakeMaster)) for p in obj.pids())


def master_binary() -> str:
    """The `mooncake_master` ELF of the installed wheel (its `bin/mooncake_master` is a Python exec wrapper)."""
    import mooncake

    return os.path.join(os.path.dirname(mooncake.__file__), "mooncake_master")


_UNAVAILABLE: list[str | None] = []


def unavailable() -> str | None:
    """Why the Mooncake store cannot run here (one line), or None when it can."""
    if _UNAVAILABLE:
        return _UNAVAILABLE[0]
    reason: str | None = None
    try:
        from mooncake.store import MooncakeDistributedStore  # noqa: F401  (loads store.so: the Debian libraries)

        if not os.access(master_binary(), os.X_OK):
            reason = f"no mooncake_master binary at {master_binary()}"
    except ImportError as exc:
        reason = (f"the Mooncake client does not import ({exc}); requirements/install-mooncake.sh installs it "
                  "(as root: with libibverbs1 libnl-3-200 libnl-route-3-200)")
    if reason is None:
        missing = [tool for tool in ("unshare", "nsenter", "ip") if shutil.which(tool) is None]
        if missing:
            reason = f"{', '.join(missing)} not found (util-linux, iproute2): the masters need a network namespace"
        elif os.geteuid() != 0:
            reason = "not root: the Mooncake masters run in a private network namespace (unshare -n needs root)"
    _UNAVAILABLE.append(reason)
    return reason


class MooncakeNet:
    """A private network namespace (only `lo`, up), held by a sleeping process; see the module doc."""

    def __init__(self, timeout: float = READY_TIMEOUT) -> None:
        self.proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._executors: list[cf.ThreadPoolExecutor] = []
        try:
            reaper.register(self, self.stop)
        except reaper.Exiting:
            raise RuntimeError("the Mooncake namespace was not made: the process is exiting") from None
        try:
            self.proc = SPAWNER.popen(
                ["/usr/bin/env", "unshare", "-n", "--", "/bin/sh", "-c",
                 "ip link set lo up && echo ready && exec sleep 2147483647"],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True)
            ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
            line = self.proc.stdout.readline() if ready else b""  # type: ignore[union-attr]
            if line.strip() != b"ready":
                raise RuntimeError(f"the network namespace was not ready within {timeout:g} s "
                                   f"(unshare -n: exit code {self.proc.poll()})")
            self.path = f"/proc/{self.proc.pid}/ns/net"
        except BaseException:
            self.stop()
            raise

    def pids(self) -> list[int]:
        return [self.proc.pid] if self.proc is not None and self.proc.poll() is None else []

    def enter(self) -> None:
        """Move the calling THREAD into the namespace (sockets it makes from now on, and threads it starts, live
        there)."""
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns({self.path}): {os.strerror(err)}")
        finally:
            os.close(fd)

    def executor(self, workers: int, name: str) -> cf.ThreadPoolExecutor:
        """A thread pool whose threads live in the namespace (shut down with it)."""
        pool = cf.ThreadPoolExecutor(workers, thread_name_prefix=name, initializer=self.enter)
        with self._lock:
            self._executors.append(pool)
        return pool

    def run(self, fn: Callable[[], Any], timeout: float) -> Any:
        """`fn()` on a fresh daemon thread in the namespace, waited for at most `timeout` s (TimeoutError past it)."""
        fut: cf.Future = cf.Future()

        def go() -> None:
            try:
                self.enter()
                fut.set_result(fn())
            except BaseException as exc:  # handed to the caller
                fut.set_exception(exc)

        threading.Thread(target=go, name="shardcheck-mooncake-ns", daemon=True).start()
        return fut.result(timeout)

    def free_port(self) -> int:
        """A TCP port free on 127.0.0.1 inside the namespace."""
        def pick() -> int:
            with socket.socket() as s:
                s.bind((HOST, 0))
                return int(s.getsockname()[1])
        return int(self.run(pick, 5.0))

    def listening(self, port: int, timeout: float = 0.5) -> bool:
        def probe() -> bool:
            try:
                with socket.create_connection((HOST, port), timeout=timeout):
                    return True
            except OSError:
                return False
        try:
            return bool(self.run(probe, timeout + 2.0))
        except cf.TimeoutError:
            return False

    def nsenter(self, argv: Sequence[str]) -> list[str]:
        """`argv` run in the namespace (nsenter execs it: same pid)."""
        return ["/usr/bin/env", "nsenter", f"--net={self.path}", "--", *argv]

    def stop(self) -> None:
        with self._lock:
            pools, self._executors = self._executors, []
        for pool in pools:
            pool.shutdown(wait=False, cancel_futures=True)
        proc, self.proc = self.proc, None
        kill_spawned(proc)
        if proc is not None and proc.stdout is not None:
            proc.stdout.close()
        reaper.unregister(self)


class MooncakeMaster:
    """One `mooncake_master` in `net` on 127.0.0.1: its RPC port (what clients name) and its metrics port."""

    takes = staticmethod(master_takes)
    #: What `adapters.nemesis` needs to know: this server takes no RESP admin commands.
    resp = False

    def __init__(self, net: MooncakeNet, *, lease_ttl_ms: int | None = None, rpc_threads: int = 2) -> None:
        self.net = net
        self.lease_ttl_ms = lease_ttl_ms
        self.rpc_threads = rpc_threads
        self.port: int | None = None
        self.metrics_port: int | None = None
        self.proc: subprocess.Popen | None = None
        self.fresh: subprocess.Popen | None = None  # spawned for it, not yet its `proc` (`adapters.spawning`)
        self.dir: str | None = None
        self.paused = False
        self.start_seconds: float | None = None
        self._stopped = False
        self._lock = threading.RLock()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def pids(self) -> list[int]:
        return [self.proc.pid] if self.running() else []

    def argv(self) -> list[str]:
        args = [master_binary(), f"--rpc_address={HOST}", f"--rpc_port={self.port}", f"--metrics_host={HOST}",
                f"--metrics_port={self.metrics_port}", f"--rpc_thread_num={self.rpc_threads}",
                f"--log_dir={self.dir}"]
        if self.lease_ttl_ms is not None:
            args.append(f"--default_kv_lease_ttl={int(self.lease_ttl_ms)}")
        return args

    def start(self, timeout: float = READY_TIMEOUT) -> None:
        try:
            reaper.register(self, self.stop)
        except reaper.Exiting:
            raise RuntimeError("mooncake_master not started: the process is exiting") from None
        try:
            self.dir = reaper.temp_dir("shardcheck-mooncake-")
            self.port, self.metrics_port = self.net.free_port(), self.net.free_port()
            self._spawn(timeout)
        except BaseException:
            self.stop()
            raise

    def _spawn(self, timeout: float) -> None:
        t0 = time.monotonic()
        self.paused = False
        out = open(os.path.join(self.dir or ".", "master.out"), "ab")
        try:
            proc = SPAWNER.popen(self.net.nsenter(self.argv()), self, stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
        finally:
            out.close()
        with self._lock:
            self.fresh = None
            if self._stopped:
                kill_spawned(proc)
                raise RuntimeError("mooncake_master was stopped while it started")
            self.proc = proc
        deadline = t0 + timeout
        # the metrics (admin) server comes up after the RPC socket: a client's first RPCs must not race its start
        while not (self.net.listening(int(self.port)) and self.net.listening(int(self.metrics_port))):  # type: ignore
            code = proc.poll()
            if code is not None or time.monotonic() > deadline:
                tail = self.log_tail()
                what = f"exited with code {code}" if code is not None else f"did not listen within {timeout:g} s"
                raise RuntimeError(f"mooncake_master on {self.address} (in its network namespace) {what}; {tail}")
            time.sleep(0.02)
        self.start_seconds = time.monotonic() - t0

    def log_tail(self, lines: int = 8) -> str:
        try:
            with open(os.path.join(self.dir or "", "master.out"), encoding="utf-8", errors="replace") as f:
                return "log tail:\n" + "".join(f.readlines()[-lines:])
        except OSError:
            return "(no log)"

    # -- what the nemesis strikes with ------------------------------------------------------------------------------
    def pause(self) -> None:
        """SIGSTOP the master, back once it is stopped (`adapters.process_signals`)."""
        with self._lock:
            if self.running():
                self.paused = True  # (first: a SIGSTOP that lands late is still resumed by `stop`)
                try:
                    pause_process(self.proc.pid, "a Mooncake master")  # type: ignore[union-attr]
                except HarnessStarved:  # (not paused: `pause_process` resumed it)
                    self.paused = False
                    raise

    def resume(self) -> None:
        """SIGCONT a paused master (a no-op otherwise)."""
        with self._lock:
            if self.running():
                continue_process(self.proc.pid)  # type: ignore[union-attr]
            self.paused = False

    def kill(self, *, keep_data: bool = False) -> None:
        """SIGKILL and reap; its ports and dir stay for `respawn()`. A master keeps nothing on disk: it comes back
        empty whatever `keep_data` says (the nemesis never asks it for data: `takes`)."""
        with self._lock:
            proc, self.proc = self.proc, None
            self.paused = False
        kill_spawned(proc)

    def respawn(self, timeout: float = READY_TIMEOUT) -> bool:
        with self._lock:
            if self._stopped or self.dir is None:
                return False
            if self.running():
                return True
            self._spawn(timeout)
            return True

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            proc, self.proc = self.proc, None
            fresh, self.fresh = self.fresh, None
            self.paused = False
        kill_spawned(proc, fresh)  # SIGKILL: a paused master or one busy in its shutdown never lingers
        if self.dir is not None:
            reaper.remove_dir(self.dir)
            self.dir = None
        reaper.unregister(self)


class MasterSet:
    """One master per rank in one namespace; `stop()` stops them and the namespace (idempotent)."""

    def __init__(self, net: MooncakeNet, masters: Sequence[MooncakeMaster]) -> None:
        self.net = net
        self.masters = list(masters)
        self.servers = self.masters  # (the name `ServerSet` uses)

    @property
    def addresses(self) -> list[str]:
        return [m.address for m in self.masters]

    def pids(self) -> list[int]:
        return [p for m in self.masters for p in m.pids()]

    def stop(self) -> None:
        """Stop the masters (the namespace stays: `shared_net`)."""
        for m in self.masters:
            m.stop()

    def __len__(self) -> int:
        return len(self.masters)

    def __enter__(self) -> "MasterSet":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_NET: list[MooncakeNet] = []
_NET_LOCK = threading.Lock()


def shared_net(timeout: float = READY_TIMEOUT) -> MooncakeNet:
    """This process's one namespace for Mooncake, made on first use and kept until `shutdown()` (or exit).

    One per process, not one per master set: the client library keeps process-wide I/O threads (its RPC client's
    io_context pool) that make the connections to the masters, and a thread lives in the namespace it was made in.
    Masters of a later set in a second namespace would be unreachable from them ("Client not available")."""
    with _NET_LOCK:
        if _NET and _NET[0].proc is not None and _NET[0].proc.poll() is None:
            return _NET[0]
        _NET.clear()
        _NET.append(MooncakeNet(timeout))
        return _NET[0]


def shutdown() -> None:
    """Stop every master and the namespace (what `atexit` does); a later master set makes a new namespace, which
    this process's Mooncake clients cannot reach (see `shared_net`): for the end of a run or a test module. None
    starts while it runs; a RuntimeError names what did not stop."""
    problems = reaper.reap((MooncakeNet, MooncakeMaster))  # (the masters first: the last registered stop first)
    with _NET_LOCK:
        _NET.clear()
    if problems:  # (what did not stop stays registered: the exit tries it again)
        raise RuntimeError("Mooncake shutdown: " + "; ".join(problems))


def start_masters(n: int, *, lease_ttl_ms: int | None = None, timeout: float = READY_TIMEOUT) -> MasterSet:
    """`n` masters (one per rank) in this process's namespace; RuntimeError with the reason when Mooncake cannot
    run."""
    reason = unavailable()
    if reason:
        raise RuntimeError(reason)
    net = shared_net(timeout)
    masters: list[MooncakeMaster] = []
    try:
        for _ in range(n):
            m = MooncakeMaster(net, lease_ttl_ms=lease_ttl_ms)
            masters.append(m)
            m.start(timeout)
    except BaseException:
        MasterSet(net, masters).stop()
        raise
    return MasterSet(net, masters)


@contextlib.contextmanager
def mooncake_masters(n: int, **kw: Any) -> Iterator[MasterSet]:
    masters = start_masters(n, **kw)
    try:
        yield masters
    finally:
        masters.stop()
