"""Real LMCache (0.5.6) store clients against real Valkey servers, one per rank.

Each class implements the contract's `RankStore` (put/get/contains/delete/get_async/close) over a
real LMCache client class, plus optional extra read paths, all declared in `paths`. Factories follow
`factory(n_ranks, **options) -> list[RankStore]` (one store per rank, rank order):

- `resp_factory`   (`--client lmcache`):        LMCache's `RemoteBackend` with `remote_url=resp://`
  (RESPConnector over the native RESP client), built from `LMCacheEngineConfig`,
  `LMCacheMetadata` (worker_id = rank, world_size = N) and a CPU `LocalCPUBackend`;
- `adapters.lmcache_native.native_factory` (`--client lmcache-native`): the native RESP client class the connector uses
  (`lmcache.v1.storage_backend.native_clients.resp_client.RESPClient`), directly;
- `valkey_factory` (`--client lmcache-valkey`): `RemoteBackend` with `remote_url=valkey://`
  (LMCache's ValkeyConnector over valkey-glide).

Options (keyword-only): `topology="per-rank"|"shared"`, `use_mla=True`, `op_timeout=2.0` (`model.calls.DEFAULT_OP_TIMEOUT`),
`urls=[...]` (already-running servers; per-rank: one per rank, shared: one), `password=None`,
`num_workers=8`. Without `urls` the factory starts its own servers and the stores own them:
closing every store stops them.

Values: LMCache moves fixed-size KV chunks, so each contract value is carried in one LMCache
chunk (`CHUNK_BYTES` bytes): a frame `b"SCV1" + len (u32 LE) + value + zero padding`. A chunk
that LMCache returns as a hit but that holds no frame is handed back raw (all `CHUNK_BYTES`
bytes), so a miss that LMCache reports as a hit shows up as wrong bytes, not as a silent miss.

Keys: the contract's str key maps deterministically to `CacheEngineKey(model_name="shardcheck",
world_size=N, worker_id=rank, chunk_hash=<63-bit blake2b of the str>, dtype=uint8)`; the RESP
and Valkey servers then see LMCache's own key string `shardcheck@N@rank@<hex>@uint8`.

Bounds: every call runs LMCache code on another thread (or on the store's event loop) and waits
at most `op_timeout`; past it the call raises `model.contract.StoreCallTimeout(op, key, seconds)`.
`close()` never blocks (LMCache's own close runs on a daemon thread for a short bounded time).

`delete` is eviction: a DEL on a separate admin connection to the rank's server (LMCache 0.5.6's
RESP connector has no remove; the harness evicts like the server's LRU would).
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import itertools
import logging
import os
import struct
import threading
import time
from typing import Any, Sequence

from adapters.lmcache_runtime import Bounded, _resp_command, _Servers, _then, stores_over  # noqa: F401  (Bounded: public)
from adapters.resp import await_new_clients, client_ids as _client_ids
from adapters.valkey_servers import ServerSet

from model.calls import DEFAULT_OP_TIMEOUT
from model.contract import StoreCallTimeout

__all__ = [
    "resp_factory", "valkey_factory", "StoreCallTimeout",
    "BackendStore", "CHUNK_BYTES", "encode_frame", "decode_frame", "lmcache_key",
    "Bounded", "DEFAULT_OP_TIMEOUT",
]

# LMCache logs at INFO from import on (and in every rank and tier process): ERROR unless SHARDCHECK_LMCACHE_LOGS is set
if not os.environ.get("SHARDCHECK_LMCACHE_LOGS"):
    os.environ.setdefault("LMCACHE_LOG_LEVEL", "ERROR")

MODEL_NAME = "shardcheck"
CHUNK_TOKENS = 16
NUM_LAYERS = 8
# non-MLA: [2, layers, tokens, 1*16]; MLA: [1, layers, tokens, 1*32] -> both 4096 uint8 bytes
KV_SHAPE = {False: (NUM_LAYERS, 2, CHUNK_TOKENS, 1, 16), True: (NUM_LAYERS, 1, CHUNK_TOKENS, 1, 32)}
CHUNK_BYTES = 4096
# LocalCPUBackend pins and zero-fills this much per store at start (0.25 GB took 1.2 s): keep it small
LOCAL_CPU_GB = 0.02
MAGIC = b"SCV1"
HEADER = struct.Struct("<4sI")
MAX_VALUE = CHUNK_BYTES - HEADER.size

_quiet_done = False


def _quiet_lmcache_logs(force: bool = False) -> None:
    """LMCache logs every connector creation at INFO/WARNING, and valkey-glide's Rust core (under
    `lmcache-valkey`) logs every failed connection attempt at WARN to stdout; keep both to errors
    (set SHARDCHECK_LMCACHE_LOGS=1 to see them)."""
    global _quiet_done
    if (_quiet_done and not force) or os.environ.get("SHARDCHECK_LMCACHE_LOGS"):
        return
    _quiet_done = True
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("lmcache"):
            logging.getLogger(name).setLevel(logging.ERROR)
    logging.getLogger("lmcache").setLevel(logging.ERROR)
    try:
        from glide_sync import Logger, LogLevel
    except ImportError:  # glide is only there with LMCache's valkey extra
        return
    Logger.set_logger_config(LogLevel.ERROR)


# --------------------------------------------------------------------------- values and keys

def encode_frame(value: bytes) -> bytes:
    value = bytes(value)
    if len(value) > MAX_VALUE:
        raise ValueError(f"value of {len(value)} bytes exceeds one LMCache chunk ({MAX_VALUE} bytes)")
    return HEADER.pack(MAGIC, len(value)) + value + bytes(CHUNK_BYTES - HEADER.size - len(value))


def decode_frame(chunk: bytes | memoryview) -> bytes:
    chunk = bytes(chunk)
    if len(chunk) >= HEADER.size:
        magic, n = HEADER.unpack_from(chunk)
        if magic == MAGIC and HEADER.size + n <= len(chunk):
            return chunk[HEADER.size:HEADER.size + n]
    return chunk  # not a frame anybody wrote: hand it back raw


def chunk_hash_of(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") >> 1


def lmcache_key(key: str, rank: int, n_ranks: int):
    import torch
    from lmcache.utils import CacheEngineKey

    return CacheEngineKey(MODEL_NAME, n_ranks, rank, chunk_hash_of(key), torch.uint8)


# --------------------------------------------------------------------------- base store

class _StoreBase:
    #: Every public read/lookup operation (CONTRACT.md's optional `paths`); the concurrent layer drives each.
    paths: tuple[str, ...] = ("get", "get_async", "contains")
    #: Calls may overlap from several threads (CONTRACT.md's optional `thread_safe`).
    thread_safe = True
    client_name = "?"
    #: The largest value one store holds (one LMCache chunk less the frame header): an optional RankStore member.
    max_value_bytes = MAX_VALUE

    def __init__(self, rank: int, n_ranks: int, servers: _Servers, *, use_mla: bool,
                 op_timeout: float, num_workers: int) -> None:
        _quiet_lmcache_logs()
        self.rank = rank
        self.n_ranks = n_ranks
        self.use_mla = bool(use_mla)
        self.op_timeout = float(op_timeout)
        self.num_workers = int(num_workers)
        self._servers = servers
        self.host, self.port = servers.endpoint(rank)
        self.password = servers.password
        self.bounded = Bounded(op_timeout, f"shardcheck-{self.client_name}-r{rank}")
        self._closed = False
        self._lookup_ids = itertools.count()

    #: The connections the client makes to its server per worker (LMCache's native RESP client: one, when the worker
    #: starts, on a thread of its own); None when not known (then a store does not wait for them).
    connections_per_worker: int | None = None

    def _newest_client_id(self) -> int | None:
        """The server's newest client id before this store's client exists (None: its connections are not waited for)."""
        return None if self.connections_per_worker is None else _client_ids(self.host, self.port, self.password)[0]

    def await_connections(self, timeout: float = 10.0) -> None:
        """Return once the client holds all its connections (`adapters.nemesis` asks before it strikes: CLIENT KILL
        at a trace's first op must meet every one of them, not only the workers that happened to connect first). Once:
        a client that lost its connections to a fault makes them again on its next call, not before a strike."""
        after, self._connected_after = getattr(self, "_connected_after", None), None
        if after is not None:
            await_new_clients(self.host, self.port, self.password, after=after, timeout=timeout,
                              want=self.num_workers * int(self.connections_per_worker or 0), who=self.client_name)

    # key naming
    def lmcache_key(self, key: str):
        return lmcache_key(key, self.rank, self.n_ranks)

    def key_string(self, key: str) -> str:
        return self.lmcache_key(key).to_string()

    def server_key(self, key: str) -> str:
        """The key the server holds `key` under (the server's own evictions delete it: `adapters.shared_tier`)."""
        return self.key_string(key)

    @property
    def servers(self) -> ServerSet | None:
        """The servers this store's factory started (None when it was given `urls`)."""
        return self._servers.owned

    def delete(self, key: str) -> None:
        """Evict: DEL LMCache's key string on an admin connection to this rank's server (a fresh connection the
        server drops under a burst of them is retried twice: DEL is idempotent); every socket operation is bounded
        by a quarter of the op timeout, so a server that does not answer makes it raise within its bound."""
        ks = self.key_string(key)
        timeout = min(2.0, self.op_timeout / 4)

        def evict() -> bytes:
            for attempt in range(3):
                try:
                    return _resp_command(self.host, self.port, self.password, "DEL", ks, timeout=timeout)
                except (BrokenPipeError, ConnectionResetError):
                    if attempt == 2:
                        raise
                    time.sleep(0.01)
            raise AssertionError("unreachable")

        self.bounded.call("delete", key, evict)

    def server_keys(self) -> list[str]:
        """Every key on this rank's server (diagnostics: which key names a client wrote)."""
        raw = self.bounded.call("keys", "*", lambda: _resp_command(self.host, self.port, self.password, "KEYS", "*"))
        parts = raw.split(b"\r\n")
        return [p.decode() for i, p in enumerate(parts) if i > 0 and parts[i - 1].startswith(b"$")]

    def _shutdown_client(self) -> None:  # subclass: LMCache's own close
        pass

    def close(self) -> None:
        """Never blocks: LMCache's close runs on a daemon thread, waited for at most 0.05 s."""
        if self._closed:
            return
        self._closed = True
        t = threading.Thread(target=self._shutdown_client, name="lmcache-close", daemon=True)
        t.start()
        t.join(min(0.05, self.op_timeout))
        self.bounded.stop()
        self._servers.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(rank={self.rank}/{self.n_ranks}, {self.host}:{self.port}, "
                f"mla={self.use_mla})")


# --------------------------------------------------------------------------- RemoteBackend stores

def _engine_objects(scheme: str, host: str, port: int, rank: int, n_ranks: int, use_mla: bool,
                    password: str | None, num_workers: int, extra: dict | None = None):
    import torch
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.metadata import LMCacheMetadata

    extra_config: dict[str, Any] = {"save_chunk_meta": False}
    if scheme == "resp":
        extra_config["resp_num_threads"] = num_workers
        if password is not None:
            extra_config["password"] = password
    elif scheme == "valkey":
        extra_config["valkey_num_workers"] = num_workers
        if password is not None:
            extra_config["valkey_password"] = password
    extra_config.update(extra or {})
    config = LMCacheEngineConfig.from_defaults(
        chunk_size=CHUNK_TOKENS, local_cpu=False, max_local_cpu_size=LOCAL_CPU_GB,
        remote_url=f"{scheme}://{host}:{port}", remote_serde="naive", extra_config=extra_config)
    metadata = LMCacheMetadata(
        model_name=MODEL_NAME, world_size=n_ranks, local_world_size=n_ranks, worker_id=rank,
        local_worker_id=rank, kv_dtype=torch.uint8, kv_shape=KV_SHAPE[bool(use_mla)],
        use_mla=bool(use_mla), chunk_size=CHUNK_TOKENS)
    return config, metadata


class BackendStore(_StoreBase):
    """One rank's store over LMCache's `RemoteBackend` (the remote tier the engine uses)."""

    scheme = "resp"
    connections_per_worker = 1
    client_name = "lmcache"
    paths = ("get", "get_async", "get_batch", "get_prefix", "contains", "contains_batch", "contains_async")

    def __init__(self, rank: int, n_ranks: int, servers: _Servers, *, use_mla: bool = True,
                 op_timeout: float = DEFAULT_OP_TIMEOUT, num_workers: int = 8,
                 extra_config: dict | None = None) -> None:
        super().__init__(rank, n_ranks, servers, use_mla=use_mla, op_timeout=op_timeout,
                         num_workers=num_workers)
        try:
            self._connect(extra_config)
        except BaseException:
            self.bounded.stop()  # no store to close: do not leave its loop behind
            raise

    def _connect(self, extra_config: dict | None) -> None:
        from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
        from lmcache.v1.storage_backend.remote_backend import RemoteBackend

        rank, n_ranks = self.rank, self.n_ranks
        _quiet_lmcache_logs(force=True)
        self.config, self.metadata = _engine_objects(
            self.scheme, self.host, self.port, rank, n_ranks, self.use_mla, self.password,
            self.num_workers, extra_config)
        self.cpu = LocalCPUBackend(self.config, self.metadata)
        setup_timeout = max(10.0, self.op_timeout)
        self._connected_after = self._newest_client_id()
        self.backend = self.bounded.call(
            "connect", f"{self.scheme}://{self.host}:{self.port}",
            lambda: RemoteBackend(self.config, self.metadata, self.bounded.loop, self.cpu),
            timeout=setup_timeout)
        if self.backend.connection is None:
            raise ConnectionError(f"LMCache could not connect to {self.scheme}://{self.host}:{self.port}")
        conn = self.backend.connection
        inner = getattr(conn, "_connector", conn)
        self.full_chunk_size_bytes = inner.full_chunk_size_bytes
        assert self.full_chunk_size_bytes == CHUNK_BYTES, self.full_chunk_size_bytes
        self._shapes, self._dtypes, self._fmt = inner.meta_shapes, inner.meta_dtypes, inner.meta_fmt

    # memory objects
    def _memory_obj(self, value: bytes):
        frame = encode_frame(value)
        mo = self.cpu.allocate(self._shapes, self._dtypes, self._fmt)
        if mo is None:
            raise MemoryError("LMCache LocalCPUBackend could not allocate a chunk")
        view = mo.byte_array
        if not isinstance(view, memoryview):
            view = memoryview(view)
        view.cast("B")[:] = frame
        return mo

    @staticmethod
    def _bytes_of(mo) -> bytes:
        view = mo.byte_array
        if not isinstance(view, memoryview):
            view = memoryview(view)
        data = bytes(view.cast("B"))
        try:
            mo.ref_count_down()
        except Exception:
            pass
        return data

    def _value_of(self, mo) -> bytes | None:
        if mo is None:
            return None
        return decode_frame(self._bytes_of(mo))

    # contract
    def put(self, key: str, value: bytes) -> None:
        lk = self.lmcache_key(key)

        def do() -> None:
            mo = self._memory_obj(value)
            try:
                fut = self.backend.submit_put_task(lk, mo)
                fut.result()
            finally:
                mo.ref_count_down()

        self.bounded.call("put", key, do)

    def get(self, key: str) -> bytes | None:
        lk = self.lmcache_key(key)
        return self.bounded.call("get", key, lambda: self._value_of(self.backend.get_blocking(lk)))

    def contains(self, key: str) -> bool:
        lk = self.lmcache_key(key)
        return bool(self.bounded.call("contains", key, lambda: self.backend.contains(lk)))

    def get_async(self, key: str) -> cf.Future:
        """LMCache's async read path: `batched_get_non_blocking` (the prefetch path), one key."""
        lk = self.lmcache_key(key)
        lookup_id = f"shardcheck-{self.rank}-{next(self._lookup_ids)}"
        fut = self.bounded.submit(lambda: self.backend.batched_get_non_blocking(lookup_id, [lk]))
        return _then(fut, lambda objs: self._value_of(objs[0]) if objs else None)

    # extra read paths
    def get_batch(self, keys: Sequence[str]) -> list[bytes | None]:
        """`RemoteBackend.batched_get_blocking`: one value (or None) per key."""
        lks = [self.lmcache_key(k) for k in keys]
        label = ",".join(keys)
        objs = self.bounded.call("get_batch", label, lambda: self.backend.batched_get_blocking(lks))
        return [self._value_of(o) for o in objs]

    def get_prefix(self, keys: Sequence[str]) -> list[bytes]:
        """The async prefetch path on several keys: the values of the leading run of hits."""
        lks = [self.lmcache_key(k) for k in keys]
        lookup_id = f"shardcheck-{self.rank}-{next(self._lookup_ids)}"
        objs = self.bounded.run("get_prefix", ",".join(keys),
                                lambda: self.backend.batched_get_non_blocking(lookup_id, lks))
        return [self._value_of(o) for o in objs]  # type: ignore[misc]

    def contains_batch(self, keys: Sequence[str]) -> int:
        """`RemoteBackend.batched_contains`: how many leading keys exist."""
        lks = [self.lmcache_key(k) for k in keys]
        return int(self.bounded.call("contains_batch", ",".join(keys),
                                     lambda: self.backend.batched_contains(lks)))

    def contains_async(self, keys: Sequence[str]) -> int:
        """`RemoteBackend.batched_async_contains`: how many leading keys exist (async path)."""
        lks = [self.lmcache_key(k) for k in keys]
        lookup_id = f"shardcheck-{self.rank}-{next(self._lookup_ids)}"
        return int(self.bounded.run("contains_async", ",".join(keys),
                                    lambda: self.backend.batched_async_contains(lookup_id, lks)))

    def _shutdown_client(self) -> None:
        try:
            self.backend.close()
        except Exception:
            pass


class ValkeyBackendStore(BackendStore):
    scheme = "valkey"
    connections_per_worker = None  # (valkey-glide's own: not waited for)
    client_name = "lmcache-valkey"


# --------------------------------------------------------------------------- factories

def _make(cls: type, n_ranks: int, *, topology: str = "per-rank", use_mla: bool = True,
          op_timeout: float = DEFAULT_OP_TIMEOUT, urls: Sequence[str] | None = None,
          password: str | None = None, num_workers: int = 8, **extra: Any) -> list:
    if n_ranks < 1:
        raise ValueError(f"n_ranks must be >= 1, got {n_ranks}")
    servers = _Servers(n_ranks, topology, urls, password)
    return stores_over(servers, n_ranks, lambda rank: cls(rank, n_ranks, servers, use_mla=use_mla,
                                                          op_timeout=op_timeout, num_workers=num_workers, **extra))


def resp_factory(n_ranks: int, **options: Any) -> list[BackendStore]:
    """`--client lmcache`: LMCache's RemoteBackend over resp:// (RESPConnector), one per rank."""
    return _make(BackendStore, n_ranks, **options)


def valkey_factory(n_ranks: int, **options: Any) -> list[ValkeyBackendStore]:
    """`--client lmcache-valkey`: LMCache's RemoteBackend over valkey:// (ValkeyConnector)."""
    return _make(ValkeyBackendStore, n_ranks, **options)
