"""One rank of an LMCache deployment: its real `LMCacheEngine` per deployment (model), with its lookup server and CPU
connector, and what a worker does with them (store, retrieve, `lookup_unpin`) or the checks ask of them (chunk keys,
LocalCPU holdings, pins). `RankSide` runs in the deployment's process (`LMCacheDeployment`), or in a rank process of
its own (`adapters.lmcache_engine.process_deployment`), the same code either way.

Also here: LMCache's configuration and metadata of a rank (`engine_config`, `engine_metadata`) and how vLLM's
integration turns a request into LMCache's arguments (`tokens_of`, `request_configs_of`), shared with the scheduler.
"""
from __future__ import annotations

import collections
import multiprocessing
import os
import sys
import threading
from typing import Any, Sequence

from adapters.lmcache_engine.closing import WAKE_ID, close_all, quiet_loop, unstick, wake
from adapters.lmcache_engine.connector import KV_HIDDEN, KV_LAYERS, chunk_bytes_of, connector_class, kv_tensor
from adapters.lmcache_engine.zmq_paths import use_private_rpc_dir
from model.contract import EngineRequest, EngineRetrieve
from runtime.registry import load_attr

os.environ["LMCACHE_TRACK_USAGE"] = "false"
if not os.environ.get("SHARDCHECK_LMCACHE_LOGS"):
    os.environ.setdefault("LMCACHE_LOG_LEVEL", "ERROR")
# With vLLM installed beside LMCache (requirements/vllm.txt), LMCache's token database imports it in any process
# (`lmcache/v1/token_database.py:95`): 15 s of imports, and its chain hashes start from vLLM's NONE_HASH, random per
# process without PYTHONHASHSEED, so ranks in processes of their own would never agree on a key. These engines are
# not vLLM's: LMCache runs here as without vLLM (NONE_HASH 0, Python's hash), `vllm` made unimportable in this
# process unless it is already imported. (The vLLM stack runs LMCache inside vLLM's own process:
# adapters/vllm_stack.)
sys.modules.setdefault("vllm", None)  # type: ignore[arg-type]

__all__ = ["RankSide", "CHUNK_SIZE", "LOCAL_CPU_GB", "engine_config", "engine_metadata", "tokens_of",
           "request_configs_of", "quiet_lmcache"]

CHUNK_SIZE = 8
#: LocalCPU per rank (GB): a few hundred chunks of this geometry, so LRU eviction never strikes unasked.
LOCAL_CPU_GB = 0.004
_BUILD_LOCK = threading.Lock()
_QUIETED = False


def quiet_lmcache() -> None:
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


def engine_config(endpoint: tuple[str, int], lookup: str, lookup_timeout_ms: int) -> Any:
    from lmcache.v1.config import LMCacheEngineConfig

    host, port = endpoint
    return LMCacheEngineConfig.from_defaults(
        chunk_size=CHUNK_SIZE, local_cpu=True, max_local_cpu_size=LOCAL_CPU_GB, remote_url=f"resp://{host}:{port}",
        remote_serde="naive", lookup_timeout_ms=lookup_timeout_ms, enable_async_loading=lookup == "async",
        blocking_timeout_secs=2, extra_config={"save_chunk_meta": False, "resp_num_threads": 2})


def engine_metadata(model: str, engine_id: str, n_ranks: int, rank: int, role: str) -> Any:
    import torch
    from lmcache.v1.metadata import LMCacheMetadata

    return LMCacheMetadata(model_name=model, world_size=n_ranks, local_world_size=n_ranks, worker_id=rank,
                           local_worker_id=rank, kv_dtype=torch.uint8, kv_shape=(KV_LAYERS, 2, CHUNK_SIZE, 1, KV_HIDDEN),
                           role=role, chunk_size=CHUNK_SIZE, engine_id=engine_id)


def request_configs_of(request: EngineRequest, adapter_tag: bool) -> dict | None:
    """A request's LMCache request configs as vLLM's integration passes them: the tenant as a tag; the adapter only
    when `adapter_tag` (the patched integration)."""
    tags = {}
    if request.tenant:
        tags["lmcache.tag.tenant"] = request.tenant
    if request.adapter and adapter_tag:
        tags["lmcache.tag.adapter"] = request.adapter
    return tags or None


class _Placeholder:
    """vLLM's `PlaceholderRange` (offset, length), for LMCache's `apply_mm_hashes_to_token_ids`."""

    def __init__(self, offset: int, length: int) -> None:
        self.offset, self.length = offset, length


def tokens_of(request: EngineRequest) -> Any:
    """The request's token ids as LMCache sees them: an image's placeholder span rewritten by LMCache's own
    `apply_mm_hashes_to_token_ids`, as vLLM's integration does on every path."""
    import torch

    tokens = torch.tensor(list(request.tokens), dtype=torch.long)
    if request.image:
        from lmcache.integration.vllm.utils import apply_mm_hashes_to_token_ids

        apply_mm_hashes_to_token_ids(tokens, [request.image], [_Placeholder(offset=1, length=CHUNK_SIZE - 2)])
    return tokens


