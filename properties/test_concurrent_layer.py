"""The concurrent layer against `--client`: batches of ops from several caller threads at once, every declared
read/lookup path, judged for lost and double completions, wrong-caller replies, errors and linearizability."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from checking.concurrency import Layout, ServerClients, measure, run_layout, thread_safe
from checking.concurrency_judge import judge
from checking.nemesis_strategy import nemesis_layout
from checking.concurrency_strategy import to_trace
from model.contract import declared_paths
from model.faults import SERVER_KINDS
from model.history import SINGLE_KEY_READS, lanes
from properties import config
from properties.reporting import final_run, note, write_found
from properties.strategies import concurrent_batches

#: Runs of each drawn batch: a race shows in some runs only.
RUNS = 3


def _target() -> ServerClients:
    """The session's clients of one server (two sharing it when the client can, `properties.config`), and the
    server's own eviction; the session closes them."""
    clients, shared = config.current().store_clients(1)
    evict = (lambda key: shared.evict(0, key)) if shared is not None and shared.can_evict() else None
    return ServerClients([c[0] for c in clients], evict, closer=lambda: None)


def _store():
    """Client 0's store of the target (what the thread-safety declaration is read from)."""
    return _target().clients[0]


def _bound() -> float:
    return 3 * config.current().op_timeout


def _assert_holds(store, layout: Layout) -> None:
    """`RUNS` runs of `layout` on `store` (a store, or a `ServerClients` of several clients) show no violation; else the
    finding is written as a `concurrent` trace with its measured rate (on Hypothesis's final run, as the other
    layers do) and the test fails naming it."""
    target = ServerClients.of(store)
    rate = measure(target, layout, runs=RUNS, bound=_bound())
    if not rate.k:
        return
    first = rate.first
    v = first.violations[0]
    message = (f"{v.property}: {v.summary} (in {rate.k} of {rate.n} runs)\nlayout: {layout.to_ops()}\n"
               f"history: {lanes(first.history, verdict=first.verdict)}")
    if final_run():
        path = _write(layout, rate, len(target.clients))
        if path is not None:
            note(f"counterexample trace: {path}")
            message += f"\ncounterexample trace: {path}"
    else:  # written by `_writes_a_trace` if Hypothesis's final run does not show it again (a race)
        _UNWRITTEN[:] = [(layout, rate, len(target.clients))]
    raise AssertionError(message)


#: The first failure of a drawn batch whose trace was not written yet.
_UNWRITTEN: list = []


def _write(layout: Layout, rate, clients: int = 1) -> object:
    cfg = config.current()
    _UNWRITTEN.clear()
    if not cfg.write_traces:
        return None
    trace = to_trace(layout, rate, client=cfg.client_label(), bound=_bound(), seeds=[layout.seed],
                     origin="pytest properties/ (concurrent layer)", options={"op_timeout": cfg.op_timeout},
                     clients=clients)
    return write_found(trace, cfg, cfg.client_label(), "concurrent", rate.first.violations[0].property)


def _writes_a_trace(test):
    """Run a Hypothesis test; when it fails after a race did not show again on its final run (Hypothesis reports
    it as flaky), the first failure's trace is written all the same, so every failure leaves a trace."""
    def run(*args, **kwargs):
        _UNWRITTEN.clear()
        try:
            return test(*args, **kwargs)
        except BaseException as exc:
            if _UNWRITTEN:
                path = _write(*_UNWRITTEN[0])
                if path is not None:
                    exc.add_note(f"counterexample trace (the first failing run; the race did not show again on "
                                 f"Hypothesis's final run): {path}")
            raise
    run.__name__, run.__doc__ = test.__name__, test.__doc__
    run.hypothesis = test.hypothesis  # (pytest's Hypothesis plugin recognises the test)
    return run


def test_client_declares_whether_it_is_thread_safe():
    """A client that is not thread-safe says so, and is then reported instead of driven concurrently."""
    store = _store()
    assert thread_safe(store), f"{type(store).__name__} declares thread_safe = False: not driven concurrently"


def test_every_declared_path_runs_concurrently():
    """Each caller thread reads through every declared path while others put and delete the same keys; the callers
    read different keys at once too (a reply crossed between callers shows only across keys); with two clients of
    the same server, one caller reads through the other client while the first writes, and the server evicts."""
    target = _target()
    store = target.clients[0]
    if not thread_safe(store):
        return  # (reported by the test above, not driven concurrently)
    other = len(target.clients) - 1

    def reads(key: str, client: int = 0) -> list[dict]:
        return [{"path": p, "keys": [key] if p in SINGLE_KEY_READS else [key, "k2"],
                 **({"client": client} if client else {})} for p in declared_paths(store)]
    writes = [{"path": "put", "keys": ["k0"], "pad": 4}, {"path": "put", "keys": ["k1"], "pad": 4},
              {"path": "delete", "keys": ["k0"]}]
    evicts = [{"path": "evict", "keys": ["k1"]}] if target.evict is not None else []
    _assert_holds(target, Layout([writes + reads("k0") * 2, reads("k1", other) * 2 + writes + evicts,
                                  reads("k0", other) + reads("k1")]))


@_writes_a_trace
@given(data=st.data())
def test_concurrent_batches_hold(data):
    """Any batch of concurrent ops over the client's declared paths (through any client of the same server, with
    the server's own evictions) completes, reaches its own caller and is linearizable."""
    target = _target()
    if not thread_safe(target.clients[0]):
        return
    batches = concurrent_batches(declared_paths(target.clients[0]), len(target.clients), target.evict is not None)
    _assert_holds(target, Layout(data.draw(batches, label="threads")))


@pytest.mark.parametrize("kind", SERVER_KINDS, ids=lambda k: k.field)
def test_concurrent_runs_hold_through_real_faults(kind):
    """A real fault on the store's server while callers run (`--nemesis`; none for a client without servers
    shardcheck started): every call returns within its bound, nothing wrong is answered (against the register the
    fault allows), and once the server is back the client recovers."""
    cfg = config.current()
    plan = cfg.nemesis()
    store = _store()
    control = plan.control_for([store], kind) if plan is not None and kind in plan.kinds else None
    if control is None or not thread_safe(store):
        return  # (nothing to fault: an in-memory client, a user's server without --nemesis, or not thread-safe)
    layout, strikes, bound = nemesis_layout(kind, 0, paths=declared_paths(store), op_timeout=cfg.op_timeout)
    try:
        history = run_layout(store, layout, bound=bound, strikes=strikes, control=control, op_timeout=cfg.op_timeout,
                             recovery_seconds=plan.recovery_seconds)
    finally:
        control.close()
    violations, verdict = judge(history)
    if violations:
        cfg.discard()  # the fault may have left the client unusable
    assert not violations, (f"{violations[0].property}: {violations[0].summary}\n"
                            f"layout: {layout.to_ops()}\nfaults: {history.faults}")
