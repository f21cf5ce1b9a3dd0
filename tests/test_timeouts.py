"""One op timeout reaches every wait: regression tests for the bounds that used to differ per engine."""
import inspect

from adapters import lmcache_native, lmcache_stores, patched
from adapters.catalogue import CLIENTS
from checking.scenarios import run_scenarios
from model.calls import DEFAULT_OP_TIMEOUT
from model.harness import Case
from model.protocols import PaperProtocolAsync
from properties.bad_stores import blocking_miss_factory
from runtime import bounded, pool
from runtime.pool import ClientPool
from runtime.registry import resolve_client


def test_pool_op_timeout_bounds_the_wait_for_an_async_completion():
    """A completion that never comes is a hang after the pool's op timeout, not after a fixed 10 s."""
    with ClientPool(resolve_client("properties.bad_stores:lost_async_factory", CLIENTS), op_timeout=0.2) as p:
        out = p.run(PaperProtocolAsync(), Case(n_ranks=1, n_chunks=1))
    hangs = [v for v in out.violations if v.property == "hang"]
    assert hangs and hangs[0].detail["seconds"] == 0.2, out.violations


def test_scenarios_bound_every_call_of_a_client_that_does_not_bound_itself():
    """The scenarios report a GET that blocks as a hang at their op timeout (never waiting for the client)."""
    traces = run_scenarios(resolve_client(blocking_miss_factory, CLIENTS), op_timeout=0.2, names=("miss-prompt",))
    assert [t.property for t in traces] == ["store-hang"] and "within its bound of 0.2 s (+0.2 s grace" in traces[0].summary


def test_one_default_op_timeout():
    """The pool, the bounded calls and the LMCache adapters default to the one `model.calls.DEFAULT_OP_TIMEOUT`."""
    assert pool.DEFAULT_OP_TIMEOUT == DEFAULT_OP_TIMEOUT
    from adapters import processes, rank_process
    defaults = [inspect.signature(f).parameters["op_timeout"].default
                for f in (ClientPool.__init__, lmcache_stores.BackendStore.__init__, processes.ProcessRunner.__init__,
                          lmcache_native.NativeStore.__init__, patched.PatchedBackendStore.__init__)]
    assert set(defaults) == {DEFAULT_OP_TIMEOUT} and rank_process.WAIT_BOUND == DEFAULT_OP_TIMEOUT
    assert not hasattr(bounded, "DEFAULT_OP_TIMEOUT") or bounded.DEFAULT_OP_TIMEOUT == DEFAULT_OP_TIMEOUT


def test_a_bounded_call_inside_a_bounded_call_runs_inline():
    """A `BoundedStore` call bounded again (a store-ops run's clean-up does so) returns its value: queued behind the
    call waiting for it, it used to time out, and every store-ops replay waited its op timeout per key put."""
    inner = bounded.BoundedStore(resolve_client("model", CLIENTS).stores(1)[0], 30.0)
    inner.put("k", b"v")
    assert bounded.call_bounded(5.0, "get", "k", inner.get, "k") == b"v" and inner.broken is None


def test_a_bounded_call_inside_a_bounded_call_is_bounded_by_the_outer_one():
    import threading
    import pytest
    from model.contract import StoreCallTimeout
    never = threading.Event()
    with pytest.raises(StoreCallTimeout):
        bounded.call_bounded(0.2, "get", "k", bounded.call_bounded, 30.0, "get", "k", never.wait, 30.0)
    never.set()
