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


class BoundedStore:
    """A `RankStore` whose every call goes through `call_bounded` (for the simulator, which calls stores
    directly and names a `StoreCallTimeout` a hang)."""

    def __init__(self, inner: Any, seconds: float) -> None:
        self.inner, self.seconds = inner, seconds
        self.read_paths = tuple(getattr(inner, "read_paths", ("get", "get_async")))

    def put(self, key: str, value: bytes) -> None:
        return call_bounded(self.seconds, "put", key, self.inner.put, key, value)

    def get(self, key: str) -> Any:
        return call_bounded(self.seconds, "get", key, self.inner.get, key)

    def contains(self, key: str) -> bool:
        return call_bounded(self.seconds, "contains", key, self.inner.contains, key)

    def delete(self, key: str) -> None:
        return call_bounded(self.seconds, "delete", key, self.inner.delete, key)

    def get_async(self, key: str) -> Any:
        return call_bounded(self.seconds, "get_async", key, self.inner.get_async, key)

    def get_batch(self, keys: list[str]) -> Any:
        return call_bounded(self.seconds, "get_batch", ",".join(keys), self.inner.get_batch, keys)

    def close(self) -> None:
        return call_bounded(self.seconds, "close", "", self.inner.close)
