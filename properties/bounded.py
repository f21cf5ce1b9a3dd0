"""`call_bounded(seconds, fn, *args)`: run one store-client call with a time bound.

The call runs on a daemon worker thread (reused across calls); when it does not return within `seconds`,
`StoreCallTimeout` is raised and that worker is abandoned (a new one serves later calls), so a client that
blocks forever cannot block the test run or the interpreter's exit.
"""
from __future__ import annotations

import _thread
import queue
import threading
from typing import Any, Callable

from model.contract import StoreCallTimeout


class _Worker:
    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="shardcheck-bounded-call", daemon=True).start()

    def _loop(self) -> None:
        while True:
            fn, args, box, done = self.jobs.get()
            try:
                box.append((True, fn(*args)))
            except BaseException as exc:  # handed back to the caller, who re-raises it
                box.append((False, exc))
            done.release()


_worker: _Worker | None = None


def call_bounded(seconds: float, op: str, key: str, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)`, or `StoreCallTimeout(op, key, seconds)` when it takes longer than `seconds`."""
    global _worker
    if _worker is None:
        _worker = _Worker()
    done = _thread.allocate_lock()
    done.acquire()
    box: list = []
    _worker.jobs.put((fn, args, box, done))
    if not done.acquire(timeout=seconds):
        _worker = None  # stuck in the client: abandon it
        raise StoreCallTimeout(op, key, seconds)
    ok, value = box[0]
    if ok:
        return value
    raise value
