"""Known-bad `RankStore` clients: each breaks one store-layer property, proving the store layer can fail.

`BAD_STORES` maps a name to `(factory, property)`; each factory is a client factory
`factory(n_ranks) -> list[RankStore]` usable as `--client properties.bad_stores:<name>_factory`.
Every blocking one unblocks on `close()`, so an abandoned worker thread ends with the session.

`RACY_STORES` (same shape) holds clients that are correct when called one op at a time and break only when
calls overlap; each widens its race window with a short sleep so the concurrent layer catches it in every
run of a few threads. `JitterStore` is correct and thread-safe, with random delays: it must always hold.
"""
from __future__ import annotations

import collections
import concurrent.futures
import random
import threading
import time
from typing import Any, Callable

from model.checks import CATALOG
from model.store import MemoryStore, rank_data
from runtime.registry import MEMORY_TIER

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


class DeleteKeepsCacheStore(MemoryStore):
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


class LocalReadCacheStore(MemoryStore):
    """Reads go through a client-local cache, filled on every hit and updated by this client's own puts and
    deletes: alone it is correct. But another client of the same servers (another engine) that deletes or
    overwrites a key, or the server's own eviction, never reaches this cache: `get`, `get_async`, `get_batch` and
    `contains` keep answering a value that is gone."""

    paths = ("get", "get_async", "get_batch", "contains")

    def __init__(self) -> None:
        super().__init__()
        self.cache: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        self._check()
        if key in self.cache:
            return self.cache[key]
        value = self.data.get(key)
        if value is not None:
            self.cache[key] = value
        return value

    def get_batch(self, keys: list[str]) -> list[bytes | None]:
        return [self.get(k) for k in keys]

    def contains(self, key: str) -> bool:
        return self.get(key) is not None

    def get_async(self, key: str) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_result(self.get(key))
        return future

    def put(self, key: str, value: bytes) -> None:
        super().put(key, value)
        self.cache[key] = bytes(value)

    def delete(self, key: str) -> None:
        super().delete(key)
        self.cache.pop(key, None)


class ExpiringStore(MemoryStore):
    """Writes every value with a 1 s TTL (as `SET key value EX 1`): every check that puts and reads at once passes,
    and a minute later the cache holds nothing (a hit rate of zero in production)."""

    TTL = 1.0
    #: Where its expiry times come from (seconds); a test may count the client's calls instead of the wall clock.
    clock = staticmethod(time.monotonic)

    def __init__(self) -> None:
        super().__init__()
        self.expires: dict[str, float] = {}

    def _live(self, key: str) -> None:
        self._check()
        if self.expires.get(key, float("inf")) <= self.clock():
            self.data.pop(key, None)
            self.expires.pop(key, None)

    def put(self, key: str, value: bytes) -> None:
        super().put(key, value)
        self.expires[key] = self.clock() + self.TTL

    def get(self, key: str) -> bytes | None:
        self._live(key)
        return super().get(key)

    def get_batch(self, keys: list[str]) -> list[bytes | None]:
        return [self.get(k) for k in keys]

    def contains(self, key: str) -> bool:
        self._live(key)
        return super().contains(key)

    def get_async(self, key: str) -> concurrent.futures.Future:
        self._live(key)
        return super().get_async(key)


class MgetDropsMissesStore(MemoryStore):
    """`get_batch` is one MGET whose reply is filtered of its nils and then paired with the keys in order: with a
    miss before a hit, the hit's value lands on the missed key (deterministic, one caller is enough)."""

    paths = ("get", "get_async", "get_batch", "contains")

    def get_batch(self, keys: list[str]) -> list[bytes | None]:
        self._check()
        found = [v for v in (self.data.get(k) for k in keys) if v is not None]
        return found + [None] * (len(keys) - len(found))


# -- racy clients: correct sequentially, broken under overlap -----------------------------------------------
#: How long a racy store holds its race window open (seconds).
RACE_WINDOW = 0.002
_RACY_PATHS = ("get", "get_async", "contains")


class LostWakeupStore(MemoryStore):
    """`get_async` is served by one worker thread that drains a queue. When the queue looks empty the worker
    takes a moment before it marks itself idle: a request queued in that moment sees it busy, starts no
    worker, and is never served (a lost wake-up). One call at a time never hits it: a caller's future is
    resolved only after the worker is idle again."""

    paths = _RACY_PATHS

    def __init__(self) -> None:
        super().__init__()
        self._queue: collections.deque = collections.deque()
        self._busy = False
        self._lock = threading.Lock()

    def get_async(self, key: str) -> concurrent.futures.Future:
        self._check()
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.append((key, fut))
        with self._lock:
            if self._busy:
                return fut
            self._busy = True
        threading.Thread(target=self._drain, name="lost-wakeup-worker", daemon=True).start()
        return fut

    def _drain(self) -> None:
        while True:
            key, fut = self._queue.popleft()
            value = self.data.get(key)
            if not self._queue:
                time.sleep(RACE_WINDOW)  # a request queued now is never seen
                with self._lock:
                    self._busy = False
                fut.set_result(value)
                return
            fut.set_result(value)


class CrossedRepliesStore(MemoryStore):
    """One pipelined connection: a `get` (and a `get_async`, which reads on the caller's thread and hands back a
    done future) queues its request's reply in order, waits for the network, and takes the reply at the head of
    the queue. Overlapping calls whose latencies differ take each other's replies; one call at a time always
    takes its own."""

    paths = _RACY_PATHS

    def __init__(self) -> None:
        super().__init__()
        self._replies: collections.deque = collections.deque()
        self._lock = threading.Lock()

    def _round_trip(self, key: str) -> bytes | None:
        self._check()
        with self._lock:
            self._replies.append(self.data.get(key))
        time.sleep(RACE_WINDOW * (1 + ord(key[-1:] or "0") % 3))  # the latency depends on the key (its last character)
        with self._lock:
            return self._replies.popleft()

    def get(self, key: str) -> bytes | None:
        return self._round_trip(key)

    def get_async(self, key: str) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_result(self._round_trip(key))
        return future


