"""The in-memory store model: one `MemoryStore` per rank, the default client `model`."""
from __future__ import annotations

import concurrent.futures
from typing import Any

__all__ = ["MemoryStore", "memory_factory"]


class MemoryStore:
    """A rank's store as a dict; every call returns at once and `get_async` resolves immediately.

    Faults (evictions, lost and delayed completions) are injected by the harness and the simulator,
    in logical time, not by this class.
    """

    paths = ("get", "get_async", "get_batch", "contains")

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.closed = False

    def _check(self) -> None:
        if self.closed:
            raise RuntimeError("MemoryStore used after close()")

    def put(self, key: str, value: bytes) -> None:
        self._check()
        self.data[key] = bytes(value)

    def get(self, key: str) -> bytes | None:
        self._check()
        return self.data.get(key)

    def get_batch(self, keys: list[str]) -> list[bytes | None]:
        self._check()
        return [self.data.get(k) for k in keys]

    def contains(self, key: str) -> bool:
        self._check()
        return key in self.data

    def delete(self, key: str) -> None:
        self._check()
        self.data.pop(key, None)

    def get_async(self, key: str) -> concurrent.futures.Future:
        self._check()
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_result(self.data.get(key))
        return future

    def close(self) -> None:
        self.closed = True


def memory_factory(n_ranks: int, **options: Any) -> list[MemoryStore]:
    """The `model` client: one fresh in-memory store per rank (no options)."""
    if options:
        raise TypeError(f"the model client takes no options, got {sorted(options)}")
    return [MemoryStore() for _ in range(n_ranks)]
