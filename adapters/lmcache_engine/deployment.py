"""A real LMCache 0.5.6 deployment on CPU: `--engine lmcache` (stock) and `--engine lmcache-patched`.

`LMCacheDeployment(n_ranks, lookup=..., models=...)` builds, per entry of `models` (a deployment: one model, its own
engine id), `n_ranks` real `LMCacheEngine`s (`LMCacheEngineBuilder.get_or_create`) with LocalCPU and a remote
backend (`resp://`) to the rank's own Valkey server (every deployment shares the servers: one tier), each rank's
real lookup server (`LookupClientFactory.create_lookup_server`, then `engine.post_init`), and the scheduler's real
lookup client (`create_lookup_client`, role `scheduler`) on LMCache's real ZMQ transport: sync
(`LMCacheLookupClient`, REQ/ROUTER) or async (`LMCacheAsyncLookupClient`, PUSH/PULL, prefetch on the ranks).
Every rank's KV moves through `CPUConnector` (real bytes). It implements `model.contract.EngineDeployment`: the
calls LMCache offers vLLM (`lookup_cache`, `lookup`, `clear_lookup_status`, `store`, `retrieve`, `lookup_unpin`),
what the checks observe (`chunk_keys`, `holdings`, `pins`) and the faults (`evict`, `fault`).

Requests reach LMCache as vLLM's integration passes them: the tenant as the `lmcache.tag.tenant` request config,
an image through LMCache's own `apply_mm_hashes_to_token_ids` (the placeholder span rewritten from the image's
hash), the LoRA adapter not at all (vLLM's LMCache connector passes none, and LMCache's token database ignores
extra keys) unless `adapter_tag` (the patched integration) passes it as `lmcache.tag.adapter`.

Hygiene: `LMCACHE_TRACK_USAGE=false`; the process's start method is restored after LMCache forces `spawn`; LMCache's
ZMQ socket files go to a private temp dir (`rpc_dir`), the case's files are removed on close; `close()` closes
everything on daemon threads and waits at most `close_timeout`, resuming paused servers and stopping the servers
it started whatever happens. Calls are not bounded here: the caller (`engines.engine_run`) bounds each one.
"""
from __future__ import annotations

import multiprocessing
import os
import threading
import time
import uuid
from typing import Any, Sequence

from adapters.lmcache_engine.connector import KV_HIDDEN, KV_LAYERS, bytes_per_token, chunk_bytes_of, \
    connector_class, kv_tensor
from adapters.lmcache_engine.closing import WAKE_ID, close_all, quiet_loop, unstick, wake
from adapters.lmcache_engine.faults import ServerFaults
from adapters.lmcache_engine.zmq_paths import own_context, remove_case_sockets, use_private_rpc_dir
from adapters.valkey_servers import ServerSet, resp_command, start_servers
from model.contract import EngineRequest, EngineRetrieve

os.environ["LMCACHE_TRACK_USAGE"] = "false"
if not os.environ.get("SHARDCHECK_LMCACHE_LOGS"):
    os.environ.setdefault("LMCACHE_LOG_LEVEL", "ERROR")

__all__ = ["LMCacheDeployment", "CHUNK_SIZE", "LOOKUP_TIMEOUT_MS", "stock_factory"]

CHUNK_SIZE = 8
#: The scheduler's lookup timeout (LMCache's `lookup_timeout_ms`; 3000 by default, shorter so faults cost less).
LOOKUP_TIMEOUT_MS = 600
#: LocalCPU per rank (GB): a few hundred chunks of this geometry, so LRU eviction never strikes unasked.
LOCAL_CPU_GB = 0.004
#: Seconds a store waits for its remote writes to land (a paused server: the write lands when it resumes).
STORE_LAND_SECONDS = 1.0
#: Seconds `close` waits for LMCache's own closes before reporting that they did not return.
CLOSE_TIMEOUT = 2.0
_BUILD_LOCK = threading.Lock()


_QUIETED = False