class StaleCacheStore(MemoryStore):
    """A read-through cache whose fill races writes: a `get` that misses the cache reads the store, pauses,
    then caches what it read, even if a put or delete replaced it in between (and invalidated the cache
    before the fill). Later reads return the stale value; one call at a time never hits it."""

    paths = _RACY_PATHS

    def __init__(self) -> None:
        super().__init__()
        self._cache: dict[str, bytes | None] = {}

    def get(self, key: str) -> bytes | None:
        self._check()
        if key in self._cache:
            return self._cache[key]
        value = self.data.get(key)
        time.sleep(RACE_WINDOW)
        self._cache[key] = value
        return value

    def get_async(self, key: str) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        fut.set_result(self.get(key))
        return fut

    def contains(self, key: str) -> bool:
        return self.get(key) is not None

    def put(self, key: str, value: bytes) -> None:
        super().put(key, value)
        self._cache.pop(key, None)

    def delete(self, key: str) -> None:
        super().delete(key)
        self._cache.pop(key, None)


class JitterStore(MemoryStore):
    """A correct thread-safe client with random delays: every op takes a lock around the data and sleeps
    before and after it; `get_async` runs on a small thread pool. It must never be flagged."""

    paths = ("get", "get_async", "get_batch", "contains")

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self._pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="jitter-store")

    def _jitter(self) -> None:
        with self._lock:
            delay = self._rng.random() * RACE_WINDOW
        time.sleep(delay)

    def _locked(self, fn: Callable[..., Any], *args: Any) -> Any:
        self._jitter()
        with self._lock:
            out = fn(*args)
        self._jitter()
        return out

    def put(self, key: str, value: bytes) -> None:
        return self._locked(super().put, key, value)

    def get(self, key: str) -> bytes | None:
        return self._locked(super().get, key)

    def get_batch(self, keys: list[str]) -> list[bytes | None]:
        return self._locked(super().get_batch, keys)

    def contains(self, key: str) -> bool:
        return self._locked(super().contains, key)

    def delete(self, key: str) -> None:
        return self._locked(super().delete, key)

    def get_async(self, key: str) -> concurrent.futures.Future:
        self._check()
        return self._pool.submit(self.get, key)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        super().close()


def _per_rank(cls: type, *, shares: bool = True) -> Callable[..., list]:
    """A factory of one `cls` per rank; with `urls` (in-memory servers, `model.store.memory_tier`), stores of those
    servers, so that several calls make several clients of the same servers. `shares=False`: a factory that takes
    no `urls` (one client per server: the racy demos, whose bug is meant to show under overlap alone)."""
    def factory(n_ranks: int, *, urls: Any = None, **options: Any) -> list:
        stores = []
        for data in rank_data(n_ranks, urls):
            store = cls()
            if data is not None:
                store.data = data
            stores.append(store)
        return stores

    factory.__name__ = factory.__qualname__ = f"{cls.__name__}_factory"
    factory.tier = MEMORY_TIER  # type: ignore[attr-defined]  (their servers are in memory)
    if not shares:
        factory.options = ()  # type: ignore[attr-defined]  (no urls: never called again on the same servers)
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
delete_keeps_cache_factory = _per_rank(DeleteKeepsCacheStore)
mget_drops_misses_factory = _per_rank(MgetDropsMissesStore)
local_read_cache_factory = _per_rank(LocalReadCacheStore)
expiring_factory = _per_rank(ExpiringStore, shares=False)  # (its expiry times are the client's own, not the server's)

#: Every bad store: its factory and the store-layer property it violates (from `model.checks.CATALOG`).
BAD_STORES: dict[str, tuple[Callable[..., list], str]] = {
    name.removesuffix("_factory").replace("_", "-"): (globals()[name], p.name)
    for p in CATALOG if p.layer == "store" for name in p.demos}


lost_wakeup_factory = _per_rank(LostWakeupStore, shares=False)
crossed_replies_factory = _per_rank(CrossedRepliesStore, shares=False)
stale_cache_factory = _per_rank(StaleCacheStore, shares=False)
jitter_factory = _per_rank(JitterStore)

class _Twice(concurrent.futures.Future):
    """A future that calls each done-callback twice: every completion is delivered twice."""

    def add_done_callback(self, fn: Callable) -> None:
        super().add_done_callback(fn)
        super().add_done_callback(fn)


class DoubleCompletionStore(MemoryStore):
    """`get_async` hands out a future that delivers its completion twice (a callback registered once runs twice)."""

    paths = _RACY_PATHS

    def get_async(self, key: str) -> concurrent.futures.Future:
        self._check()
        fut = _Twice()
        fut.set_result(self.data.get(key))
        return fut


double_completion_factory = _per_rank(DoubleCompletionStore, shares=False)

#: Every racy store (correct one call at a time, broken under overlap): its factory and the concurrent-layer
#: property it violates (from `model.checks.CATALOG`; the double completion is no race, so not among them).
RACY_STORES: dict[str, tuple[Callable[..., list], str]] = {
    name.removesuffix("_factory").replace("_", "-"): (globals()[name], p.name)
    for p in CATALOG if p.layer == "concurrency" and p.name != "double-completion" for name in p.demos}
