"""The nemesis on real Valkey servers: every fault does what it says, is always ended, and leaves nothing paused or
running after a failure, a timeout or Ctrl-C; the known-bad clients are caught, the reference client holds."""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from adapters import nemesis
from adapters.catalogue import CLIENTS
from adapters.process_signals import process_state
from adapters.resp import HOST, resp_command
from adapters.valkey_clients import NEMESIS_DEMOS, reference_factory
from adapters.valkey_servers import ping, valkey_servers
from checking.nemesis_strategy import run_nemesis_scenarios
from model.faults import SERVER_KIND_NAMES, SERVER_KINDS
from runtime.registry import resolve_client
from tests.conftest import default_signals

pytestmark = pytest.mark.real
ROOT = Path(__file__).resolve().parents[1]


def _cmd(port: int, *args: str, timeout: float = 2.0) -> bytes:
    return resp_command(HOST, port, None, *args, timeout=timeout)


def test_every_fault_strikes_and_ends():
    """Pause, restart empty or with data, CLIENT KILL, DEBUG SLEEP, CLIENT PAUSE and the maxmemory eviction each do
    what they say on a real server, and each is over by itself (a restart keeps the port)."""
    with valkey_servers(1) as ss:
        server, port = ss.servers[0], ss.ports[0]
        _cmd(port, "SET", "k", "v")
        s = nemesis.pause(server, 0.6)
        assert process_state(server.pid) == "T" and not ping(port, timeout=0.2)
        assert s.wait(5) and ping(port) and process_state(server.pid) != "T"
        for fault in (nemesis.debug_sleep, nemesis.client_pause):
            strike = fault(server, 0.6)
            with pytest.raises(socket.timeout):  # (PING is exempt from CLIENT PAUSE: a GET is held)
                _cmd(port, "GET", "k", timeout=0.2)
            assert strike.wait(5) and _cmd(port, "GET", "k") == b"$1\r\nv\r\n", strike.kind
        with socket.create_connection(("127.0.0.1", port), timeout=2) as held:
            nemesis.kill_connections(server)
            held.settimeout(2)
            assert held.recv(16) == b""  # the server closed it
        pid = server.pid
        s = nemesis.kill_restart(server, keep_data=True, seconds=0.2)
        assert process_state(pid) is None and not ping(port, timeout=0.2)
        assert s.wait(15) and not s.error and server.pid != pid and _cmd(port, "GET", "k") == b"$1\r\nv\r\n"
        assert nemesis.kill_restart(server, keep_data=False, seconds=0.1).wait(15)
        assert _cmd(port, "EXISTS", "k") == b":0\r\n"
        for i in range(64):
            _cmd(port, "SET", f"mine{i}", "x" * 4000)
        s = nemesis.evict_by_policy(server)
        assert int(_cmd(port, "DBSIZE")[1:-2]) < 64  # the server evicted some of them by its own LRU
        assert _cmd(port, "CONFIG", "GET", "maxmemory").endswith(b"$1\r\n0\r\n")  # lifted once it struck
        assert b"other-prompt" not in _cmd(port, "KEYS", "*")


def test_stop_resumes_a_paused_server_and_a_killed_one_stays_down():
    """Stopping a paused server resumes it first (it terminates, never left stopped); a server stopped while down
    after a kill is not started again by its restart timer."""
    with valkey_servers(2) as ss:
        paused, down = ss.servers
        pid = paused.pid
        nemesis.pause(paused, 60)
        restart = nemesis.kill_restart(down, seconds=0.3)
        port = down.port
    assert process_state(pid) is None
    restart.wait(5)
    time.sleep(0.5)
    assert not ping(port, timeout=0.2) and down.proc is None


def test_a_killed_servers_port_is_kept_until_it_is_back():
    """While a server is down (killed, its restart not due yet) its port stays its own: no other bind and no
    connection's ephemeral port can take it (a respawn found it taken, and the client was judged on recovering from
    a server that never came back); a client is refused as by a down server; once back, the port is free to leave."""
    with valkey_servers(1) as ss:
        server, port = ss.servers[0], ss.ports[0]
        s = nemesis.kill_restart(server, seconds=1.0)
        other = socket.socket()
        with pytest.raises(OSError):  # (a plain bind, as `free_port` and every server's first bind do)
            other.bind((HOST, port))
        other.close()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((HOST, port), timeout=1).close()
        assert s.wait(15) and not s.error and ping(port)
    again = socket.socket()
    again.bind((HOST, port))  # stopped: nothing holds it
    again.close()


