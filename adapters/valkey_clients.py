"""Store clients over valkey-py: a correct reference client, and known-bad ones the real-server faults catch.

`reference_factory` is what a store client owes its caller under a misbehaving tier: a connection pool (a dead
connection is dropped and a new one made), every socket operation bounded (a fifth of the op timeout, connecting
included) with one retry, so a call answers (or raises) within its bound whatever the server does, and it never
answers from a guess. Each of the others is an honest client a user could ship, correct on a healthy server one op
at a time, that a real fault breaks (the demos of `model.checks`' nemesis properties):

- `never_reconnect_factory` (`recovery`): a circuit breaker that opens on the first connection error and never
  closes: every later call fails at once, also long after the server is back;
- `no_timeout_factory` (`fault-hang`): no socket timeout: a call on a paused or sleeping server waits as long as the
  server does, beyond the caller's bound;
- `stale_on_error_factory` (`fault-integrity`): serves the last value it saw for a key when the server errs ("serve
  stale on error"), and its delete forgets to drop that value: a read during a fault answers a value from before a
  delete.

Options: `op_timeout` (default `model.calls.DEFAULT_OP_TIMEOUT`), `urls=[...]` (one per rank, or one with
`topology="shared"`), `password`. Without `urls` a factory starts its own servers (one per rank), stopped when its
last store closes. Every store names its server (`endpoint`), so the nemesis can find it.
"""
from __future__ import annotations

import concurrent.futures as cf
from typing import Any, Callable, Sequence

from adapters.lmcache_runtime import _Servers, stores_over
from model.calls import DEFAULT_OP_TIMEOUT
from model.checks import CATALOG

__all__ = ["ValkeyStore", "reference_factory", "NeverReconnectStore", "never_reconnect_factory", "NoTimeoutStore",
           "no_timeout_factory", "StaleOnErrorStore", "stale_on_error_factory", "NEMESIS_DEMOS"]

#: Share of the op timeout one socket operation may take (connect, send, read): two attempts fit in the bound.
SOCKET_SHARE = 0.2


class ValkeyStore:
    """One rank's store over valkey-py: pooled, bounded, retried once on a connection error or a timeout."""

    paths = ("get", "get_async", "get_batch", "contains")
    read_paths = ("get", "get_async", "get_batch")
    thread_safe = True
    max_value_bytes = 1 << 20
    socket_timeout: float | None = None  # None: SOCKET_SHARE x op_timeout

    def __init__(self, rank: int, n_ranks: int, servers: _Servers, *, op_timeout: float = DEFAULT_OP_TIMEOUT) -> None:
        import valkey
        from valkey.backoff import NoBackoff
        from valkey.retry import Retry

        self.rank, self.n_ranks, self._servers = rank, n_ranks, servers
        self.host, self.port = servers.endpoint(rank)
        self.password = servers.password
        self.endpoint = (self.host, self.port)
        self.op_timeout = float(op_timeout)
        self.prefix = f"r{rank}:" if servers.topology == "shared" else ""
        timeout = self._socket_timeout()
        self.pool = valkey.ConnectionPool(host=self.host, port=self.port, password=self.password,
                                          socket_timeout=timeout, socket_connect_timeout=timeout,
                                          max_connections=32)
        self.client = valkey.Valkey(connection_pool=self.pool, retry=self._retry(Retry, NoBackoff),
                                    retry_on_error=[valkey.ConnectionError, valkey.TimeoutError])
        self._reads = cf.ThreadPoolExecutor(4, thread_name_prefix=f"shardcheck-valkey-r{rank}")
        self._closed = False

    def _socket_timeout(self) -> float | None:
        return SOCKET_SHARE * self.op_timeout

    def _retry(self, retry: Any, backoff: Any) -> Any:
        return retry(backoff(), 1)

    def _run(self, op: str, key: str, fn: Callable[[], Any]) -> Any:
        return fn()

    def put(self, key: str, value: bytes) -> None:
        self._run("put", key, lambda: self.client.set(self.prefix + key, bytes(value)))

    def get(self, key: str) -> bytes | None:
        return self._run("get", key, lambda: self.client.get(self.prefix + key))

    def contains(self, key: str) -> bool:
        return bool(self._run("contains", key, lambda: self.client.exists(self.prefix + key)))

    def delete(self, key: str) -> None:
        self._run("delete", key, lambda: self.client.delete(self.prefix + key))

    def get_batch(self, keys: Sequence[str]) -> list[bytes | None]:
        if not keys:
            return []
        return list(self._run("get_batch", ",".join(keys), lambda: self.client.mget([self.prefix + k for k in keys])))

    def get_async(self, key: str) -> cf.Future:
        return self._reads.submit(self.get, key)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._reads.shutdown(wait=False, cancel_futures=True)
        self.pool.disconnect()
        self._servers.release()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}/{self.n_ranks}, {self.host}:{self.port})"


