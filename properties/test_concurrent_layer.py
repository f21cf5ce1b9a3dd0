"""The concurrent layer against `--client`: batches of ops from several caller threads at once, every declared
read/lookup path, judged for lost and double completions, wrong-caller replies, errors and linearizability."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from engines.concurrency import Layout, judge, run_layout, store_paths, thread_safe
from engines.nemesis import nemesis_layout
from model.faults import SERVER_KINDS
from model.history import SINGLE_KEY_READS, lanes
from properties import config
from properties.strategies import concurrent_batches

#: Runs of each drawn batch: a race shows in some runs only.
RUNS = 3


def _store():
    return config.current().stores(1)[0]


def _bound() -> float:
    return 3 * config.current().op_timeout


def _assert_holds(store, layout: Layout) -> None:
    for _ in range(RUNS):
        history = run_layout(store, layout, bound=_bound())
        violations, verdict = judge(history)
        assert not violations, (f"{violations[0]['property']}: {violations[0]['summary']}\n"
                                f"layout: {layout.to_ops()}\nhistory: {lanes(history, verdict=verdict)}")


def test_client_declares_whether_it_is_thread_safe():
    """A client that is not thread-safe says so, and is then reported instead of driven concurrently."""
    store = _store()
    assert thread_safe(store), f"{type(store).__name__} declares thread_safe = False: not driven concurrently"


def test_every_declared_path_runs_concurrently():
    """Each caller thread reads through every declared path while others put and delete the same keys."""
    store = _store()
    if not thread_safe(store):
        return  # (reported by the test above, not driven concurrently)
    reads = [{"path": p, "keys": ["k0"] if p in SINGLE_KEY_READS else ["k0", "k1"]} for p in store_paths(store)]
    writes = [{"path": "put", "keys": ["k0"], "pad": 4}, {"path": "put", "keys": ["k1"], "pad": 4},
              {"path": "delete", "keys": ["k0"]}]
    _assert_holds(store, Layout([writes + reads, reads + writes, reads]))


@given(data=st.data())
def test_concurrent_batches_hold(data):
    """Any batch of concurrent ops over the client's declared paths completes, reaches its own caller and is linearizable."""
    store = _store()
    if not thread_safe(store):
        return
    layout = Layout(data.draw(concurrent_batches(store_paths(store)), label="threads"))
    _assert_holds(store, layout)


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
    layout, strikes, bound = nemesis_layout(kind, 0, paths=store_paths(store), op_timeout=cfg.op_timeout)
    try:
        history = run_layout(store, layout, bound=bound, strikes=strikes, control=control, op_timeout=cfg.op_timeout,
                             recovery_seconds=plan.recovery_seconds)
    finally:
        control.close()
    violations, verdict = judge(history)
    if violations:
        cfg.discard()  # the fault may have left the client unusable
    assert not violations, (f"{violations[0]['property']}: {violations[0]['summary']}\n"
                            f"layout: {layout.to_ops()}\nfaults: {history.faults}")
