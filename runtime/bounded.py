"""Bounding store-client calls: `call_bounded` runs one call on a daemon worker thread and raises
`StoreCallTimeout` when it does not return within its allowance (`model.timing`); `BoundedStore` wraps a whole
`RankStore` that way.

A call stuck forever inside a client abandons its worker (a new one serves later calls); being a daemon,
it can never block the run or the interpreter's exit. A bounded call made from inside a bounded call (a
`BoundedStore`'s method bounded again) runs inline on the worker: queued behind the call that waits for it, it
could only time out. The outer call's bound covers it.
"""
from __future__ import annotations

import _thread
import concurrent.futures
import queue
import threading
import time
from typing import Any, Callable

from model.contract import StoreCallTimeout, declared_paths
from model.history import MULTI_KEY_READS
from model.timing import HarnessOutcome, had, starved_error, wait_judged
from runtime import starvation

__all__ = ["call_bounded", "BoundedStore"]


#: `_on_worker.active` is True on a worker thread (any, an abandoned one too).
_on_worker = threading.local()


class _Worker:
    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="shardcheck-bounded-call", daemon=True).start()

    def _loop(self) -> None:
        _on_worker.active = True
        while True:
            fn, args, box, done = self.jobs.get()
            try:
                box.append((True, fn(*args)))
            except BaseException as exc:  # handed back to the caller, who re-raises it
                box.append((False, exc))
            done.release()


_worker: _Worker | None = None
_worker_lock = threading.Lock()


def call_bounded(seconds: float, op: str, key: str, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)`, or `StoreCallTimeout(op, key, seconds)` when it has not returned once it had its allowance of
    `seconds` (`model.timing`: the bound plus a grace, in the time the machine let it run; `HarnessStarved` when the
    machine did not let it). Inline when called from inside a bounded call: that call's bound holds."""
    global _worker
    if getattr(_on_worker, "active", False):
        return fn(*args)
    starvation.start()
    with _worker_lock:
        if _worker is None:
            _worker = _Worker()
        worker = _worker
    done = _thread.allocate_lock()
    done.acquire()
    box: list = []
    started = time.monotonic()
    worker.jobs.put((fn, args, box, done))
    try:
        waited = wait_judged(lambda s: done.acquire(True, s), seconds, f"{op}({key!r})", t0=started)
    except HarnessOutcome:
        _abandon(worker)
        raise
    if waited is not None:
        _abandon(worker)
        raise StoreCallTimeout(op, key, seconds, waited, waited - had(started, started + waited))
    ok, value = box[0]
    if ok:
        return value
    starved = starved_error(value, seconds, started, time.monotonic(), f"{op}({key!r})")
    if starved is not None:
        raise starved from value
    raise value


def _abandon(worker: _Worker) -> None:
    """The worker is stuck in the client (or may be): later calls get a new one."""
    global _worker
    with _worker_lock:
        if _worker is worker:
            _worker = None


class BoundedStore:
    """A `RankStore` whose every call is bounded by `seconds`; after a timeout the wrapped client is taken
    as unusable (`broken`): later calls fail at once and `close()` never waits on it. Every read path the
    client declares (`paths`) is offered, bounded the same way."""

    def __init__(self, inner: Any, seconds: float) -> None:
        self.inner, self.seconds = inner, seconds
        self.paths = declared_paths(inner)
        self.max_value_bytes = getattr(inner, "max_value_bytes", None)
        self.retention = getattr(inner, "retention", None)
        self.broken: str | None = None
        self.close_error: str | None = None

    def _call(self, op: str, key: str, fn: Callable[..., Any], *args: Any) -> Any:
        if self.broken:
            raise StoreCallTimeout(op, key, 0.0)
        try:
            return call_bounded(self.seconds, op, key, fn, *args)
        except StoreCallTimeout:
            self.broken = f"{op}({key!r})"
            raise

    def put(self, key: str, value: bytes) -> None:
        return self._call("put", key, self.inner.put, key, value)

    def get(self, key: str) -> bytes | None:
        return self._call("get", key, self.inner.get, key)

    def contains(self, key: str) -> bool:
        return self._call("contains", key, self.inner.contains, key)

    def delete(self, key: str) -> None:
        return self._call("delete", key, self.inner.delete, key)

    def get_async(self, key: str) -> concurrent.futures.Future:
        return self._call("get_async", key, self.inner.get_async, key)

    def get_batch(self, keys: list[str]) -> list[bytes | None]:
        if not callable(getattr(self.inner, "get_batch", None)):
            raise AttributeError("the wrapped client has no get_batch read path")
        return self._call("get_batch", ",".join(keys), self.inner.get_batch, keys)

    def __getattr__(self, name: str) -> Any:
        """A declared read path other than the contract's (`get_sync`, `get_prefix`, `contains_batch`...), bounded."""
        if name in ("inner", "paths") or name not in self.paths or not callable(getattr(self.inner, name, None)):
            raise AttributeError(name)
        fn = getattr(self.inner, name)

        def bounded(arg: Any) -> Any:
            shown = ",".join(arg) if name in MULTI_KEY_READS else str(arg)
            return self._call(name, shown, fn, arg)
        return bounded

    def close(self) -> None:
        """Close the client, never blocking longer than `seconds` (a hung client's close may never return)."""
        try:
            call_bounded(self.seconds, "close", "", self.inner.close)
        except StoreCallTimeout as exc:
            self.close_error = str(exc).replace("store call close('')", "close()")
        except Exception as exc:  # recorded: closing a broken client may fail
            self.close_error = f"close() raised {type(exc).__name__}: {exc}"
