"""`--connector lmcache-patched`: shardcheck's fixes to vLLM's LMCache integration, and what a rank answers the checks.

Each fix is applied from outside LMCache and vLLM, by `RecordingConnector` (`adapters.vllm_stack.recording_connector`)
around stock `LMCacheConnectorV1`, in vLLM's own processes, when the connector is built; nothing is copied. `Fixes.on`
switches them (the stack's `use_connector` moves between `lmcache` and `lmcache-patched` on one LMCache).

V1. kv-leak: a request whose lookup pinned LMCache chunks and that ends before any worker loads it (aborted while
    WAITING for blocks; or a lookup the scheduler gave up on at `lookup_timeout_ms` that completes later on the
    worker, e.g. its Valkey paused and resumed) keeps its pins for good: LMCache unpins a request only when it is in
    a step's metadata (`lmcache/integration/vllm/vllm_v1_adapter.py:868` after a load, `:1147` in `wait_for_save`),
    and its abort path (`request_finished`, `:1857`, from vLLM's `scheduler.py:2994`) only cancels storage work
    where an engine exists (`:1896`; the scheduler has none), never `lookup_unpin`. The pins stay in
    `LMCacheEngine.lookup_pins` and on the LocalCPU objects' `pin_count` (`lmcache/v1/cache_engine.py:1240`), so
    those chunks can never be evicted. Fix: the scheduler sends the ids of the requests that ended to every worker in
    the next step's metadata; each worker releases their pins (`lookup_unpin`), and a lookup of an ended request
    that completes later releases its pins as it returns.
V2. isolation: vLLM's `cache_salt` (a tenant's salt for the prefix cache) never reaches LMCache's keys: LMCache takes
    its request configs only from `SamplingParams.extra_args["kv_transfer_params"]` (`lmcache/integration/vllm/
    utils.py:130`), so two tenants' identical prompts share chunk keys and one loads the other's KV. Fix: the
    scheduler passes the salt as the `lmcache.tag.tenant` request config (LMCache's own tag mechanism, which the
    token database puts in the key) before the lookup; the save path reads the same sampling params.

`probe(connector, what, *args)` answers the questions the stack asks of one rank (`worker_probe`).
"""
from __future__ import annotations

import collections
import threading
from typing import Any, Iterable

__all__ = ["Fixes", "probe", "lmcache_engine_of", "tenant_configs", "TENANT_TAG", "LATE_RELEASED", "ENDED_RELEASED"]

TENANT_TAG = "lmcache.tag.tenant"
#: Facts (`Fixes.facts`): pins V1 released for requests that had ended, and for lookups that completed after their
#: request ended.
ENDED_RELEASED, LATE_RELEASED = "V1 ended requests' pins released", "V1 late lookups' pins released"
#: Ended request ids a worker remembers (for lookups completing late).
_REMEMBERED = 4096


def tenant_configs(tenant: str, patched: bool) -> dict | None:
    """The LMCache request configs of a request of `tenant` as this stack passes them: stock passes none (vLLM's
    `cache_salt` does not reach LMCache: V2), patched the tenant tag."""
    from lmcache.integration.vllm.utils import extract_request_configs_from_sampling_params

    class _Params:
        extra_args = {"kv_transfer_params": {TENANT_TAG: tenant}} if (patched and tenant) else None

    return extract_request_configs_from_sampling_params(_Params())


