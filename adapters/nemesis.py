"""The nemesis: real faults on the real Valkey servers, struck while a client runs.

Module functions act on one server (`ValkeyServer` for the faults that need its process, an `Endpoint` for the ones
a server's own admin commands make) and return a `Strike`, the record of one fault: when it struck, when it was
over (`healed_at`), and `heal()` to end it at once. Each returns as soon as the fault is in place; the ones that last
(`pause`, `kill_restart`, `debug_sleep`, `client_pause`) end by themselves after `seconds`:

- `pause(server, seconds)`: SIGSTOP, then SIGCONT (a GC pause, a noisy neighbour);
- `kill_restart(server, keep_data=False, seconds)`: SIGKILL, down for `seconds`, started again on the same port;
  `keep_data=True` runs SAVE first and the server loads that snapshot (an operator's restart), else it comes back empty;
- `kill_connections(server)`: CLIENT KILL TYPE normal (a proxy that drops connections);
- `debug_sleep(server, seconds)`: DEBUG SLEEP (the server blocks its event loop);
- `client_pause(server, seconds)`: CLIENT PAUSE ALL (the server holds every client's commands);
- `evict_by_policy(server)`: maxmemory with allkeys-lru, filled by another prompt's chunks so the server evicts by
  its own policy; the limit and the filler go at `heal()`.

`Nemesis` is `model.faults.ServerControl` over one store set (a target per rank): the fault kinds of
`model.faults` strike through it (`kind.strike(nemesis, fault)`), it records every strike, and `close()` ends them
all. A paused server is always resumed and a killed one started again or stopped: by its timer, `heal()`, `close()`,
or `ValkeyServer.stop()` (atexit and the signal hooks of `adapters.valkey_servers` included).

`Nemesis` is also `model.faults.HeldControl`, the held form the serving layers' `fault` steps use (an engine
deployment's, the vLLM stacks'): `hold(rank, action)` pauses a rank's server until `resume`, kills it until `restart`
(`model.faults.HELD_ACTIONS`), with the same primitives (`pause()`, `kill()`, `respawn()` of the server's process,
SIGSTOP through `adapters.process_signals`); `reachable(rank)`, `down`, `resume_all()` (every exit path of their
owner: a paused server never outlives a case; `close()` too) and `restore_all()` (paused ones resumed, killed ones
started again: a fresh case).
"""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any, Callable, Sequence

import attrs

from adapters.valkey_servers import HOST, ValkeyServer, resp_command, server_on, spawn_tied
from adapters.resp import command as _cmd
from model.faults import check_held
from model.timing import FaultNotEnded

__all__ = ["Endpoint", "Strike", "pause", "kill_restart", "kill_connections", "debug_sleep", "client_pause",
           "evict_by_policy", "Nemesis", "NemesisUnavailable", "endpoint_of", "control_maker"]

#: Bytes of filler ("another prompt's chunks") `evict_by_policy` writes, at least; and the size of one.
FILL_BYTES, FILL_CHUNK = 512 * 1024, 4096


class NemesisUnavailable(ValueError):
    """A fault that cannot strike this store set (a server shardcheck did not start, an unknown endpoint)."""


@attrs.frozen
class Endpoint:
    """A server known only by its address (one a user passed with `urls=`): its admin commands, no process."""

    host: str
    port: int
    password: str | None = None


def _addr(server: ValkeyServer | Endpoint) -> tuple[str, int, str | None]:
    if isinstance(server, ValkeyServer):
        return HOST, int(server.port), server.password  # type: ignore[arg-type]
    if _is_process(server):  # another server's process (a Mooncake master): no password, on 127.0.0.1
        return HOST, int(server.port), None
    return server.host, server.port, server.password


def _is_process(server: Any) -> bool:
    """A server process shardcheck started: a `ValkeyServer`, or another server's (a store's `server_process`,
    e.g. `adapters.mooncake_servers.MooncakeMaster`) with `pause`, `resume`, `kill`, `respawn` and `pid`."""
    return isinstance(server, ValkeyServer) or all(
        callable(getattr(server, m, None)) for m in ("pause", "resume", "kill", "respawn"))


