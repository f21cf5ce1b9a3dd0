"""One fault vocabulary, one SIGSTOP: the serving layers' held faults (`model.faults.HELD_ACTIONS`) are the held forms
of real-server kinds, every case validation speaks them, the one process-fault primitive
(`adapters.process_signals`) really stops and resumes a process, and the nemesis's held form (`Nemesis.hold`, what
the LMCache engine deployment and the vLLM stacks use) pauses, resumes, kills and restarts a real Valkey server."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from adapters.resp import HOST, resp_command
from model.engine_case import CaseError, EngineCase, EnginePrompt, Step, case_from_json
from model.faults import HELD_ACTIONS, HELD_MEANINGS, SERVER_KINDS, check_held, held_kind
from model.stack_case import StackCase, StackStep, stack_case_from_json
from model.stack_memory import MemoryStack
from model.trace import Trace

ROOT = Path(__file__).resolve().parents[1]


# -- the vocabulary -------------------------------------------------------------------------------------------------
def test_every_held_action_is_the_held_form_of_a_server_kind():
    """Each held action has its meaning and belongs to exactly one real-server kind's `held` pair (the action that
    strikes it, the one that ends it); the pairs together are the whole vocabulary, nothing more."""
    assert HELD_ACTIONS == tuple(HELD_MEANINGS) == ("pause", "resume", "kill", "restart")
    assert all(HELD_MEANINGS[a].strip() for a in HELD_ACTIONS)
    pairs = [k.held for k in SERVER_KINDS if k.held is not None]
    assert sorted(a for pair in pairs for a in pair) == sorted(HELD_ACTIONS)
    assert all(len(pair) == 2 for pair in pairs)
    assert {a: held_kind(a).field for a in HELD_ACTIONS} == {
        "pause": "server_pause", "resume": "server_pause",
        "kill": "server_restart_empty", "restart": "server_restart_empty"}
    assert held_kind("pause").loses == "nothing" and held_kind("kill").loses == "all"
    assert all(held_kind(a) in SERVER_KINDS and held_kind(a).needs_process for a in HELD_ACTIONS)
    with pytest.raises(ValueError, match="pause, resume, kill, restart"):
        held_kind("freeze")


def _words_named(message: str) -> bool:
    return all(a in message for a in HELD_ACTIONS)


def test_an_engine_case_rejects_an_unknown_action_naming_the_vocabulary():
    case = EngineCase(n_ranks=1, lookup="sync", prompts=(EnginePrompt(name="p0", chunks=1),),
                      steps=(Step(kind="fault", rank=0, action="pause"),))
    data = case.to_json()
    assert case_from_json(json.loads(json.dumps(data))) == case
    for action in HELD_ACTIONS:
        data["steps"][0]["action"] = action
        assert case_from_json(data).steps[0].action == action
    data["steps"][0]["action"] = "freeze"
    with pytest.raises(CaseError) as exc:
        case_from_json(data)
    assert exc.value.field == "steps[0].action" and _words_named(str(exc.value)) and "freeze" in str(exc.value)


def test_a_stack_case_rejects_an_unknown_action_naming_the_vocabulary():
    case = StackCase(n_ranks=1, prompts=(EnginePrompt(name="p0", chunks=1),),
                     steps=(StackStep(kind="fault", rank=0, action="kill"),))
    data = case.to_json()
    assert stack_case_from_json(json.loads(json.dumps(data))) == case
    for action in HELD_ACTIONS:
        data["steps"][0]["action"] = action
        assert stack_case_from_json(data).steps[0].action == action
    data["steps"][0]["action"] = "suspend"
    with pytest.raises(CaseError) as exc:
        stack_case_from_json(data)
    assert exc.value.field == "steps[0].action" and _words_named(str(exc.value)) and "suspend" in str(exc.value)


def test_the_memory_stack_and_check_held_refuse_an_unknown_action():
    with pytest.raises(ValueError) as exc:
        MemoryStack(1).fault(0, "freeze")
    assert _words_named(str(exc.value))
    assert [check_held(a) for a in HELD_ACTIONS] == list(HELD_ACTIONS)


def test_the_recorded_traces_with_fault_steps_still_load():
    """The JSON words stayed: every recorded engine trace with a `fault` step loads, with its actions held ones."""
    seen = 0
    for path in sorted((ROOT / "counterexamples").rglob("*.json")):
        data = json.loads(path.read_text())
        if data.get("kind") != "engine" or '"fault"' not in path.read_text():
            continue
        assert Trace.load(path).kind == "engine"  # (validated: its case read by `case_from_json`)
        case = case_from_json(data["config"]["case"])
        actions = [s.action for s in case.steps if s.kind == "fault"]
        assert actions and set(actions) <= set(HELD_ACTIONS), path
        seen += 1
    assert seen >= 1


# -- the one SIGSTOP ------------------------------------------------------------------------------------------------
def test_the_sigstop_primitive_stops_and_resumes_a_process():
    from adapters.process_signals import continue_process, process_state, stop_process, until_state
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert until_state(child.pid, "S", 2.0)
        assert stop_process(child.pid) and process_state(child.pid) == "T"  # (stopped when it returns: no wait)
        continue_process(child.pid)
        assert until_state(child.pid, "S", 2.0) and process_state(child.pid) != "T"
    finally:
        child.kill()
        child.wait()
    assert process_state(child.pid) is None
    assert stop_process(child.pid) is False  # a process gone: no error, not stopped
    continue_process(child.pid)  # (ProcessLookupError suppressed)


def test_a_pause_that_did_not_land_is_the_machines_not_the_subjects(monkeypatch):
    """A fault's SIGSTOP not landed in time (a starved machine) is `HarnessStarved`: the fault did not strike, so no
    verdict may rest on it, and the process is resumed (a late SIGSTOP ended); a process gone is left to its owner."""
    from adapters import process_signals
    from model.timing import HarnessStarved
    child = subprocess.Popen(["sleep", "30"])
    try:
        monkeypatch.setattr(process_signals, "stop_process", lambda pid, limit=1.0: False)  # (never landed)
        os.kill(child.pid, signal.SIGSTOP)  # (as if the SIGSTOP landed only after the wait gave up)
        assert process_signals.until_state(child.pid, "T", 2.0)
        with pytest.raises(HarnessStarved, match=f"a sleeper \\(pid {child.pid}\\) was not stopped within 0.5 s"):
            process_signals.pause_process(child.pid, "a sleeper", 0.5)
        assert process_signals.until_state(child.pid, "S", 2.0)  # left as found: resumed
    finally:
        child.kill()
        child.wait()
    process_signals.pause_process(child.pid, "a sleeper", 0.5)  # gone: nothing raised


def test_a_server_whose_pause_did_not_land_is_not_taken_as_paused(monkeypatch):
    """`ValkeyServer.pause` through a SIGSTOP that did not land: `HarnessStarved`, the server running and not marked
    paused (so nothing after it believes a fault struck)."""
    from adapters import process_signals
    from adapters.valkey_servers import valkey_servers
    from model.timing import HarnessStarved
    with valkey_servers(1) as ss:
        server = ss.servers[0]
        monkeypatch.setattr(process_signals, "stop_process", lambda pid, limit=1.0: False)
        with pytest.raises(HarnessStarved, match=f"valkey-server on 127.0.0.1:{server.port}"):
            server.pause()
        assert not server.paused and process_signals.process_state(server.pid) != "T"


# -- the nemesis's held form on a real server -----------------------------------------------------------------------
def _cmd(port: int, *args: str, timeout: float = 2.0) -> bytes:
    return resp_command(HOST, port, None, *args, timeout=timeout)


def _answers(port: int, timeout: float = 0.3) -> bool:
    try:
        return _cmd(port, "PING", timeout=timeout).startswith(b"+PONG")
    except OSError:
        return False


@pytest.mark.real
def test_held_faults_on_a_real_server():
    """Pause makes a PING time out until resume; kill takes the server down until restart, which brings it back
    empty on its port; a restart of a running server empties it; `reachable`, `down` and `resume_all` follow."""
    from adapters.nemesis import Nemesis
    from adapters.process_signals import process_state
    from adapters.valkey_servers import valkey_servers
    with valkey_servers(2) as ss:
        held = Nemesis(ss.servers)
        port, other = ss.ports
        _cmd(port, "SET", "k", "v")
        held.hold(0, "pause")
        assert process_state(ss.servers[0].pid) == "T" and not held.reachable(0) and held.reachable(1)
        with pytest.raises(socket.timeout):
            _cmd(port, "PING", timeout=0.3)
        assert _answers(other)
        held.hold(0, "resume")
        assert held.reachable(0) and _answers(port) and _cmd(port, "GET", "k") == b"$1\r\nv\r\n"
        held.hold(0, "kill")
        assert not held.reachable(0) and held.down == {0} and not _answers(port)
        held.hold(0, "pause")  # (a down server is not paused: it stays down)
        assert held.down == {0}
        held.hold(0, "restart")
        assert held.reachable(0) and held.down == frozenset() and _answers(port)
        assert _cmd(port, "GET", "k") == b"$-1\r\n"  # back empty, on its port
        _cmd(other, "SET", "k", "v")
        held.hold(1, "restart")  # a running server is killed first: empty
        assert held.reachable(1) and _cmd(other, "GET", "k") == b"$-1\r\n"
        held.hold(0, "pause")
        held.hold(1, "pause")
        held.resume_all()
        assert held.reachable(0) and held.reachable(1) and _answers(port) and _answers(other)
        held.hold(1, "kill")
        held.hold(0, "pause")
        held.restore_all()
        assert held.reachable(0) and held.reachable(1) and _answers(port) and _answers(other)
        with pytest.raises(ValueError, match="pause, resume, kill, restart"):
            held.hold(0, "freeze")
        held.hold(0, "pause")
        held.close()  # (a held pause never outlives its nemesis)
        assert held.reachable(0) and _answers(port)


@pytest.mark.real
def test_a_held_fault_needs_a_server_shardcheck_started():
    from adapters.nemesis import Endpoint, Nemesis, NemesisUnavailable
    held = Nemesis([Endpoint("127.0.0.1", 1)])
    with pytest.raises(NemesisUnavailable):
        held.hold(0, "pause")
    assert held.reachable(0) and held.down == frozenset()
    held.resume_all()


@pytest.mark.real
def test_the_engine_deployment_holds_its_faults_through_the_nemesis():
    """The LMCache engine deployment's `fault` pauses, resumes, kills and restarts its rank's real server through
    `Nemesis.hold`; `close()` resumes a paused server and stops every server it started."""
    from adapters.lmcache_engine.deployment import LMCacheDeployment
    from adapters.nemesis import Nemesis
    from adapters.valkey_servers import live_pids
    before = set(live_pids())
    dep = LMCacheDeployment(1, lookup="sync", close_timeout=1.0)
    try:
        assert isinstance(dep.faults, Nemesis)
        port = dep.endpoints[0][1]
        dep.fault(0, "pause")
        assert not dep.reachable(0) and not _answers(port)
        dep.fault(0, "resume")
        assert dep.reachable(0) and _answers(port)
        dep.fault(0, "kill")
        assert not dep.reachable(0) and dep.faults.down == {0} and not _answers(port)
        dep.fault(0, "restart")
        assert dep.reachable(0) and _answers(port)
        with pytest.raises(ValueError, match="pause, resume, kill, restart"):
            dep.fault(0, "freeze")
        dep.fault(0, "pause")
        t0 = time.monotonic()
    finally:
        dep.close()
    assert time.monotonic() - t0 < 30 and set(live_pids()) == before


def test_the_nemesis_is_the_held_control_the_serving_layers_hold():
    """`HeldControl`'s every member is the nemesis's: the deployment and the stacks hold a `Nemesis` as one."""
    import inspect

    from adapters.nemesis import Nemesis
    from model.faults import HeldControl
    members = {n for n, v in vars(HeldControl).items() if not n.startswith("_") and callable(v)}
    assert members == {"hold", "reachable", "resume_all", "restore_all"}
    for name in members:
        assert list(inspect.signature(getattr(Nemesis, name)).parameters) == \
            list(inspect.signature(getattr(HeldControl, name)).parameters), name
