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
    the next step's metadata (when the engine is left with nothing to step, the stack's driver tells the workers
    at once, as the next step would); each worker releases their pins (`lookup_unpin`), and a lookup of an ended
    request that completes later releases its pins as it returns.
V2. isolation: vLLM's `cache_salt` (a tenant's salt for the prefix cache) never reaches LMCache's keys: LMCache takes
    its request configs only from `SamplingParams.extra_args["kv_transfer_params"]` (`lmcache/integration/vllm/
    utils.py:130`), so two tenants' identical prompts share chunk keys and one loads the other's KV. Fix: the
    scheduler passes the salt as the `lmcache.tag.tenant` request config (LMCache's own tag mechanism, which the
    token database puts in the key) before the lookup; the save path reads the same sampling params.

V3. A lookup on the worker never returns: LMCache's sync prefix count (`RemoteBackend.batched_contains` ->
    `batch_exists_sync`, `lmcache/v1/storage_backend/native_clients/connector_client_base.py:156`, `fut.result()` with
    no timeout) loses its completion when the native client answers before the future is registered (the README's
    `lost-completion` finding). Inside vLLM the worker's lookup server thread is then stuck for good: every later
    lookup times out at `lookup_timeout_ms` and the request recomputes, silently, for the rest of the process (seen
    after a paused server: tests/test_vllm_stack.py). Fix: the remote connector of `--client lmcache-patched`
    (`adapters.patched`: fixes 2, 4-6, 8-10, 13, 14, as `--engine lmcache-patched`'s E6) in every worker, every
    native call bounded (`GET_BOUND`), the native client renewed when stuck or disconnected; switched back when the
    fixes are switched off. LMCache builds its remote backend only when vLLM registers the KV caches (`post_init`),
    after the connector: V3 is applied then (`registered`), and the stack checks it is in place (`V3_APPLIED`).

`unstick(engine)` completes (as a miss) a sync prefix count stuck that way, so `reset()` hands the next case a
working stack; `probe(connector, what, *args)` answers the questions the stack asks of one rank (`worker_probe`).
"""
from __future__ import annotations

import collections
import threading
from typing import Any, Iterable

__all__ = ["STOCK", "PATCHED", "CONNECTORS", "Fixes", "probe", "lmcache_engine_of", "lmcache_connector_of", "tenant_configs", "TENANT_TAG", "LATE_RELEASED", "ENDED_RELEASED",
           "V3_APPLIED"]

#: The KV connectors shardcheck names (any other is `MOD:ATTR`): stock `LMCacheConnectorV1` (with the CPU paged
#: connector) and the same with these fixes.
STOCK, PATCHED = "lmcache", "lmcache-patched"
CONNECTORS = (STOCK, PATCHED)
TENANT_TAG = "lmcache.tag.tenant"
#: Facts (`Fixes.facts`): pins V1 released for requests that had ended, and for lookups that completed after their
#: request ended.
ENDED_RELEASED, LATE_RELEASED = "V1 ended requests' pins released", "V1 late lookups' pins released"
#: Fact (`Fixes.facts`): V3's classes are in place on this worker (1) -- LMCache builds its remote backend only when vLLM
#: registers the KV caches (`LMCacheEngine.post_init`), after the connector is built, so V3 is applied then.
V3_APPLIED = "V3 remote fixes applied"
#: Ended request ids a worker remembers (for lookups completing late).
_REMEMBERED = 4096
#: Seconds V3 gives one native call of the remote connector (LMCache's GET and EXISTS).
GET_BOUND = 1.0


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
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

        self.connector = connector
        self.facts: collections.Counter = collections.Counter()
        self._ended: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._engine: Any = None
        self._stock: tuple[type, type] | None = None  # V3: the remote backend's and connector's stock classes
        self._registered = False  # vLLM registered the KV caches: LMCache's storage backends exist
        self.worker = connector.role == KVConnectorRole.WORKER
        self._on = False
        if self.worker:
            self._wrap_lookup()
        self.on = on

    @property
    def on(self) -> bool:
        return self._on

    @on.setter
    def on(self, value: bool) -> None:
        self._on = bool(value)
        if self.worker:
            self._remote_fixes(self._on)

    def registered(self) -> None:
        """vLLM registered the KV caches (LMCache's `post_init` built its storage backends): V3 applies from now."""
        self._registered = True
        if self.worker:
            self._remote_fixes(self._on)

    def _remote_fixes(self, on: bool) -> None:
        """V3 on (the patched classes, a renewed native client) or off (the stock classes back). Before the KV caches
        are registered there is no remote backend yet: `registered()` applies it then. After, an LMCache engine with
        no remote backend to fix is an error, never a silent stock run under the patched name."""
        engine = self.engine()
        sm = getattr(engine, "storage_manager", None)
        backend = (getattr(sm, "storage_backends", None) or {}).get("RemoteBackend")
        if backend is None:
            if on and self._registered and engine is not None:
                raise RuntimeError("lmcache-patched: V3 cannot apply, LMCache built no RemoteBackend on this worker "
                                   f"(its backends: {sorted(getattr(sm, 'storage_backends', None) or {})})")
            return
        conn = getattr(backend.connection, "_connector", backend.connection)
        if on and self._stock is None:
            from adapters.patched import patched_remote_backend_class, patched_resp_connector_class

            self._stock = (type(backend), type(conn))
            conn.__class__ = patched_resp_connector_class()
            conn.adopt(GET_BOUND, ("", ""))
            backend.__class__ = patched_remote_backend_class()
            backend.put_wait = GET_BOUND
            self.facts[V3_APPLIED] = 1
        elif not on and self._stock is not None:
            backend.__class__, conn.__class__ = self._stock
            self._stock = None
            self.facts[V3_APPLIED] = 0

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


def lmcache_connector_of(connector: Any, depth: int = 5) -> Any:
    """vLLM's `LMCacheConnectorV1` under a connector (itself, or what a wrapper keeps as `inner`/`_inner`/`base`/
    `_connector`), or None."""
    for _ in range(depth):
        if connector is None:
            return None
        impl = getattr(connector, "_lmcache_engine", None)
        if impl is not None and hasattr(impl, "lmcache_engine"):
            return connector
        connector = next((getattr(connector, a) for a in ("inner", "_inner", "base", "_connector")
                          if getattr(connector, a, None) is not None), None)
    return None


def lmcache_engine_of(connector: Any) -> Any:
    """The `LMCacheEngine` under a connector (see `lmcache_connector_of`), or None."""
    root = lmcache_connector_of(connector)
    return root._lmcache_engine.lmcache_engine if root is not None else None


def unstick(engine: Any, *, count_only: bool = False) -> int:
    """Complete, as "not held", every sync prefix count of `engine`'s remote connector that lost its completion
    (a thread parked in `batch_exists_sync`'s `fut.result()`, V3); how many (`count_only`: count them, complete none;
    a count just issued to a healthy server is counted too, for the moment it waits)."""
    import sys

    done = 0
    for frame in list(sys._current_frames().values()):
        while frame is not None:
            if frame.f_code.co_name == "batch_exists_sync" and "fut" in frame.f_locals:
                fut, keys = frame.f_locals["fut"], frame.f_locals.get("keys") or []
                if not fut.done():
                    if not count_only:
                        fut.set_result([False] * len(keys))
                    done += 1
                break
            frame = frame.f_back
    return done


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


def lookups_in_flight(engine: Any) -> int:
    """How many threads are inside `engine.lookup` now (the worker's lookup server answering a scheduler's count,
    which pins what it finds: one that ends after a `clear` pins again)."""
    import sys

    running = 0
    for frame in list(sys._current_frames().values()):
        while frame is not None:
            if frame.f_code.co_name == "lookup" and frame.f_locals.get("self") is engine:
                running += 1
                break
            frame = frame.f_back
    return running


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
    LocalCPU; `ended(ids)`: V1 told that these requests ended; `puts`: remote writes in flight; `unstick`: V3's
    stuck prefix counts completed (`stuck`: counted); `lookups`: lookups running now; `clear`: every pin released, LocalCPU emptied; `use(name)`: serve through another connector; `facts`;
    `stats` (the CPU paged connector's counters); `has_engine` (whether an LMCache engine runs here)."""
    from adapters.vllm_stack import cpu_paged_connector

    engine = connector.fixes.engine()
    if what == "rank":
        return connector.rank
    if what == "has_engine":
        return engine is not None
    if what == "use":
        connector.use(args[0])
        return None
    if what == "facts":
        return dict(connector.fixes.facts)
    if what == "ended":
        connector.fixes.after_ended(args[0])
        return None
    if what == "stats":
        return dict(cpu_paged_connector.STATS)
    if engine is None:  # no LMCache engine here (a user's connector, or stock LMCache degraded): it holds nothing
        idle = {"pins": (0, []), "puts": 0, "unstick": 0, "stuck": 0, "clear": 0, "evict": 0, "lookups": 0}
        if what == "local":
            return [False] * len(args[0])
        if what in idle:
            return idle[what]
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
    if what == "unstick":
        return unstick(engine)
    if what == "stuck":
        return unstick(engine, count_only=True)
    if what == "lookups":
        return lookups_in_flight(engine)
    if what == "clear":
        _release_all(engine)
        return engine.clear(locations=["LocalCPUBackend"])
    raise ValueError(f"unknown probe {what!r}")
