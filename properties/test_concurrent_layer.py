"""The concurrent layer against `--client`: batches of ops from several caller threads at once, every declared
read/lookup path, judged for lost and double completions, wrong-caller replies, errors and linearizability."""
from __future__ import annotations

from hypothesis import given, strategies as st

from engines.concurrency import Layout, judge, run_layout, thread_safe
from model.contract import declared_paths
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
    reads = [{"path": p, "keys": ["k0"] if p in SINGLE_KEY_READS else ["k0", "k1"]} for p in declared_paths(store)]
    writes = [{"path": "put", "keys": ["k0"], "pad": 4}, {"path": "put", "keys": ["k1"], "pad": 4},
              {"path": "delete", "keys": ["k0"]}]
    _assert_holds(store, Layout([writes + reads, reads + writes, reads]))


@given(data=st.data())
def test_concurrent_batches_hold(data):
    """Any batch of concurrent ops over the client's declared paths completes, reaches its own caller and is linearizable."""
    store = _store()
    if not thread_safe(store):
        return
    layout = Layout(data.draw(concurrent_batches(declared_paths(store)), label="threads"))
    _assert_holds(store, layout)
