"""Buggy twins of the user's valkey-py client (`tests.user_clients.ValkeyPyStore`), each as an engineer could ship
it: every one passes a quick test of one client doing put-then-get.

- `local_cache_factory`: reads go through a client-local cache that only this client's own writes update; correct
  alone, wrong when another engine's client (or the server's LRU) deletes or overwrites a key;
- `ttl_factory`: every value written with a 1 s TTL (`SET key value EX 1`): the cache is empty a second later;
- `mget_shift_factory`: `get_batch` filters MGET's nils before pairing values with keys: with a miss before a hit,
  the hit's value is answered for the missed key.
"""
from __future__ import annotations

from typing import Any, Sequence

from tests.user_clients import ValkeyPyStore, _Owned

__all__ = ["LocalCacheStore", "TtlStore", "MgetShiftStore", "local_cache_factory", "ttl_factory",
           "mget_shift_factory"]


class LocalCacheStore(ValkeyPyStore):
    """valkey-py with a local read cache: a hit is served from memory, filled by reads and by this client's writes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cache: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        if key in self.cache:
            return self.cache[key]
        value = super().get(key)
        if value is not None:
            self.cache[key] = value
        return value

    def get_async(self, key: str):
        return self.pool.submit(self.get, key)

    def get_batch(self, keys: list[str]) -> list[bytes | None]:
        return [self.get(k) for k in keys]

    def contains(self, key: str) -> bool:
        return key in self.cache or super().contains(key)

    def put(self, key: str, value: bytes) -> None:
        super().put(key, value)
        self.cache[key] = bytes(value)

    def delete(self, key: str) -> None:
        super().delete(key)
        self.cache.pop(key, None)


class TtlStore(ValkeyPyStore):
    """valkey-py writing every value with a 1 s expiry (so that "the cache never fills the server")."""

    def put(self, key: str, value: bytes) -> None:
        self.client.set(key, bytes(value), ex=1)


class MgetShiftStore(ValkeyPyStore):
    """valkey-py whose batch read drops MGET's misses before pairing the values with the keys."""

    def get_batch(self, keys: list[str]) -> list[bytes | None]:
        found = [v for v in self.client.mget(keys) if v is not None]
        return found + [None] * (len(keys) - len(found))


def _factory(cls: type):
    """A factory of `cls` stores, as `tests.user_clients.valkey_factory` makes its own: on the user's `urls`, or on
    embedded servers it starts (and stops when its last store closes)."""
    def factory(n_ranks: int, urls: Sequence[str] | None = None, op_timeout: float = 2.0) -> list:
        if urls is None:
            owned = _Owned(n_ranks)
            return [cls(u, op_timeout, owned) for u in owned.servers.urls]
        if len(urls) < n_ranks:
            raise ValueError(f"{n_ranks} ranks need {n_ranks} servers, got {len(urls)} urls")
        return [cls(u, op_timeout) for u in urls[:n_ranks]]
    factory.__name__ = f"{cls.__name__}_factory"
    return factory


local_cache_factory = _factory(LocalCacheStore)
ttl_factory = _factory(TtlStore)
mget_shift_factory = _factory(MgetShiftStore)
