"""The store layer can fail: it catches every known-bad client of `properties.bad_stores`; `model` passes."""
from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, Phase, settings

from engines.storeops import run_ops
from model.trace import Trace, decode
from properties import config
from properties.engine import caught
from properties.bad_stores import BAD_STORES
from runtime.bounded import BoundedStore
from properties.machines import StoreMachine
from runtime.registry import resolve_client

FIND = settings(max_examples=200, stateful_step_count=25, derandomize=True, deadline=None,
                phases=(Phase.generate,), report_multiple_bugs=False,
                suppress_health_check=list(HealthCheck))
#: Short, so that a hanging client costs little, yet far above what an in-memory call takes.
OP_TIMEOUT = 0.25


def _caught(client, found_dir) -> set[str]:
    return caught(StoreMachine, FIND, client=client, found_dir=found_dir, op_timeout=OP_TIMEOUT)


@pytest.mark.parametrize("name", list(BAD_STORES))
def test_store_layer_catches_bad_client(name, tmp_path):
    """The store machine fails on the bad client with its property, and `run_ops` replays the written trace."""
    factory, prop = BAD_STORES[name]
    assert _caught(factory, tmp_path) == {prop}
    (path,) = tmp_path.glob("*.json")
    trace = Trace.load(path)
    assert (trace.kind, trace.property) == ("store-ops", prop)
    stores = [BoundedStore(st, OP_TIMEOUT) for st in factory(trace.config["n_ranks"])]
    try:
        _, violations = run_ops(stores, decode(trace.ops), wait_bound=OP_TIMEOUT)
    finally:
        for st in stores:
            st.close()
    assert prop in {v.property for v in violations}


def test_memory_client_passes(tmp_path):
    """The in-memory reference client passes the store layer."""
    assert _caught(resolve_client("model"), tmp_path) == set()
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

