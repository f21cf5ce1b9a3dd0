"""The store layer can fail: it catches every known-bad client of `properties.bad_stores`; `model` passes."""
from __future__ import annotations

import itertools
import time

import pytest
from hypothesis import HealthCheck, Phase, settings

from adapters.catalogue import CLIENTS
from checking.storeops import bounded_factory, run
from model.trace import Trace
from properties import config
from properties.machine_search import caught
from properties.bad_stores import BAD_STORES
from properties.machines import StoreMachine
from runtime.registry import resolve_client

FIND = settings(max_examples=200, stateful_step_count=25, derandomize=True, deadline=None,
                phases=(Phase.generate,), report_multiple_bugs=False,
                suppress_health_check=list(HealthCheck))
#: Short, so that a hanging client costs little, yet far above what an in-memory call takes.
OP_TIMEOUT = 0.25


def _caught(client, found_dir, shared: bool = True, op_timeout: float = OP_TIMEOUT) -> set[str]:
    return caught(StoreMachine, FIND, client=client, found_dir=found_dir, op_timeout=op_timeout, shared=shared)


#: The demos that are correct with one client of their servers (their bug needs another engine's client).
CORRECT_ALONE = {"local-read-cache"}
#: The demos whose bug needs time (`checking.retention` finds them, tests/test_retention.py): the machine cannot.
AGEING = {name for name, (_, prop) in BAD_STORES.items() if prop == "retention"}


@pytest.mark.parametrize("name", sorted(set(BAD_STORES) - AGEING))
def test_store_layer_catches_bad_client(name, tmp_path):
    """The store machine fails on the bad client with its property (one client per server, or two sharing them for
    a demo that is correct alone), and the written trace replays it on fresh stores."""
    factory, prop = BAD_STORES[name]
    assert _caught(factory, tmp_path, shared=name in CORRECT_ALONE) == {prop}
    (path,) = tmp_path.glob("*.json")
    trace = Trace.load(path)
    assert (trace.kind, trace.property) == ("store-ops", prop)
    _, violations = run(trace, bounded_factory(trace, resolve_client(factory, CLIENTS)))
    assert prop in {v.property for v in violations}


@pytest.mark.parametrize("name", sorted(set(BAD_STORES) - CORRECT_ALONE - AGEING))
def test_two_clients_of_the_same_servers_catch_every_bad_client_too(name, tmp_path):
    """With two clients sharing the servers, each demo still fails (with its property, or as a shared-tier view)."""
    factory, prop = BAD_STORES[name]
    assert _caught(factory, tmp_path) <= {prop, "shared-tier"} and _caught(factory, tmp_path)


def test_a_client_local_read_cache_is_correct_alone_and_wrong_on_a_shared_tier(tmp_path):
    """The local read cache passes with one client per server, and two clients of the same servers catch it."""
    factory, _ = BAD_STORES["local-read-cache"]
    # (alone it must pass: a generous bound, so that a slow answer on a loaded machine is not a hang)
    assert _caught(factory, tmp_path / "alone", shared=False, op_timeout=2.0) == set()
    assert _caught(factory, tmp_path / "shared") == {"shared-tier"}


def test_memory_client_passes(tmp_path):
    """The in-memory reference client passes the store layer."""
    assert _caught(resolve_client("model", CLIENTS), tmp_path) == set()
    assert not list(tmp_path.iterdir())


def test_blocking_get_counts_as_hang_promptly():
    """A GET that blocks is cut off at the op timeout, and the machine stays usable afterwards."""
    factory, _ = BAD_STORES["blocking-miss"]
    with config.using(client=factory, op_timeout=OP_TIMEOUT, write_traces=False):
        machine = StoreMachine()
        start = time.perf_counter()
        with pytest.raises(AssertionError, match="store-hang: rank 0: get"):
            machine.get(rank=0, key="missing")
        assert time.perf_counter() - start < OP_TIMEOUT + 5  # cut off at the bound, not after the client's 30 s
    with config.using(write_traces=False):
        again = StoreMachine()
        again.put(rank=0, key="k", value=b"v")
        again.get(rank=0, key="k")
        again.teardown()



#: In the test of the ageing demos their clock ticks this much per call (each put and each read asks it once): a case
#: then lasts as long as it makes calls (102 at most, measured), however loaded the machine is.
TICK = 0.001


@pytest.mark.parametrize("name", sorted(AGEING))
def test_a_client_that_expires_what_it_writes_passes_the_machine(name, tmp_path, monkeypatch):
    """Every case of the machine uses fresh keys and is short: a 1 s TTL passes it (retention is checked by ageing a
    sample, `checking.retention`), and a TTL shorter than a case does not. The client's time is its calls (`TICK`
    each), not the wall clock: a stall of a loaded machine would otherwise age a case past the TTL."""
    factory = BAD_STORES[name][0]
    store = type(factory(1)[0])
    ticks = itertools.count()
    monkeypatch.setattr(store, "clock", staticmethod(lambda: next(ticks) * TICK))
    # (it must pass: a generous op bound too, so that a slow answer on a loaded machine is not a hang)
    assert _caught(factory, tmp_path / "long", op_timeout=2.0) == set()
    monkeypatch.setattr(store, "TTL", 3 * TICK)  # (a put, then two more calls: expired within the case)
    assert _caught(factory, tmp_path / "short", op_timeout=2.0) == {"store-roundtrip"}


@pytest.mark.parametrize("survived", [False, True])
def test_every_read_path_is_held_to_what_the_first_read_settled_of_a_key_a_fault_may_have_lost(survived):
    """After a fault that may have lost a key (`maybe_lost`), `read_every_path`'s first read settles it: a miss
    says the server lost it, and every later path must then miss too (it was held to the value from before the
    fault: `get_async('-') returned None, expected 4088 bytes` on lmcache-patched after `server_restart_empty`);
    a hit says it survived, and every later path must answer it."""
    with config.using(client=resolve_client("model", CLIENTS), op_timeout=OP_TIMEOUT, write_traces=False):
        machine = StoreMachine()
        machine.put(rank=1, key="-", value=b"v" * 64)
        if not survived:
            machine.stores[1].delete(machine.ns + "-")  # the server lost it; the oracle does not know yet
        machine.maybe_lost[1].add("-")  # what `strike` records after a fault that may lose keys
        machine.read_every_path(rank=1, key="-")
        assert machine.oracle[1].get("-") == (b"v" * 64 if survived else None)
        assert "-" not in machine.maybe_lost[1]
        machine.teardown()