def test_a_fault_the_harness_could_not_end_is_its_own_outcome(monkeypatch):
    """A killed server that could not be started again (its end failed) makes `healed` raise `FaultNotEnded`, a
    harness outcome: no client is judged on recovering from a server that is not there."""
    from adapters.valkey_servers import ServerStartError
    from model.timing import FaultNotEnded, HarnessOutcome
    with valkey_servers(1) as ss:
        server = ss.servers[0]

        def respawn(*args, **kw):
            raise ServerStartError(f"valkey-server on {HOST}:{server.port} exited with code 1 (Address in use)")

        monkeypatch.setattr(server, "respawn", respawn)
        control = nemesis.Nemesis([server])
        control.kill_restart(0, keep_data=False, seconds=0.1)
        with pytest.raises(FaultNotEnded, match="could not end its restart-empty on port .*Address in use") as got:
            control.healed(5)
        assert isinstance(got.value, HarnessOutcome)
        monkeypatch.undo()


CHILD = textwrap.dedent("""
    import json, socket, sys, time
    sys.path.insert(0, {root!r})
    from adapters import nemesis
    from adapters.valkey_servers import start_servers
    from runtime.bounded import call_bounded
    ss = start_servers(2)
    paused, down = ss.servers
    nemesis.pause(paused, 60)
    nemesis.kill_restart(down, seconds=60)
    with open(f"/proc/{{paused.pid}}/stat") as f:
        state = f.read().rsplit(")", 1)[1].split()[0]
    import os
    helpers = []  # (the pause's resumer: a process of this one that is no server)
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != paused.pid:
            try:
                with open(f"/proc/{{d}}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid():
                        helpers.append(int(d))
            except OSError:
                pass
    print(json.dumps({{"pids": [paused.pid], "ports": ss.ports, "state": state, "helpers": helpers}}), flush=True)
    if {mode!r} == "exception":
        raise RuntimeError("boom in a nemesis step")
    if {mode!r} == "timeout":  # a store call on the paused server, bounded: the timeout ends the run
        def read():
            with socket.create_connection(("127.0.0.1", paused.port), timeout=60) as s:
                s.sendall(b"PING\\r\\n")
                return s.recv(16)
        call_bounded(0.5, "get", "k", read)
    with socket.create_connection(("127.0.0.1", paused.port), timeout=60) as s:  # Ctrl-C arrives in here
        s.sendall(b"PING\\r\\n")
        s.recv(16)
""")


