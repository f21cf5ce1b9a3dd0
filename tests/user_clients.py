"""Store clients as a user would write them, for the tests of a user's own client on a user's own tier.

- `valkey_factory`: a client over valkey-py (a connection pool per server, an executor for `get_async`, `MGET` for
  batches), over the user's servers (`urls=`) or embedded ones it starts and stops itself;
  `strict_valkey_factory` is the same client as a stricter user writes its factory: exactly one url per rank;
- `shared_reply_factory`: a client whose sync calls and async worker share one reply slot without a lock, as a
  hand-rolled pipeline on one socket does: a sync read now and then takes an async read's reply (racy, in memory);
  `locked_reply_factory` is the same client with the lock (correct).
"""
from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from typing import Any, Sequence

import valkey

from adapters.valkey_servers import start_servers

__all__ = ["ValkeyPyStore", "valkey_factory", "strict_valkey_factory", "SharedReplyStore", "shared_reply_factory", "locked_reply_factory"]


class ValkeyPyStore:
    """One rank's store on one Valkey server, over valkey-py."""

    paths = ("get", "get_async", "get_batch", "contains")

    def __init__(self, url: str, op_timeout: float = 2.0, owner: Any = None) -> None:
        self.client = valkey.Valkey.from_url(url, socket_timeout=op_timeout, socket_connect_timeout=op_timeout)
        self.pool = cf.ThreadPoolExecutor(2, thread_name_prefix="user-valkey")
        self.owner = owner

    def put(self, key: str, value: bytes) -> None:
        self.client.set(key, bytes(value))

    def get(self, key: str) -> bytes | None:
        return self.client.get(key)

    def contains(self, key: str) -> bool:
        return bool(self.client.exists(key))

    def delete(self, key: str) -> None:
        self.client.delete(key)

    def get_async(self, key: str) -> cf.Future:
        return self.pool.submit(self.client.get, key)

    def get_batch(self, keys: list[str]) -> list[bytes | None]:
        return list(self.client.mget(keys))

    def close(self) -> None:
        self.pool.shutdown(wait=False)
        self.client.close()
        if self.owner is not None:
            self.owner.release()


class _Owned:
    """Embedded servers a factory call started: stopped when its last store closes."""

    def __init__(self, n: int) -> None:
        self.servers, self.refs, self.lock = start_servers(n), n, threading.Lock()

    def release(self) -> None:
        with self.lock:
            self.refs -= 1
            last = self.refs == 0
        if last:
            self.servers.stop()


def valkey_factory(n_ranks: int, urls: Sequence[str] | None = None, op_timeout: float = 2.0) -> list[ValkeyPyStore]:
    """One store per rank: on the first `n_ranks` of `urls`, or on embedded servers of its own."""
    if urls is None:
        owned = _Owned(n_ranks)
        return [ValkeyPyStore(u, op_timeout, owned) for u in owned.servers.urls]
    if len(urls) < n_ranks:
        raise ValueError(f"{n_ranks} ranks need {n_ranks} servers, got {len(urls)} urls")
    return [ValkeyPyStore(u, op_timeout) for u in urls[:n_ranks]]


def strict_valkey_factory(n_ranks: int, urls: Sequence[str] | None = None,
                          op_timeout: float = 2.0) -> list[ValkeyPyStore]:
    """One store per rank on the user's servers, one url per rank, no more and no fewer."""
    if urls is None or len(urls) != n_ranks:
        raise ValueError(f"need {n_ranks} urls (one per rank), got {0 if urls is None else len(urls)}")
    return [ValkeyPyStore(u, op_timeout) for u in urls]


class SharedReplyStore:
    """An in-memory store whose every read goes through one reply slot, as over one pipelined socket."""

    paths = ("get", "get_async", "contains")
    locked = False

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.reply: Any = None
        self.wire = threading.Lock()
        self.pool = cf.ThreadPoolExecutor(1, thread_name_prefix="user-pipeline")

    def _round_trip(self, key: str) -> Any:
        with self.wire if self.locked else _NO_LOCK:
            self.reply = self.data.get(key)  # the request goes out ...
            time.sleep(0.0002)               # ... the wire ...
            return self.reply                # ... and the next reply is read back: maybe another caller's

    def put(self, key: str, value: bytes) -> None:
        self.data[key] = bytes(value)

    def get(self, key: str) -> bytes | None:
        return self._round_trip(key)

    def contains(self, key: str) -> bool:
        return self._round_trip(key) is not None

    def delete(self, key: str) -> None:
        self.data.pop(key, None)

    def get_async(self, key: str) -> cf.Future:
        return self.pool.submit(self._round_trip, key)

    def close(self) -> None:
        self.pool.shutdown(wait=False)


class LockedReplyStore(SharedReplyStore):
    """The same client with the wire locked: correct."""

    locked = True


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


_NO_LOCK = _NoLock()


def shared_reply_factory(n_ranks: int, **options: Any) -> list[SharedReplyStore]:
    return [SharedReplyStore() for _ in range(n_ranks)]


def locked_reply_factory(n_ranks: int, **options: Any) -> list[SharedReplyStore]:
    return [LockedReplyStore() for _ in range(n_ranks)]