def _admin(server: ValkeyServer | Endpoint, *args: str, timeout: float = 2.0) -> bytes:
    host, port, password = _addr(server)
    return resp_command(host, port, password, *args, timeout=timeout)


def _process(server: ValkeyServer | Endpoint, what: str) -> ValkeyServer:
    if not _is_process(server):
        raise NemesisUnavailable(f"{what} needs the server's process: {server.host}:{server.port} was not started "
                                 "by shardcheck")
    return server


@attrs.define(eq=False)
class Strike:
    """One fault on one server: its kind, when it struck and when it was over (monotonic seconds)."""

    kind: str
    port: int
    seconds: float
    struck_at: float
    healed_at: float | None = None
    error: str | None = None
    _end: Callable[[], None] = attrs.field(default=lambda: None, repr=False)
    _lock: Any = attrs.field(factory=threading.Lock, repr=False)
    _done: Any = attrs.field(factory=threading.Event, repr=False)
    _timer: Any = attrs.field(default=None, repr=False)

    def heal(self) -> None:
        """End the fault now (idempotent); a failure to end it is recorded in `error`."""
        with self._lock:
            if self._done.is_set():
                return
            if self._timer is not None:
                self._timer.cancel()
            try:
                self._end()
            except Exception as exc:  # noqa: BLE001 - recorded: the strike's record says it could not be ended
                self.error = f"{type(exc).__name__}: {exc}"
            self.healed_at = time.monotonic()
            self._done.set()

    def wait(self, timeout: float) -> bool:
        """Whether the fault is over within `timeout` seconds."""
        return self._done.wait(timeout)

    def to_json(self, t0: float) -> dict:
        return {"kind": self.kind, "port": self.port, "seconds": self.seconds, "struck": round(self.struck_at - t0, 4),
                "healed": None if self.healed_at is None else round(self.healed_at - t0, 4), "error": self.error}


def _strike(kind: str, server: ValkeyServer | Endpoint, seconds: float, end: Callable[[], None]) -> Strike:
    """A strike that ends itself (`end()`) after `seconds` (at once when `seconds` is 0)."""
    s = Strike(kind=kind, port=_addr(server)[1], seconds=seconds, struck_at=time.monotonic(), end=end)
    if seconds <= 0:
        s.heal()
    else:
        s._timer = threading.Timer(seconds, s.heal)
        s._timer.daemon = True
        s._timer.name = f"shardcheck-nemesis-{kind}"
        s._timer.start()
    return s


def pause(server: ValkeyServer, seconds: float) -> Strike:
    """SIGSTOP the server for `seconds`, then SIGCONT. The SIGCONT comes from a small process of its own: a client
    library that waits on the paused server while holding the GIL (valkey-glide's sync client does) would otherwise
    starve the thread that resumes it, and nothing would ever end the wait. That process dies with this one."""
    proc = _process(server, "pause")
    proc.pause()
    pid = server.pid
    resumer = spawn_tied(["/bin/sh", "-c", f"sleep {max(0.0, seconds):.3f}; kill -CONT {pid} 2>/dev/null"])

    def end() -> None:
        try:
            proc.resume()
        finally:  # the resumer is reaped whatever happens (a dropped running Popen is a ResourceWarning)
            if resumer.poll() is None:
                resumer.kill()
            resumer.wait()
    return _strike("pause", server, seconds, end)


def kill_restart(server: ValkeyServer, *, keep_data: bool = False, seconds: float = 0.0) -> Strike:
    """SIGKILL the server, leave it down `seconds`, start it again on the same port: empty, or (`keep_data`) with
    the snapshot SAVE wrote just before the kill."""
    proc = _process(server, "kill_restart")
    if keep_data:
        reply = _admin(server, "SAVE", timeout=10.0)
        if not reply.startswith(b"+OK"):
            raise RuntimeError(f"SAVE on port {server.port} answered {reply[:80]!r}")
    proc.kill(keep_data=keep_data)
    return _strike("restart-data" if keep_data else "restart-empty", server, seconds, proc.respawn)