class _Rank:
    """One rank of one deployment: its engine, lookup server and connector."""

    def __init__(self, engine: Any, server: Any, connector: Any, metadata: Any, instance: str) -> None:
        self.engine, self.server, self.connector, self.metadata, self.instance = engine, server, connector, metadata, instance


class RankSide:
    """Rank `rank`'s engines, one per deployment (entry `d` of `engine_ids` / `models`), each with its lookup server."""

    def __init__(self, rank: int, n_ranks: int, endpoint: tuple[str, int], *, engine_ids: Sequence[str],
                 models: Sequence[str], lookup: str, lookup_timeout_ms: int, adapter_tag: bool) -> None:
        self.rank, self.n_ranks, self.endpoint, self.lookup_mode = rank, n_ranks, endpoint, lookup
        self.engine_ids, self.models, self.adapter_tag = list(engine_ids), list(models), adapter_tag
        self.lookup_timeout_ms = lookup_timeout_ms
        self.ranks: list[_Rank] = []
        use_private_rpc_dir()
        quiet_lmcache()
        for d in range(len(self.models)):
            self._build(d)

    def _build(self, d: int) -> None:
        from lmcache.v1.cache_engine import LMCacheEngineBuilder
        from lmcache.v1.lookup_client.factory import LookupClientFactory

        metadata = engine_metadata(self.models[d], self.engine_ids[d], self.n_ranks, self.rank, "worker")
        connector = connector_class()()
        instance = f"{self.engine_ids[d]}-{self.rank}"
        with _BUILD_LOCK:  # LMCache forces the `spawn` start method process-wide: put back what was there
            method = multiprocessing.get_start_method(allow_none=True)
            try:
                engine = LMCacheEngineBuilder.get_or_create(
                    instance, engine_config(self.endpoint, self.lookup_mode, self.lookup_timeout_ms), metadata,
                    connector, None, None)
            finally:
                multiprocessing.set_start_method(method, force=True)
        rank = _Rank(engine, None, connector, metadata, instance)
        self.ranks.append(rank)
        rank.server = LookupClientFactory.create_lookup_server(engine, metadata)
        engine.post_init(async_lookup_server=rank.server if self.lookup_mode == "async" else None)
        if engine.storage_manager is None or "RemoteBackend" not in engine.storage_manager.storage_backends:
            host, port = self.endpoint
            raise ConnectionError(f"LMCache rank {self.rank} could not connect to resp://{host}:{port}")

    def apply(self, spec: str, **options: Any) -> None:
        """Call `MOD:ATTR(self, **options)` here (the patched engine's rank-side fixes, in whatever process this is)."""
        load_attr(spec, "engine fix")(self, **options)

    def ready(self) -> bool:
        return True

    # -- what a worker does -----------------------------------------------------------------------------------------
    def _configs(self, request: EngineRequest) -> dict | None:
        return request_configs_of(request, self.adapter_tag)

    def store(self, d: int, request: EngineRequest, kv: Sequence[bytes]) -> list[str]:
        """Store the request's KV (every full chunk); the chunk keys stored."""
        import torch

        tokens = tokens_of(request)
        self.ranks[d].engine.store(tokens=tokens, kvcaches=kv_tensor(kv, CHUNK_SIZE, len(tokens)),
                                   slot_mapping=torch.arange(len(tokens)), request_configs=self._configs(request),
                                   req_id=request.id)
        return self.chunk_keys(d, request)

    def retrieve(self, d: int, request: EngineRequest, n_tokens: int) -> EngineRetrieve:
        import torch

        tokens = tokens_of(request)[:n_tokens]
        rank = self.ranks[d]
        out = torch.zeros((2, KV_LAYERS, len(tokens), KV_HIDDEN), dtype=torch.uint8)
        first_freed = len(rank.connector.invalid)
        mask = rank.engine.retrieve(tokens, torch.ones(len(tokens), dtype=torch.bool), kvcaches=out,
                                    slot_mapping=torch.arange(len(tokens)), request_configs=self._configs(request),
                                    req_id=request.id)
        got = [bool(x) for x in mask.tolist()]
        chunks = [chunk_bytes_of(out, c, CHUNK_SIZE) if got[c * CHUNK_SIZE] else None
                  for c in range(len(tokens) // CHUNK_SIZE)]
        freed = [{"chunk": f["start"] // CHUNK_SIZE, "bytes": f["bytes"]} for f in rank.connector.invalid[first_freed:]]
        return EngineRetrieve(retrieved=sum(got), chunks=chunks, freed=freed)

    def lookup_unpin(self, d: int, request: EngineRequest) -> None:
        self.ranks[d].engine.lookup_unpin(request.id)

    # -- what the checks observe ----------------------------------------------------------------------------------
    def chunk_keys(self, d: int, request: EngineRequest) -> list[str]:
        """The engine's own key of every full chunk of the request (LMCache's token database)."""
        db = self.ranks[d].engine.token_database
        return [key.to_string() for _, _, key in db.process_tokens(tokens=tokens_of(request),
                                                                   request_configs=self._configs(request))]

    def local_holdings(self, d: int, keys: Sequence[str]) -> list[bool]:
        """Which of `keys` this rank's LocalCPU holds."""
        cpu = self.ranks[d].engine.storage_manager.local_cpu_backend
        with cpu.cpu_lock:
            held = {k.to_string() for k in cpu.hot_cache}
        return [k in held for k in keys]

    def pins(self, d: int) -> int:
        """Lookup pins held on this rank's LocalCPU chunks (the sum of their pin counts)."""
        cpu = self.ranks[d].engine.storage_manager.local_cpu_backend
        with cpu.cpu_lock:
            return sum(max(0, mo.meta.pin_count) for mo in cpu.hot_cache.values())

    def facts(self) -> dict[str, int]:
        """The counts this rank's engines keep of what they did (`facts`, optional: a patched engine's fixes count
        the runs of their own paths), summed over its deployments."""
        out: collections.Counter = collections.Counter()
        for rank in self.ranks:
            out.update(getattr(rank.engine, "facts", None) or {})
        return dict(out)

    def evict_local(self, d: int, key_str: str) -> None:
        """LMCache's own forced remove of one chunk from LocalCPU."""
        engine = self.ranks[d].engine
        cpu = engine.storage_manager.local_cpu_backend
        with cpu.cpu_lock:
            keys = [k for k in cpu.hot_cache if k.to_string() == key_str]
        for key in keys:
            engine.storage_manager.remove(key, ["LocalCPUBackend"])

    # -- closing --------------------------------------------------------------------------------------------------
    def wake_servers(self) -> None:
        """Clear every lookup server's `running` and send its parked receive one harmless message (`closing.wake`)."""
        import msgspec
        import zmq
        from lmcache.v1.lookup_client import factory
        from lmcache.v1.lookup_client.async_lookup_message import LookupCleanupMsg

        for d, rank in enumerate(self.ranks):
            if rank.server is None:
                continue
            rank.server.running = False
            path = factory.get_zmq_rpc_path_lmcache
            if self.lookup_mode == "async":
                wake(path(self.engine_ids[d], "lookup_worker", 0, self.rank),
                     [msgspec.msgpack.encode(LookupCleanupMsg(lookup_id=WAKE_ID))], zmq.PUSH)
            else:
                wake(path(self.engine_ids[d], "lookup", 0, self.rank), [b"", b"wake"], zmq.DEALER)

    def close(self, timeout: float, wake_first: bool = True) -> list[str]:
        """LMCache's own closes of this rank's lookup servers and engines, all at once, each on a daemon thread,
        within `timeout`; what did not return or raised. Then: a close stuck in stock `RESPConnector.close` is
        unstuck, and the loops and contexts LMCache leaves are closed."""
        if wake_first:
            self.wake_servers()
        for rank in self.ranks:
            if rank.engine.storage_manager is not None:
                quiet_loop(rank.engine.storage_manager.loop)
        jobs = []
        for d, rank in enumerate(self.ranks):
            if rank.server is not None:
                jobs.append((f"deployment {d} rank {self.rank}: the lookup server's close", rank.server.close))
            jobs.append((f"deployment {d} rank {self.rank}: the engine's close (LMCacheEngineBuilder.destroy)",
                         _destroy(rank.instance)))
        errors = close_all(jobs, timeout)
        if errors:
            for rank in self.ranks:
                unstick(rank.engine)
        self._release_leftovers()
        return errors

    def _release_leftovers(self) -> None:
        """LMCache stops each storage manager's event loop but never closes it (its sockets would be left to the
        garbage collector), and a sync lookup server's close never terminates its transport's ZMQ context (its I/O
        thread stays): close every loop whose thread has ended (an unstuck one gets a moment to end), terminate every
        such context."""
        for rank in self.ranks:
            ctx = getattr(getattr(rank.server, "transport", None), "ctx", None)
            if ctx is not None and not ctx.closed:
                ctx.term()
            sm = rank.engine.storage_manager
            if sm is None or sm.loop.is_closed():
                continue
            sm.thread.join(1.0)
            if not sm.thread.is_alive() and not sm.loop.is_running():
                sm.loop.close()


def _destroy(instance: str) -> Any:
    def destroy() -> None:
        from lmcache.v1.cache_engine import LMCacheEngineBuilder

        LMCacheEngineBuilder.destroy(instance)
    return destroy
