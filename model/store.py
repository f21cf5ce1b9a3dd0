"""The in-memory store model: one `MemoryStore` per rank, the default client `model`; and in-memory servers
(`MemoryTier`) that several clients share, as every engine of a deployment shares the tier's servers."""
from __future__ import annotations

import concurrent.futures
import itertools
import threading
from typing import Any, Sequence

__all__ = ["MemoryStore", "memory_factory", "MemoryTier", "memory_tier", "server_data", "SCHEME", "MEMORY_CLIENT"]

#: The in-memory client's name (`runtime.registry.MEMORY_CLIENTS`, the default client; what a trace of a model run
#: records).
MEMORY_CLIENT = "model"

#: The URL scheme of an in-memory server: `memory://<tier>/<rank>`.
SCHEME = "memory://"
_SERVERS: dict[str, dict[str, bytes]] = {}
_servers_lock = threading.Lock()
_tiers = itertools.count()


def server_data(url: str) -> dict[str, bytes]:
    """The data of the in-memory server `url` (a `MemoryTier`'s); `ValueError` naming it when there is none."""
    with _servers_lock:
        data = _SERVERS.get(url)
    if data is None:
        raise ValueError(f"no in-memory server {url!r} (in-memory servers come from model.store.memory_tier)")
    return data


class MemoryStore:
    """A rank's store as a dict; every call returns at once and `get_async` resolves immediately. `data` is
    its server's dict: its own (the default), or an in-memory server several clients share.

    Faults (evictions, lost and delayed completions) are injected by the harness and the simulator,
    in logical time, not by this class.
    """

    paths = ("get", "get_async", "get_batch", "contains")

    def __init__(self, data: dict[str, bytes] | None = None) -> None:
        self.data: dict[str, bytes] = {} if data is None else data
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


def rank_data(n_ranks: int, urls: Sequence[str] | None) -> list[dict[str, bytes] | None]:
    """Each rank's server data: its own (None) without `urls`, else the in-memory server of each rank's url."""
    if urls is None:
        return [None] * n_ranks
    if isinstance(urls, str) or len(urls) < n_ranks:
        raise ValueError(f"{n_ranks} rank(s) need {n_ranks} url(s), got {urls!r}")
    return [server_data(u) for u in urls[:n_ranks]]


def memory_factory(n_ranks: int, *, urls: Sequence[str] | None = None) -> list[MemoryStore]:
    """The `model` client: one fresh in-memory store per rank; with `urls` (a `MemoryTier`'s), stores of those
    in-memory servers, so that several calls make several clients of the same servers."""
    return [MemoryStore(data) for data in rank_data(n_ranks, urls)]


class MemoryTier:
    """`n` in-memory servers that several clients share (`memory_factory(n, urls=tier.urls)` each time); `evict`
    is the server's own eviction of a key, seen by no client first."""

    def __init__(self, n: int) -> None:
        name = f"tier{next(_tiers)}"
        self.urls = [f"{SCHEME}{name}/{rank}" for rank in range(n)]
        with _servers_lock:
            for url in self.urls:
                _SERVERS[url] = {}

    def evict(self, rank: int, key: str, store: Any = None) -> None:
        server_data(self.urls[rank]).pop(key, None)

    def close(self) -> None:
        with _servers_lock:
            for url in self.urls:
                _SERVERS.pop(url, None)

    def __enter__(self) -> "MemoryTier":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def memory_tier(n_ranks: int, **options: Any) -> MemoryTier:
    """The in-memory client's servers for the shared-tier checks (`runtime.tier`); it takes no options (there is
    no server of a user's to name)."""
    if options:
        raise TypeError(f"in-memory servers take no options, got {sorted(options)}")
    return MemoryTier(n_ranks)