@pytest.mark.parametrize("mode", ["exception", "timeout", "SIGINT"])
def test_nothing_is_left_paused_or_running(mode: str):
    """A process in the middle of a nemesis step (one server paused, one down for a restart) that fails, times out
    or gets Ctrl-C leaves no server behind: the paused one was resumed and stopped, the other never comes back."""
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(root=str(ROOT), mode=mode)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    try:
        line = child.stdout.readline()
        assert line, child.stderr.read()
        info = json.loads(line)
        assert info["state"] == "T"  # the server was paused when the step failed
        if mode == "SIGINT":
            time.sleep(0.3)
            child.send_signal(signal.SIGINT)
        child.wait(timeout=20)
        err = child.stderr.read()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        child.stderr.close()
    assert child.returncode != 0
    assert {"exception": "boom", "timeout": "StoreCallTimeout", "SIGINT": "KeyboardInterrupt"}[mode] in err
    deadline = time.monotonic() + 5
    while process_state(info["pids"][0]) not in (None, "Z") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process_state(info["pids"][0]) in (None, "Z"), f"valkey-server left behind after {mode}"
    assert not any(ping(p, timeout=0.2) for p in info["ports"])
    assert info["helpers"], "the pause's resumer process was not found"
    deadline = time.monotonic() + 5
    while any(process_state(p) not in (None, "Z") for p in info["helpers"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(process_state(p) in (None, "Z") for p in info["helpers"]), f"helper process left behind after {mode}"


def _control(stores, kind):
    n = nemesis.Nemesis.for_stores(stores)
    return n if n.supports(kind.needs_process) else None


def test_the_reference_client_holds_under_every_fault_kind():
    """The pooled, bounded, reconnecting valkey-py client passes the nemesis scenario of every kind."""
    found = run_nemesis_scenarios(resolve_client(reference_factory, CLIENTS), op_timeout=0.5, kinds=SERVER_KINDS,
                                  control_for=_control)
    assert not found, [t.summary for t in found]


@pytest.mark.parametrize("demo", sorted(NEMESIS_DEMOS))
def test_each_demo_violates_its_property(demo: str):
    """Each known-bad client (correct on a healthy server) is caught by its property under a pause."""
    factory, prop = NEMESIS_DEMOS[demo]
    found = run_nemesis_scenarios(resolve_client(factory, CLIENTS), op_timeout=0.5, kinds=(SERVER_KIND_NAMES["pause"],),
                                  control_for=_control)
    assert [t.property for t in found] == [prop], [t.summary for t in found]
    assert found[0].ops[5]["op"] == "fault" and found[0].ops[5]["fault"] == "server_pause"


def test_a_server_shardcheck_did_not_start_is_never_faulted():
    """The nemesis refuses a store whose server shardcheck did not start, unless asked (then admin faults only)."""
    class Store:
        host, port = "127.0.0.1", 1  # nobody's server

    with pytest.raises(nemesis.NemesisUnavailable, match="not started by shardcheck"):
        nemesis.Nemesis.for_stores([Store()])
    n = nemesis.Nemesis.for_stores([Store()], user_servers=True)
    assert n.supports(needs_process=False) and not n.supports(needs_process=True)
    with pytest.raises(nemesis.NemesisUnavailable, match="needs the server's process"):
        n.pause(0, 1.0)


def _store_machine_properties(factory, kinds: str) -> set[str]:
    from hypothesis import HealthCheck, Phase, settings
    from properties.machine_search import caught
    from properties.machines import StoreMachine
    from properties.store_machine import DECIDED, STRUCK
    STRUCK.clear()  # (each kind strikes once per session)
    DECIDED.clear()
    how = settings(max_examples=4, stateful_step_count=10, deadline=None, database=None, derandomize=True,
                   phases=(Phase.generate,), suppress_health_check=list(HealthCheck))
    return caught(StoreMachine, how, client=factory, op_timeout=0.5, write_traces=False, minimise_seconds=0,
                  nemesis_spec=kinds)


def test_store_machine_strikes_real_faults():
    """The store machine's fault rule catches the client that never reconnects (`recovery`) and holds on the
    reference client."""
    from adapters.valkey_clients import never_reconnect_factory
    assert _store_machine_properties(never_reconnect_factory, "pause") == {"recovery"}
    assert _store_machine_properties(reference_factory, "pause,restart-empty,evict") == set()


@pytest.mark.parametrize("kind", ["restart-empty", "evict"])
def test_every_read_path_agrees_with_the_first_read_of_a_key_a_real_fault_lost(kind: str):
    """A real fault that loses the key (restart-empty; evict, which the filler makes lose it), then
    `read_every_path`: the first read's miss settles the loss and every later path is held to it (it was held to
    the value from before the fault: `get_async returned None, expected ... bytes` on a client that was right)."""
    from properties import config
    from properties.machines import StoreMachine
    from properties.store_machine import DECIDED, STRUCK
    STRUCK.clear()  # (each kind strikes once per session)
    DECIDED.clear()
    with config.using(client=reference_factory, op_timeout=0.5, write_traces=False, minimise_seconds=0,
                      nemesis_spec=kind):
        machine = StoreMachine()
        machine.put(rank=1, key="-", value=b"v" * 4088)
        machine.strike(which=0, rank=1, key="other")
        assert any(op["op"] == "fault" for op in machine.ops), machine.ops  # it struck
        lost = machine.stores[1].get(machine.ns + "-") is None
        assert lost or kind == "evict", "restart-empty kept the key"
        machine.read_every_path(rank=1, key="-")
        assert machine.oracle[1].get("-") == (None if lost else b"v" * 4088)
        machine.teardown()


def test_check_with_the_nemesis_finds_a_client_that_never_reconnects_and_the_trace_replays(tmp_path):
    """`check --nemesis pause` reports `recovery` on the never-reconnecting client with a trace whose replay strikes
    the fault again (reproduces) and that the reference client fixes; `--nemesis` on the in-memory client is exit 2."""
    from tests.conftest import run_cli
    bad = "adapters.valkey_clients:never_reconnect_factory"
    r = run_cli("check", "--client", bad, "--nemesis", "pause", "--budget", "20", "--op-timeout", "0.5",
                "--out", str(tmp_path), "--json", timeout=180)
    assert r.returncode == 1, r.stderr[-2000:]
    result = json.loads(r.stdout)
    assert result["violations"][0]["property"] == "recovery"
    assert result["stats"]["coverage"]["nemesis"]["scenarios"] == {"server_pause": True}
    path = result["violations"][0]["counterexample"]
    again = run_cli("replay", path, "--json", timeout=180)
    assert again.returncode == 1 and json.loads(again.stdout)["results"][0]["outcome"] == "reproduces", again.stderr
    fixed = run_cli("replay", path, "--client", "adapters.valkey_clients:reference_factory", "--json", timeout=180)
    assert json.loads(fixed.stdout)["results"][0]["outcome"] == "fixed", fixed.stdout
    refused = run_cli("check", "--nemesis", "all", "--budget", "1")
    assert refused.returncode == 2 and "no servers to fault" in refused.stderr


def test_faults_asked_for_that_the_budget_cannot_strike_are_undecided_never_held(tmp_path):
    """`check --nemesis pause` with a budget too short to strike one pause (its length and three op timeouts) has not
    judged the client under it: exit 4, `undecided`, the reason naming the fault and what to give; nothing saved.
    With 15 s (the nemesis's half of it, as asked for) the same pause is struck and the demo caught."""
    from tests.conftest import run_cli
    bad = "adapters.valkey_clients:never_reconnect_factory"
    r = run_cli("check", "--client", bad, "--nemesis", "pause", "--budget", "4", "--op-timeout", "0.5",
                "--out", str(tmp_path / "short"), "--json", timeout=180)
    assert r.returncode == 4, r.stdout[-2000:] + r.stderr[-2000:]
    result = json.loads(r.stdout)
    assert result["verdict"] == "undecided" and not (tmp_path / "short").exists(), result
    assert any("server_pause" in why and "--budget" in why for why in result["undecided"]), result["undecided"]
    r = run_cli("check", "--client", bad, "--nemesis", "pause", "--budget", "15", "--op-timeout", "0.5",
                "--out", str(tmp_path / "enough"), "--json", timeout=180)
    assert r.returncode == 1 and json.loads(r.stdout)["violations"][0]["property"] == "recovery", r.stderr[-2000:]


def test_the_patched_lmcache_client_holds_under_every_fault_kind():
    """lmcache-patched (fixes 9 and 10) passes the nemesis scenario of every kind; stock lmcache fails one."""
    patched = run_nemesis_scenarios(resolve_client("lmcache-patched", CLIENTS), op_timeout=1.0, kinds=SERVER_KINDS,
                                    control_for=_control)
    assert not patched, [t.summary for t in patched]
    stock = run_nemesis_scenarios(resolve_client("lmcache", CLIENTS), op_timeout=1.0, kinds=(SERVER_KIND_NAMES["kill-connections"],),
                                  control_for=_control)
    assert [t.property for t in stock] == ["fault-integrity"]


@pytest.mark.parametrize("path", sorted((ROOT / "counterexamples" / "nemesis").glob("*.json")), ids=lambda p: p.stem)
def test_each_nemesis_finding_reproduces_on_stock_lmcache(path):
    """Every trace of counterexamples/nemesis shows its property again on the client it records, its faults struck
    at the same op."""
    from checking.storeops import bounded_factory, run
    from model.trace import Trace
    trace = Trace.load(path)
    _, violations = run(trace, bounded_factory(trace, resolve_client(trace.client, CLIENTS)), nemesis.control_maker())
    assert trace.property in {v.property for v in violations}, [v.summary for v in violations]


def test_the_patched_client_writes_and_reads_after_its_connections_are_dropped_twice_in_a_row():
    """Fix 13: a proxy that drops every connection, the patched client renews its native client on the next call,
    and the proxy drops them again at once: the next put and get_async still land (`_again` retried on the very
    client that had just lost its connection, as the renewal was held back for half a GET bound: the put raised
    "did not land (lost: ...)", store-error in the store machine, and the read answered a miss). A read or put that
    gave up at the connector's own bound while the machine kept it from running is no verdict: the rounds run again
    (`model.timing.rerun_starved`), and a machine starved throughout skips the test as undecided (`adapters.pytest_runner`)."""
    from model import timing
    timing.rerun_starved(_drop_read_write_rounds)


def _drop_read_write_rounds() -> None:
    from adapters.patched import patched_factory
    from adapters.valkey_servers import start_servers
    from model import timing
    with start_servers(1) as servers:
        (store,) = patched_factory(1, urls=list(servers.urls), op_timeout=2.0)
        connector = getattr(store.backend.connection, "_connector", store.backend.connection)

        def judged(what: str, call) -> None:
            """`call()` answers the value (a put: None); a miss, or a put's own timeout, that the machine caused by
            keeping it from running past its bound is `HarnessStarved`; any other fails, saying why."""
            renewed, t0 = connector.recycled, time.monotonic()
            try:
                value, error = call(), None
            except TimeoutError as exc:  # (a put that did not land within its own bound)
                value, error = None, exc
            t1 = time.monotonic()
            if error is None and value == (None if what.startswith("put") else b"v" * 100):
                return
            starved = timing.starved_timeout(connector.get_timeout, t0, t1, what)
            if starved is not None:  # it gave up at its own bound on a starved machine: not its doing
                raise starved
            said = f"raised {error}" if error is not None else f"answered {value!r:.30}"
            pytest.fail(f"{what} {said} after {t1 - t0:.3f} s (its bound {connector.get_timeout:g} s; the machine "
                        f"took {timing.stolen(t0, t1):.3f} s of it); native clients renewed during it: "
                        f"{connector.recycled - renewed}; the last renewal's error: {connector.renew_error!r}")
        try:
            store.put("k", b"v" * 100)
            for attempt in range(3):
                nemesis.kill_connections(servers.servers[0])
                judged(f"get, round {attempt}", lambda: store.get("k"))  # lost, renewed, answered
                nemesis.kill_connections(servers.servers[0])  # the renewed client's connections too
                judged(f"put, round {attempt}", lambda: store.put("k", b"v" * 100))
                nemesis.kill_connections(servers.servers[0])
                judged(f"get_async, round {attempt}", lambda: store.get_async("k").result(5))
        finally:
            store.close()


def test_an_async_read_in_flight_when_a_fault_strikes_may_miss_and_one_done_before_may_not():
    """A `get_async` still in flight when a fault strikes is a read while it lasts: it may answer a miss (the
    patched client's read in flight at CLIENT KILL does: the native GET fails on the dead socket), as the strike's
    own read may; one that completed before the strike is held to the register."""
    import concurrent.futures
    from properties import config
    from properties.machines import StoreMachine
    from properties.store_machine import DECIDED, STRUCK, Pending
    STRUCK.clear()  # (each kind strikes once per session)
    DECIDED.clear()
    with config.using(client=reference_factory, op_timeout=0.5, write_traces=False, minimise_seconds=0,
                      nemesis_spec="kill-connections"):
        machine = StoreMachine()
        machine.put(rank=0, key="k", value=b"v")
        in_flight, done_before = concurrent.futures.Future(), concurrent.futures.Future()
        done_before.set_result(None)
        machine.pending += [Pending(0, "k", in_flight, [b"v"]), Pending(0, "k", done_before, [b"v"])]
        machine.strike(which=0, rank=0, key="k")
        assert any(op["op"] == "fault" for op in machine.ops), machine.ops  # it struck
        in_flight.set_result(None)
        machine.wait(machine.pending[0])
        with pytest.raises(AssertionError, match="store-roundtrip: rank 0: get_async\\('k'\\) returned None"):
            machine.wait(machine.pending[1])


def test_a_strike_waits_until_a_native_lmcache_client_holds_all_its_connections():
    """CLIENT KILL struck at a trace's first op must meet every connection of stock lmcache's native client: its
    workers connect on threads of their own after the constructor returns, and one that connected after the strike
    made the client work again (a `recovery` finding that missed under load). The nemesis has each store wait for
    them (`adapters.resp.await_new_clients`): it returns once connections newer than the id it was given exist, and
    names the shortfall after its bound."""
    import threading

    from adapters.resp import await_new_clients, client_ids
    with valkey_servers(1) as ss:
        port = ss.ports[0]
        after = client_ids("127.0.0.1", port, None)[0]
        socks: list[socket.socket] = []

        def connect_late() -> None:
            time.sleep(0.3)
            socks.extend(socket.create_connection(("127.0.0.1", port)) for _ in range(3))
        late = threading.Thread(target=connect_late)
        late.start()
        try:
            await_new_clients("127.0.0.1", port, None, after=after, want=3, timeout=30.0)
            assert len([i for i in client_ids("127.0.0.1", port, None)[1] if i > after]) >= 3  # (made, not awaited)
            with pytest.raises(ConnectionError, match="made 3 of its 4 connections"):
                await_new_clients("127.0.0.1", port, None, after=after, want=4, timeout=0.2, who="it")
        finally:
            late.join()
            for s in socks:
                s.close()
        for client in ("lmcache", "lmcache-native"):
            stores = resolve_client(client, CLIENTS).stores(1, urls=ss.urls)
            try:
                nemesis.Nemesis.for_stores(stores, user_servers=True)  # (what a strike's control is made by)
                own, ids = client_ids("127.0.0.1", port, None)
                assert len([i for i in ids if i > after]) >= stores[0].num_workers, (client, ids)
            finally:
                for s in stores:
                    s.close()
            after = own