class Fixes:
    """V1 and V2 for one `RecordingConnector` (see the module docstring)."""

    def __init__(self, connector: Any, *, on: bool) -> None:
        self.connector = connector
        self.on = on
        self.facts: collections.Counter = collections.Counter()
        self._ended: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._engine: Any = None
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

        if connector.role == KVConnectorRole.WORKER:
            self._wrap_lookup()

    def engine(self) -> Any:
        if self._engine is None:
            self._engine = lmcache_engine_of(self.connector.base)
        return self._engine

    # V2, scheduler side: the tenant reaches LMCache's keys.
    def before_lookup(self, request: Any) -> None:
        salt = getattr(request, "cache_salt", None)
        params = getattr(request, "sampling_params", None)
        if not (self.on and salt and params is not None):
            return
        extra = dict(params.extra_args or {})
        transfer = dict(extra.get("kv_transfer_params") or {})
        transfer[TENANT_TAG] = salt
        extra["kv_transfer_params"] = transfer
        params.extra_args = extra

    # V1, worker side: release the pins of requests that ended.
    def after_ended(self, request_ids: Iterable[str]) -> None:
        if not self.on:
            return
        engine = self.engine()
        for rid in request_ids:
            with self._lock:
                self._ended[rid] = None
                while len(self._ended) > _REMEMBERED:
                    self._ended.popitem(last=False)
            if engine is not None and rid in engine.lookup_pins:
                engine.lookup_unpin(rid)
                self.facts[ENDED_RELEASED] += 1

    def _wrap_lookup(self) -> None:
        """A lookup (on the worker's lookup server thread) of a request that ended meanwhile releases what it pinned."""
        engine = self.engine()
        if engine is None:
            return
        original = engine.lookup

        def lookup(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            rid = kwargs.get("lookup_id")
            with self._lock:
                late = self.on and rid is not None and rid in self._ended
            if late and rid in engine.lookup_pins:
                engine.lookup_unpin(rid)
                self.facts[LATE_RELEASED] += 1
            return result

        engine.lookup = lookup


def lmcache_engine_of(connector: Any, depth: int = 5) -> Any:
    """The `LMCacheEngine` under a connector (vLLM's `LMCacheConnectorV1`, or any wrapper of one that keeps it as
    `inner`/`_inner`/`base`/`_connector`), or None."""
    seen = 0
    while connector is not None and seen < depth:
        impl = getattr(connector, "_lmcache_engine", None)
        if impl is not None and hasattr(impl, "lmcache_engine"):
            return impl.lmcache_engine
        connector = next((getattr(connector, a) for a in ("inner", "_inner", "base", "_connector")
                          if getattr(connector, a, None) is not None), None)
        seen += 1
    return None


# -- what a rank answers ------------------------------------------------------------------------------------------------
def _local_cpu(engine: Any) -> Any:
    sm = getattr(engine, "storage_manager", None)
    return getattr(sm, "local_cpu_backend", None) if sm is not None else None


def _pins(engine: Any) -> tuple[int, list[str]]:
    cpu = _local_cpu(engine)
    pins = 0
    if cpu is not None:
        with cpu.cpu_lock:
            pins = sum(max(0, obj.meta.pin_count) for obj in cpu.hot_cache.values())
    return pins, sorted(getattr(engine, "lookup_pins", {}) or {})


def _release_all(engine: Any) -> None:
    """Every pin this rank holds goes (a fresh case must not inherit an earlier case's leak)."""
    for rid in list(getattr(engine, "lookup_pins", {}) or {}):
        engine.lookup_unpin(rid)
    cpu = _local_cpu(engine)
    if cpu is None:
        return
    with cpu.cpu_lock:
        objs = list(cpu.hot_cache.values())
    for obj in objs:
        while obj.meta.pin_count > 0:
            obj.unpin()


def probe(connector: Any, what: str, *args: Any) -> Any:
    """`rank`; `keys(tokens, configs)`: LMCache's key of every full chunk; `local(keys)`: held in LocalCPU;
    `pins`: (pin count summed over LocalCPU, request ids in `lookup_pins`); `evict(key)`: LMCache's own remove from
    LocalCPU; `puts`: remote writes in flight; `clear`: every pin released, LocalCPU emptied; `use(name)`: serve through another connector; `facts`;
    `stats` (the CPU paged connector's counters); `lmcache` (whether an LMCache engine runs here)."""
    from adapters.vllm_stack import cpu_paged_connector

    engine = connector.fixes.engine()
    if what == "rank":
        return connector.rank
    if what == "lmcache":
        return engine is not None
    if what == "use":
        connector.use(args[0])
        return None
    if what == "facts":
        return dict(connector.fixes.facts)
    if what == "stats":
        return dict(cpu_paged_connector.STATS)
    if engine is None:
        raise RuntimeError(f"the connector {connector.name} runs no LMCache engine here: cannot answer {what}")
    if what == "keys":
        import torch

        tokens, configs = args
        size = engine.config.chunk_size
        return [key.to_string() for start, end, key in engine.token_database.process_tokens(
            tokens=torch.tensor(list(tokens), dtype=torch.long), request_configs=configs) if end - start == size]
    cpu = _local_cpu(engine)
    if what == "local":
        with cpu.cpu_lock:
            held = {k.to_string() for k in cpu.hot_cache}
        return [k in held for k in args[0]]
    if what == "pins":
        return _pins(engine)
    if what == "evict":
        with cpu.cpu_lock:
            keys = [k for k in cpu.hot_cache if k.to_string() == args[0]]
        for key in keys:
            engine.storage_manager.remove(key, ["LocalCPUBackend"])
        return len(keys)
    if what == "puts":  # remote writes still in flight
        backend = (engine.storage_manager.storage_backends or {}).get("RemoteBackend")
        return len(getattr(backend, "put_tasks", ()) or ())
    if what == "clear":
        _release_all(engine)
        return engine.clear(locations=["LocalCPUBackend"])
    raise ValueError(f"unknown probe {what!r}")