def kill_connections(server: ValkeyServer | Endpoint) -> Strike:
    """CLIENT KILL every normal client connection (the admin connection that asks is spared)."""
    reply = _admin(server, "CLIENT", "KILL", "TYPE", "normal")
    if not reply.startswith(b":"):
        raise RuntimeError(f"CLIENT KILL answered {reply[:80]!r}")
    return _strike("kill-connections", server, 0.0, lambda: None)


def debug_sleep(server: ValkeyServer | Endpoint, seconds: float) -> Strike:
    """DEBUG SLEEP `seconds`: the server's event loop blocks; the admin call runs on its own thread."""
    asked = threading.Event()
    done = threading.Event()

    def sleep() -> None:
        with contextlib.suppress(OSError):
            host, port, password = _addr(server)
            with socket.create_connection((host, port), timeout=seconds + 5) as sock:
                if password is not None:
                    sock.sendall(_cmd("AUTH", password))
                    sock.recv(256)
                sock.sendall(_cmd("DEBUG", "SLEEP", f"{seconds:g}"))
                asked.set()
                sock.recv(256)
        asked.set()
        done.set()

    threading.Thread(target=sleep, name="shardcheck-nemesis-debug-sleep", daemon=True).start()
    asked.wait(2.0)
    strike = _strike("debug-sleep", server, seconds, lambda: done.wait(seconds + 5))
    _until_unresponsive(server, min(1.0, seconds))  # the command is sent: wait until the server runs it
    return strike


def _until_unresponsive(server: ValkeyServer | Endpoint, limit: float) -> None:
    """Return once the server stops answering a PING within 20 ms (at most `limit` seconds)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            if not _admin(server, "PING", timeout=0.02).startswith(b"+PONG"):
                return
        except OSError:
            return
        time.sleep(0.002)


def client_pause(server: ValkeyServer | Endpoint, seconds: float) -> Strike:
    """CLIENT PAUSE ALL for `seconds`: the server holds every client's commands, then runs them."""
    reply = _admin(server, "CLIENT", "PAUSE", str(max(1, int(seconds * 1000))), "ALL")
    if not reply.startswith(b"+OK"):
        raise RuntimeError(f"CLIENT PAUSE answered {reply[:80]!r}")
    return _strike("client-pause", server, seconds,
                   lambda: _admin(server, "CLIENT", "UNPAUSE"))


def _info_int(server: ValkeyServer | Endpoint, section: str, field: str) -> int:
    raw = _admin(server, "INFO", section).decode(errors="replace")
    for line in raw.splitlines():
        if line.startswith(field + ":"):
            return int(line.split(":", 1)[1])
    raise RuntimeError(f"INFO {section} has no {field}")


