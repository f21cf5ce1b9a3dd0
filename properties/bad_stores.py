"""Known-bad `RankStore` clients: each breaks one store-layer property, proving the store layer can fail.

`BAD_STORES` maps a name to `(factory, property)`; each factory is a client factory
`factory(n_ranks) -> list[RankStore]` usable as `--client properties.bad_stores:<name>_factory`.
Every blocking one unblocks on `close()`, so an abandoned worker thread ends with the session.
"""
from __future__ import annotations

import concurrent.futures
import threading
from typing import Any, Callable

from model.checks import CATALOG
from model.store import MemoryStore

__all__ = ["BLOCK_SECONDS", "BlockingMissStore", "LostAsyncStore", "TruncatingStore", "AsyncKeyMismatchStore",
           "UnusableAfterMissStore", "shared_server_factory", "BAD_STORES"]

#: How long a blocking bad store blocks at most when nobody closes it.
BLOCK_SECONDS = 30.0


class BlockingMissStore(MemoryStore):
    """A GET of a missing key waits for a reply that never comes (instead of answering None)."""

    def __init__(self) -> None:
        super().__init__()
        self.released = threading.Event()

    def get(self, key: str) -> bytes | None:
        value = super().get(key)
        if value is None:
            self.released.wait(BLOCK_SECONDS)
        return value

    def close(self) -> None:
        self.released.set()
        super().close()


class LostAsyncStore(MemoryStore):
    """`get_async` hands out a future that never completes."""

    def get_async(self, key: str) -> concurrent.futures.Future:
        self._check()
        return concurrent.futures.Future()


class TruncatingStore(MemoryStore):
    """Values longer than a 1 KiB buffer come back cut to 1 KiB."""

    def get(self, key: str) -> bytes | None:
        value = super().get(key)
        return value[:1024] if value is not None else None


class AsyncKeyMismatchStore(MemoryStore):
    """The async path builds its key differently from the write path (it adds a prefix), so it always misses."""

    def get_async(self, key: str) -> concurrent.futures.Future:
        return super().get_async("async:" + key)


class UnusableAfterMissStore(MemoryStore):
    """After a GET misses, the connection is left in a bad state: every later call raises."""

    def __init__(self) -> None:
        super().__init__()
        self.poisoned = False

    def _check(self) -> None:
        super()._check()
        if self.poisoned:
            raise ConnectionError("protocol error: unexpected reply left on the connection")

    def get(self, key: str) -> bytes | None:
        value = super().get(key)
        if value is None:
            self.poisoned = True
        return value


class StaleCacheStore(MemoryStore):
    """Reads go through a read cache that `delete` forgets to invalidate: a deleted key still reads back."""

    def __init__(self) -> None:
        super().__init__()
        self.cache: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        if key in self.cache:
            return self.cache[key]
        value = super().get(key)
        if value is not None:
            self.cache[key] = value
        return value

    def put(self, key: str, value: bytes) -> None:
        super().put(key, value)
        self.cache.pop(key, None)


def _per_rank(cls: type) -> Callable[..., list]:
    def factory(n_ranks: int, **options: Any) -> list:
        return [cls() for _ in range(n_ranks)]

    factory.__name__ = factory.__qualname__ = f"{cls.__name__}_factory"
    return factory


def shared_server_factory(n_ranks: int, **options: Any) -> list[MemoryStore]:
    """Every rank's client talks to ONE shared store: a key one rank writes shows up on the others."""
    shared = MemoryStore()
    return [shared] * n_ranks


blocking_miss_factory = _per_rank(BlockingMissStore)
lost_async_factory = _per_rank(LostAsyncStore)
truncating_factory = _per_rank(TruncatingStore)
async_key_mismatch_factory = _per_rank(AsyncKeyMismatchStore)
unusable_after_miss_factory = _per_rank(UnusableAfterMissStore)
stale_cache_factory = _per_rank(StaleCacheStore)

#: Every bad store: its factory and the store-layer property it violates (from `model.checks.CATALOG`).
BAD_STORES: dict[str, tuple[Callable[..., list], str]] = {
    ref.partition(":")[2].removesuffix("_factory").replace("_", "-"): (globals()[ref.partition(":")[2]], p.name)
    for p in CATALOG if p.layer == "store" for ref in p.demos}
