"""Bounding any `RankStore`: every call runs on a worker thread and raises `StoreCallTimeout` when it does
not return within `op_timeout` seconds, so no client call can hang the caller."""
from __future__ import annotations

import concurrent.futures
import queue
import threading
from typing import Any

from model.contract import StoreCallTimeout


class BoundedStore:
    """Wraps one store; after a timeout the wrapped client is considered unusable (`broken`)."""

    def __init__(self, inner: Any, op_timeout: float) -> None:
        self.inner = inner
        self.op_timeout = op_timeout
        self.broken: str | None = None
        self.read_paths = tuple(getattr(inner, "read_paths", ("get", "get_async")))
        self.max_value_bytes = getattr(inner, "max_value_bytes", None)
        self.close_error: str | None = None
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = threading.Event()
        # A daemon worker: a call stuck forever inside the client can never block interpreter exit.
        threading.Thread(target=self._serve, name="bounded-store", daemon=True).start()

    def _serve(self) -> None:
        while True:
            item = self._calls.get()
            if item is None:
                return
            future, fn, args = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:
                    future.set_exception(exc)

    def _run(self, op: str, key: str, fn: Any, *args: Any) -> Any:
        if self.broken:
            raise StoreCallTimeout(op, key, 0.0)
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._calls.put((future, fn, args))
        try:
            return future.result(timeout=self.op_timeout)
        except concurrent.futures.TimeoutError:
            self.broken = f"{op}({key!r})"
            raise StoreCallTimeout(op, key, self.op_timeout) from None

    def put(self, key: str, value: bytes) -> None:
        return self._run("put", key, self.inner.put, key, value)

    def get(self, key: str) -> bytes | None:
        return self._run("get", key, self.inner.get, key)

    def contains(self, key: str) -> bool:
        return self._run("contains", key, self.inner.contains, key)

    def delete(self, key: str) -> None:
        return self._run("delete", key, self.inner.delete, key)

    def get_async(self, key: str) -> concurrent.futures.Future:
        return self._run("get_async", key, self.inner.get_async, key)

    def get_batch(self, keys: list[str]) -> list[bytes | None]:
        if not callable(getattr(self.inner, "get_batch", None)):
            raise AttributeError("the wrapped client has no get_batch read path")
        return self._run("get_batch", ",".join(keys), self.inner.get_batch, keys)

    def close(self) -> None:
        """Close the client without ever blocking on a hung call."""
        if self._closed.is_set():
            return
        self._closed.set()
        closer = threading.Thread(target=self._close_inner, name="bounded-store-close", daemon=True)
        closer.start()
        closer.join(self.op_timeout)
        if closer.is_alive():
            self.close_error = f"close() did not return within {self.op_timeout:g} s"
        self._calls.put(None)

    def _close_inner(self) -> None:
        try:
            self.inner.close()
        except Exception as exc:  # recorded: closing a broken client may fail
            self.close_error = f"close() raised {type(exc).__name__}: {exc}"