def evict_by_policy(server: ValkeyServer | Endpoint, *, fill_bytes: int = FILL_BYTES) -> Strike:
    """Set maxmemory just above what the server holds with allkeys-lru, then write another prompt's chunks (at least
    `fill_bytes`, twice what it holds) so the server evicts by its own LRU; `heal()` lifts the limit and removes
    the filler."""
    used = _info_int(server, "memory", "used_memory")
    dataset = _info_int(server, "memory", "used_memory_dataset")
    fill = max(fill_bytes, 2 * dataset)
    _admin(server, "CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
    _admin(server, "CONFIG", "SET", "maxmemory", str(used + fill // 4))
    filler = b"f" * FILL_CHUNK
    names = [f"shardcheck-nemesis-other-prompt:{i}" for i in range(fill // FILL_CHUNK)]
    host, port, password = _addr(server)
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.settimeout(10)
        if password is not None:
            sock.sendall(_cmd("AUTH", password))
            sock.recv(256)
        for name in names:  # one at a time: the server evicts as it goes (pipelining would run past the limit)
            sock.sendall(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(name), name.encode(), len(filler), filler))
            sock.recv(256)

    def lift() -> None:
        _admin(server, "CONFIG", "SET", "maxmemory", "0")
        for i in range(0, len(names), 256):
            _admin(server, "DEL", *names[i:i + 256])

    return _strike("evict", server, 0.0, lift)


def endpoint_of(store: Any) -> tuple[str, int] | None:
    """The (host, port) of the server a store talks to: its `endpoint`, or its `host` and `port` (through the
    `inner` of a wrapper such as `runtime.bounded.BoundedStore`); None when it says neither."""
    for _ in range(4):
        ep = getattr(store, "endpoint", None)
        if ep is not None:
            return str(ep[0]), int(ep[1])
        if isinstance(getattr(store, "port", None), int) and isinstance(getattr(store, "host", None), str):
            return store.host, store.port
        store = getattr(store, "inner", None)
        if store is None:
            return None
    return None


class Nemesis:
    """`model.faults.ServerControl` over one target per rank (a `ValkeyServer`, or an `Endpoint` for admin-only
    faults); every strike is recorded in `strikes`."""

    def __init__(self, targets: Sequence[ValkeyServer | Endpoint]) -> None:
        self.targets = list(targets)
        self.strikes: list[Strike] = []
        self.t0 = time.monotonic()

    @classmethod
    def for_stores(cls, stores: Sequence[Any], *, user_servers: bool = False,
                   password: str | None = None) -> "Nemesis":
        """The nemesis of a store set: each rank's server found by its endpoint among the servers this process
        started; another server is a target only with `user_servers` (the user asked: destructive), admin faults
        only. `NemesisUnavailable` when a rank has no target."""
        targets: list[ValkeyServer | Endpoint] = []
        for rank, store in enumerate(stores):
            own = _server_process(store)
            if own is not None:  # a non-Valkey server shardcheck started (its process only: its `takes(kind)`)
                targets.append(own)
                continue
            ep = endpoint_of(store)
            if ep is None:
                raise NemesisUnavailable(f"rank {rank}'s store ({type(store).__name__}) names no server "
                                         "(no `endpoint`, no `host` and `port`)")
            server = server_on(ep[1]) if ep[0] in (HOST, "localhost") else None
            if server is None and not user_servers:
                raise NemesisUnavailable(f"rank {rank}'s server {ep[0]}:{ep[1]} was not started by shardcheck "
                                         "(--nemesis given explicitly faults it: destructive)")
            pw = getattr(store, "password", None) or getattr(getattr(store, "inner", None), "password", None)
            targets.append(server if server is not None else Endpoint(ep[0], ep[1], pw or password))
        for store in stores:  # a client whose workers connect after it was built: every connection made first
            settle = getattr(store, "await_connections", None) or getattr(getattr(store, "inner", None),
                                                                          "await_connections", None)
            if callable(settle):
                settle()
        return cls(targets)

    def supports(self, needs_process: bool) -> bool:
        """Whether every rank's target can take a fault that needs the server's process."""
        return not needs_process or all(_is_process(t) for t in self.targets)

    def supports_kind(self, kind: Any) -> bool:
        """Whether every rank's target can take `kind` (a `model.faults.FaultKind`): its process when it needs one,
        and a kind its `takes(kind)` accepts when it has one (a server that speaks no RESP)."""
        if not self.supports(kind.needs_process):
            return False
        return all(getattr(t, "takes", lambda k: True)(kind) for t in self.targets)

    def _record(self, strike: Strike) -> None:
        self.strikes.append(strike)

    # -- model.faults.ServerControl -------------------------------------------------------------------
    def pause(self, rank: int, seconds: float) -> None:
        self._record(pause(_process(self.targets[rank], "pause"), seconds))

    def kill_restart(self, rank: int, *, keep_data: bool, seconds: float) -> None:
        self._record(kill_restart(_process(self.targets[rank], "kill_restart"), keep_data=keep_data, seconds=seconds))

    def kill_connections(self, rank: int) -> None:
        self._record(kill_connections(self.targets[rank]))

    def debug_sleep(self, rank: int, seconds: float) -> None:
        self._record(debug_sleep(self.targets[rank], seconds))

    def client_pause(self, rank: int, seconds: float) -> None:
        self._record(client_pause(self.targets[rank], seconds))

    def evict_by_policy(self, rank: int) -> None:
        self._record(evict_by_policy(self.targets[rank]))

    def healed(self, timeout: float) -> float | None:
        """Wait (at most `timeout` s) until every fault struck so far is over: the time the last one ended
        (monotonic), or None when one still lasts. `FaultNotEnded` when one could not be ended (a server that did not
        come back): no client is judged on recovering from a server that is not there."""
        deadline = time.monotonic() + timeout
        for s in self.strikes:
            if not s.wait(max(0.0, deadline - time.monotonic())):
                return None
        failed = [s for s in self.strikes if s.error is not None]
        if failed:
            raise FaultNotEnded(f"the harness could not end its {failed[0].kind} on port {failed[0].port}: "
                                f"{failed[0].error}")
        return max((s.healed_at or 0.0 for s in self.strikes), default=time.monotonic())

    def record(self) -> list[dict]:
        """Every strike as data (times in seconds from this nemesis's start), for a trace."""
        return [s.to_json(self.t0) for s in self.strikes]

    # -- model.faults.HeldControl: the serving layers' held faults -------------------------------------------------
    def hold(self, rank: int, action: str) -> None:
        """Hold a fault on rank `rank`'s server until a later action ends it (`model.faults.HELD_MEANINGS`): `pause`
        (SIGSTOP, back once the server is stopped), `resume`, `kill` (SIGKILL: down, its data gone), `restart`
        (started again on its port, empty; a running one is killed first). `ValueError` for another action,
        `NemesisUnavailable` for a server shardcheck did not start."""
        proc = _process(self.targets[rank], check_held(action))
        if action == "pause":
            proc.pause()
        elif action == "resume":
            proc.resume()
        else:
            proc.kill(keep_data=False)
            if action == "restart":
                proc.respawn()  # (False: the server was stopped meanwhile, and stays down: not `reachable`)

    def reachable(self, rank: int) -> bool:
        """Whether rank `rank`'s server is neither paused nor down (a server known by its address only: always)."""
        target = self.targets[rank]
        return not _is_process(target) or (target.running() and not getattr(target, "paused", False))

    @property
    def down(self) -> frozenset[int]:
        """The ranks whose server's process is not running (killed and not restarted)."""
        return frozenset(r for r, t in enumerate(self.targets) if _is_process(t) and not t.running())

    def _processes(self) -> list[Any]:
        """Every distinct server process of the targets (ranks may share one: a Mooncake master)."""
        return list({id(t): t for t in self.targets if _is_process(t)}.values())

    def resume_all(self) -> None:
        """Resume every paused server."""
        for proc in self._processes():
            if getattr(proc, "paused", True):
                proc.resume()

    def restore_all(self) -> None:
        """Every server back: a paused one resumed, a killed one started again (empty)."""
        for proc in self._processes():
            proc.resume()
            if not proc.running():
                proc.respawn()

    def close(self) -> None:
        """End every fault now: resume, restart, lift the memory limit; a held pause is resumed (a held kill stays
        down: its owner stops the server)."""
        for s in self.strikes:
            s.heal()
        self.resume_all()

    def __enter__(self) -> "Nemesis":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def control_maker(*, user_servers: bool = False) -> Callable[[Sequence[Any], Any], "Nemesis | None"]:
    """`control_for(stores, kind)`: a `Nemesis` over the stores' servers, or None when they cannot take `kind` (None:
    any kind): a server shardcheck did not start is a target only with `user_servers` (admin faults only)."""
    def control_for(stores: Sequence[Any], kind: Any = None) -> Nemesis | None:
        try:
            nemesis = Nemesis.for_stores(stores, user_servers=user_servers)
        except NemesisUnavailable:
            return None
        return nemesis if kind is None or nemesis.supports_kind(kind) else None
    return control_for


def _server_process(store: Any) -> Any:
    """The `server_process` a store (or the `inner` of its wrappers) names, if any."""
    for _ in range(4):
        own = getattr(store, "server_process", None)
        if own is not None:
            return own
        store = getattr(store, "inner", None)
        if store is None:
            return None
    return None