class NeverReconnectStore(ValkeyStore):
    """A circuit breaker that never closes: the first connection error or timeout marks the client broken, and
    every later call raises at once (no retry, no reconnect)."""

    broken: str | None = None

    def _retry(self, retry: Any, backoff: Any) -> Any:
        return retry(backoff(), 0)

    def _run(self, op: str, key: str, fn: Callable[[], Any]) -> Any:
        import valkey

        if self.broken:
            raise ConnectionError(f"the connection is broken since {self.broken}")
        try:
            return fn()
        except (valkey.ConnectionError, valkey.TimeoutError) as exc:
            self.broken = f"{op}({key!r}) failed: {type(exc).__name__}: {exc}"
            raise


class NoTimeoutStore(ValkeyStore):
    """No socket timeout: a call on a server that does not answer waits until it does."""

    def _socket_timeout(self) -> float | None:
        return None


class StaleOnErrorStore(ValkeyStore):
    """Serves the last value it put or read for a key when the server errs; `delete` does not drop it."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.last_seen: dict[str, bytes] = {}

    def put(self, key: str, value: bytes) -> None:
        super().put(key, value)
        self.last_seen[key] = bytes(value)

    def get(self, key: str) -> bytes | None:
        import valkey

        try:
            value = super().get(key)
        except (valkey.ConnectionError, valkey.TimeoutError):
            return self.last_seen.get(key)  # the server is unavailable: serve what we saw last
        if value is not None:
            self.last_seen[key] = value
        return value


def _factory(cls: type, *, self_bounded: bool = True) -> Callable[..., list]:
    def factory(n_ranks: int, *, op_timeout: float = DEFAULT_OP_TIMEOUT, urls: Sequence[str] | None = None,
                password: str | None = None, topology: str = "per-rank", **_: Any) -> list:
        if n_ranks < 1:
            raise ValueError(f"n_ranks must be >= 1, got {n_ranks}")
        servers = _Servers(n_ranks, topology, urls, password)
        return stores_over(servers, n_ranks, lambda rank: cls(rank, n_ranks, servers, op_timeout=op_timeout))

    factory.__name__ = factory.__qualname__ = f"{cls.__name__}_factory"
    factory.__doc__ = f"`{cls.__name__}` per rank (see the module doc)."
    factory.options = ("op_timeout", "urls", "password", "topology")  # type: ignore[attr-defined]
    factory.self_bounded = self_bounded  # type: ignore[attr-defined]
    return factory


reference_factory = _factory(ValkeyStore)
never_reconnect_factory = _factory(NeverReconnectStore)
no_timeout_factory = _factory(NoTimeoutStore, self_bounded=False)
stale_on_error_factory = _factory(StaleOnErrorStore)

#: Every known-bad client of the nemesis properties: its factory and the property it violates (`model.checks`).
NEMESIS_DEMOS: dict[str, tuple[Callable[..., list], str]] = {
    name.removesuffix("_factory").replace("_", "-"): (globals()[name], p.name)
    for p in CATALOG if p.layer == "nemesis" for name in p.demos}