def _quiet() -> None:
    """LMCache's loggers at CRITICAL (unless SHARDCHECK_LMCACHE_LOGS), once; and `gc.freeze()` once: every engine's
    constructor runs `gc.collect()`, which otherwise walks torch's and LMCache's objects each time (0.45 s)."""
    global _QUIETED
    import gc
    import logging

    if _QUIETED:
        return
    _QUIETED = True
    gc.freeze()
    if os.environ.get("SHARDCHECK_LMCACHE_LOGS"):
        return
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("lmcache"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    logging.getLogger("lmcache").setLevel(logging.CRITICAL)


class _Rank:
    """One rank of one deployment: its engine, lookup server and connector."""

    def __init__(self, engine: Any, server: Any, connector: Any, metadata: Any, instance: str) -> None:
        self.engine, self.server, self.connector, self.metadata, self.instance = engine, server, connector, metadata, instance


class LMCacheDeployment:
    """N LMCache ranks per model on one shared tier of Valkey servers (one per rank); see the module docstring."""

    def __init__(self, n_ranks: int, *, lookup: str = "sync", models: Sequence[str] = ("m",),
                 urls: Sequence[str] | None = None, lookup_timeout_ms: int = LOOKUP_TIMEOUT_MS,
                 adapter_tag: bool = False, name: str = "lmcache", close_timeout: float = CLOSE_TIMEOUT) -> None:
        if n_ranks < 1:
            raise ValueError(f"n_ranks must be >= 1, got {n_ranks}")
        if lookup not in ("sync", "async"):
            raise ValueError(f"lookup must be 'sync' or 'async', got {lookup!r}")
        self.name, self.n_ranks, self.lookup_mode = name, n_ranks, lookup
        self.models = tuple(models)
        self.deployments = len(self.models)
        self.chunk_size = CHUNK_SIZE
        self.chunk_bytes = CHUNK_SIZE * bytes_per_token()
        self.lookup_timeout = lookup_timeout_ms / 1000.0
        self.adapter_tag = adapter_tag
        self.close_timeout = float(close_timeout)
        self.close_errors: list[str] = []
        self._closed = False
        self.owned: ServerSet | None = None
        if urls is None:
            self.owned = start_servers(n_ranks)
            self.endpoints = [("127.0.0.1", p) for p in self.owned.ports]
            self.faults: ServerFaults | None = ServerFaults(self.owned.servers)
        else:
            self.endpoints = _endpoints(urls, n_ranks)
            self.faults = None  # servers shardcheck did not start are never paused or killed
        self.engine_ids = [f"sc{uuid.uuid4().hex[:10]}" for _ in self.models]
        self.ranks: list[list[_Rank]] = []
        self.clients: list[Any] = []
        try:
            for d in range(self.deployments):
                self._build(d, lookup_timeout_ms)
        except BaseException:
            self.close()
            raise

    # -- building ---------------------------------------------------------------------------------------------
    def _config(self, rank: int, lookup_timeout_ms: int) -> Any:
        from lmcache.v1.config import LMCacheEngineConfig

        host, port = self.endpoints[rank]
        return LMCacheEngineConfig.from_defaults(
            chunk_size=CHUNK_SIZE, local_cpu=True, max_local_cpu_size=LOCAL_CPU_GB, remote_url=f"resp://{host}:{port}",
            remote_serde="naive", lookup_timeout_ms=lookup_timeout_ms, enable_async_loading=self.lookup_mode == "async",
            blocking_timeout_secs=2, extra_config={"save_chunk_meta": False, "resp_num_threads": 2})

    def _metadata(self, d: int, rank: int, role: str) -> Any:
        import torch
        from lmcache.v1.metadata import LMCacheMetadata

        return LMCacheMetadata(model_name=self.models[d], world_size=self.n_ranks, local_world_size=self.n_ranks,
                               worker_id=rank, local_worker_id=rank, kv_dtype=torch.uint8,
                               kv_shape=(KV_LAYERS, 2, CHUNK_SIZE, 1, KV_HIDDEN), role=role, chunk_size=CHUNK_SIZE,
                               engine_id=self.engine_ids[d])

    def _build(self, d: int, lookup_timeout_ms: int) -> None:
        from lmcache.v1.cache_engine import LMCacheEngineBuilder
        from lmcache.v1.lookup_client.factory import LookupClientFactory

        use_private_rpc_dir()
        _quiet()
        ranks: list[_Rank] = []
        self.ranks.append(ranks)
        for r in range(self.n_ranks):
            metadata = self._metadata(d, r, "worker")
            connector = connector_class()()
            instance = f"{self.engine_ids[d]}-{r}"
            with _BUILD_LOCK:  # LMCache forces the `spawn` start method process-wide: put back what was there
                method = multiprocessing.get_start_method(allow_none=True)
                try:
                    engine = LMCacheEngineBuilder.get_or_create(instance, self._config(r, lookup_timeout_ms),
                                                                metadata, connector, None, None)
                finally:
                    multiprocessing.set_start_method(method, force=True)
            rank = _Rank(engine, None, connector, metadata, instance)
            ranks.append(rank)
            rank.server = LookupClientFactory.create_lookup_server(engine, metadata)
            engine.post_init(async_lookup_server=rank.server if self.lookup_mode == "async" else None)
            if engine.storage_manager is None or "RemoteBackend" not in engine.storage_manager.storage_backends:
                host, port = self.endpoints[r]
                raise ConnectionError(f"LMCache rank {r} could not connect to resp://{host}:{port}")
        with own_context():  # one scheduler per process in production: one ZMQ context per client here
            self.clients.append(LookupClientFactory.create_lookup_client(self._config(0, lookup_timeout_ms),
                                                                         self._metadata(d, 0, "scheduler")))

    # -- requests as vLLM's integration passes them ------------------------------------------------------------
    def request_configs(self, request: EngineRequest) -> dict | None:
        tags = {}
        if request.tenant:
            tags["lmcache.tag.tenant"] = request.tenant
        if request.adapter and self.adapter_tag:
            tags["lmcache.tag.adapter"] = request.adapter
        return tags or None

    def tokens(self, request: EngineRequest) -> Any:
        import torch

        tokens = torch.tensor(list(request.tokens), dtype=torch.long)
        if request.image:
            from lmcache.integration.vllm.utils import apply_mm_hashes_to_token_ids

            span = _Placeholder(offset=1, length=self.chunk_size - 2)
            apply_mm_hashes_to_token_ids(tokens, [request.image], [span])
        return tokens

    # -- the scheduler's lookup client ---------------------------------------------------------------------------
    def lookup_cache(self, d: int, request: EngineRequest) -> int | None:
        return self.clients[d].lookup_cache(request.id)

    def lookup(self, d: int, request: EngineRequest) -> int | None:
        return self.clients[d].lookup(self.tokens(request).tolist(), request.id, self.request_configs(request))

    def clear_lookup_status(self, d: int, request: EngineRequest) -> None:
        self.clients[d].clear_lookup_status(request.id)

    # -- the ranks ----------------------------------------------------------------------------------------------
    def store(self, d: int, rank: int, request: EngineRequest, kv: Sequence[bytes]) -> None:
        """Rank `rank` stores the request's KV (every full chunk); returns once its remote writes landed, or after
        `STORE_LAND_SECONDS` (a paused server: they land when it resumes)."""
        import torch

        tokens = self.tokens(request)
        engine = self.ranks[d][rank].engine
        engine.store(tokens=tokens, kvcaches=kv_tensor(kv, self.chunk_size, len(tokens)),
                     slot_mapping=torch.arange(len(tokens)), request_configs=self.request_configs(request),
                     req_id=request.id)
        keys = self.chunk_keys(d, rank, request)
        if self.faults is not None and not self.faults.reachable(rank):
            return
        deadline = time.monotonic() + STORE_LAND_SECONDS
        while keys and time.monotonic() < deadline:
            if self._remote_count(rank, keys) == len(keys):
                return
            time.sleep(0.002)

    def retrieve(self, d: int, rank: int, request: EngineRequest, n_tokens: int) -> EngineRetrieve:
        import torch

        tokens = self.tokens(request)[:n_tokens]
        rank_ = self.ranks[d][rank]
        out = torch.zeros((2, KV_LAYERS, len(tokens), KV_HIDDEN), dtype=torch.uint8)
        first_freed = len(rank_.connector.invalid)
        mask = rank_.engine.retrieve(tokens, torch.ones(len(tokens), dtype=torch.bool), kvcaches=out,
                                     slot_mapping=torch.arange(len(tokens)),
                                     request_configs=self.request_configs(request), req_id=request.id)
        got = [bool(x) for x in mask.tolist()]
        chunks = [chunk_bytes_of(out, c, self.chunk_size) if got[c * self.chunk_size] else None
                  for c in range(len(tokens) // self.chunk_size)]
        freed = [{"chunk": f["start"] // self.chunk_size, "bytes": f["bytes"]}
                 for f in rank_.connector.invalid[first_freed:]]
        return EngineRetrieve(retrieved=sum(got), chunks=chunks, freed=freed)

    def lookup_unpin(self, d: int, rank: int, request: EngineRequest) -> None:
        self.ranks[d][rank].engine.lookup_unpin(request.id)

    # -- what the checks observe ----------------------------------------------------------------------------------
    def chunk_keys(self, d: int, rank: int, request: EngineRequest) -> list[str]:
        """The engine's own key of every full chunk of the request on this rank (LMCache's token database)."""
        db = self.ranks[d][rank].engine.token_database
        return [key.to_string() for _, _, key in db.process_tokens(
            tokens=self.tokens(request), request_configs=self.request_configs(request))]

    def holdings(self, d: int, rank: int, keys: Sequence[str]) -> tuple[list[bool], list[bool] | None]:
        """Which of `keys` this rank holds: in its LocalCPU, and on its server (None when it cannot be reached)."""
        cpu = self.ranks[d][rank].engine.storage_manager.local_cpu_backend
        with cpu.cpu_lock:
            local_keys = {k.to_string() for k in cpu.hot_cache}
        local = [k in local_keys for k in keys]
        if not keys:
            return local, []
        if self.faults is not None and not self.faults.reachable(rank):
            return local, None
        try:
            reply = self._admin(rank, "EVAL", _EXISTS_EACH, str(len(keys)), *keys)
        except OSError:
            return local, None
        flags = [line == b":1" for line in reply.split(b"\r\n")[1:1 + len(keys)]]
        return local, flags if reply.startswith(b"*") and len(flags) == len(keys) else None

    def pins(self, d: int, rank: int) -> int:
        """Lookup pins held on this rank's LocalCPU chunks (the sum of their pin counts)."""
        cpu = self.ranks[d][rank].engine.storage_manager.local_cpu_backend
        with cpu.cpu_lock:
            return sum(max(0, mo.meta.pin_count) for mo in cpu.hot_cache.values())

    # -- faults ---------------------------------------------------------------------------------------------------
    def evict(self, d: int, rank: int, request: EngineRequest, chunk: int, tier: str) -> None:
        """Evict one chunk of the request from this rank: its LocalCPU copy (LMCache's own forced remove), its
        remote copy (DEL on the rank's server, as the server's LRU would), or both."""
        key_str = self.chunk_keys(d, rank, request)[chunk]
        if tier in ("local", "both"):
            engine = self.ranks[d][rank].engine
            cpu = engine.storage_manager.local_cpu_backend
            with cpu.cpu_lock:
                keys = [k for k in cpu.hot_cache if k.to_string() == key_str]
            for key in keys:
                engine.storage_manager.remove(key, ["LocalCPUBackend"])
        if tier in ("remote", "both") and (self.faults is None or self.faults.reachable(rank)):
            self._admin(rank, "DEL", key_str)

    def fault(self, rank: int, action: str) -> None:
        if self.faults is None:
            raise ValueError("server faults need servers shardcheck started (no urls option)")
        self.faults.apply(rank, action)

    def reachable(self, rank: int) -> bool:
        return self.faults is None or self.faults.reachable(rank)

    # -- helpers --------------------------------------------------------------------------------------------------
    def _admin(self, rank: int, *args: str) -> bytes:
        host, port = self.endpoints[rank]
        return resp_command(host, port, None, *args, timeout=0.5)

    def _remote_count(self, rank: int, keys: Sequence[str]) -> int:
        try:
            reply = self._admin(rank, "EXISTS", *keys)
        except OSError:
            return -1
        return int(reply[1:].split(b"\r\n")[0]) if reply.startswith(b":") else -1

    # -- closing --------------------------------------------------------------------------------------------------
    def close(self, timeout: float | None = None) -> list[str]:
        """Close clients, lookup servers and engines (LMCache's own closes, each on a daemon thread, all at once,
        every parked ZMQ receive woken first: `closing.wake`), waiting at most `timeout`; then remove the case's
        socket files and stop the servers started. Returns (and keeps in `close_errors`) what did not return in
        time or raised. An engine whose close is stuck in stock `RESPConnector.close` is unstuck afterwards."""
        if self._closed:
            return self.close_errors
        self._closed = True
        try:
            if self.faults is not None:
                self.faults.resume_all()
            self._wake_parked()
            for ranks in self.ranks:
                for rank in ranks:
                    if rank.engine.storage_manager is not None:
                        quiet_loop(rank.engine.storage_manager.loop)
            jobs = [(f"deployment {d}: the lookup client's close", client.close) for d, client in enumerate(self.clients)]
            for d, ranks in enumerate(self.ranks):
                for r, rank in enumerate(ranks):
                    if rank.server is not None:
                        jobs.append((f"deployment {d} rank {r}: the lookup server's close", rank.server.close))
                    jobs.append((f"deployment {d} rank {r}: the engine's close (LMCacheEngineBuilder.destroy)",
                                 _destroy(rank.instance)))
            self.close_errors = close_all(jobs, self.close_timeout if timeout is None else timeout)
            if self.close_errors:
                for ranks in self.ranks:
                    for rank in ranks:
                        unstick(rank.engine)
            self._close_loops()
        finally:
            for engine_id in self.engine_ids:
                remove_case_sockets(engine_id)
            if self.owned is not None:
                self.owned.stop()
        return self.close_errors

    def _close_loops(self) -> None:
        """LMCache stops each storage manager's event loop but never closes it (its sockets would be left to the
        garbage collector), and a sync lookup server's close never terminates its transport's ZMQ context (its I/O
        thread stays): close every loop whose thread has ended (an unstuck one gets a moment to end), terminate every
        such context."""
        for ranks in self.ranks:
            for rank in ranks:
                ctx = getattr(getattr(rank.server, "transport", None), "ctx", None)
                if ctx is not None and not ctx.closed:
                    ctx.term()
                sm = rank.engine.storage_manager
                if sm is None or sm.loop.is_closed():
                    continue
                sm.thread.join(1.0)
                if not sm.thread.is_alive() and not sm.loop.is_running():
                    sm.loop.close()

    def _wake_parked(self) -> None:
        """Clear `running` on every lookup client and server and send each parked receive one harmless message."""
        import msgspec
        import zmq
        from lmcache.v1.lookup_client import factory
        from lmcache.v1.lookup_client.async_lookup_message import LookupCleanupMsg, LookupResponseMsg

        path = factory.get_zmq_rpc_path_lmcache
        for d, ranks in enumerate(self.ranks):
            eid = self.engine_ids[d]
            for r, rank in enumerate(ranks):
                if rank.server is None:
                    continue
                rank.server.running = False
                if self.lookup_mode == "async":
                    wake(path(eid, "lookup_worker", 0, r), [msgspec.msgpack.encode(LookupCleanupMsg(lookup_id=WAKE_ID))],
                         zmq.PUSH)
                else:
                    wake(path(eid, "lookup", 0, r), [b"", b"wake"], zmq.DEALER)
            if d < len(self.clients) and self.lookup_mode == "async":
                self.clients[d].running = False
                wake(path(eid, "lookup_scheduler", 0, 0),
                     [msgspec.msgpack.encode(LookupResponseMsg(lookup_id=WAKE_ID, num_hit_tokens=0))], zmq.PUSH)

    def __enter__(self) -> "LMCacheDeployment":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Placeholder:
    """vLLM's `PlaceholderRange` (offset, length), for LMCache's `apply_mm_hashes_to_token_ids`."""

    def __init__(self, offset: int, length: int) -> None:
        self.offset, self.length = offset, length


def _destroy(instance: str) -> Any:
    def destroy() -> None:
        from lmcache.v1.cache_engine import LMCacheEngineBuilder

        LMCacheEngineBuilder.destroy(instance)
    return destroy


def _endpoints(urls: Sequence[str], n_ranks: int) -> list[tuple[str, int]]:
    from urllib.parse import urlparse

    if isinstance(urls, str):
        urls = [u for u in urls.split(",") if u]
    if len(urls) != n_ranks:
        raise ValueError(f"{n_ranks} ranks need {n_ranks} server urls (one per rank), got {len(urls)}")
    out = []
    for u in urls:
        p = urlparse(u if "://" in u else f"resp://{u}")
        if p.hostname is None or p.port is None:
            raise ValueError(f"url {u!r} has no host:port")
        out.append((p.hostname, p.port))
    return out


#: One round trip: EXISTS of every key (the admin connection reads one reply of at most 4 KB).
_EXISTS_EACH = "local r = {} for i, k in ipairs(KEYS) do r[i] = redis.call('EXISTS', k) end return r"


def stock_factory(n_ranks: int, **options: Any) -> LMCacheDeployment:
    """`--engine lmcache`: stock LMCache 0.5.6 (see the module docstring)."""
    return LMCacheDeployment(n_ranks, **options)
