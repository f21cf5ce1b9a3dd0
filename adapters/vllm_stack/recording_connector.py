"""The KV connector vLLM is given: `RecordingConnector`, a `KVConnectorBase_V1` that builds the connector under test
(its inner connector) and passes every hook through, recording what the checks observe.

vLLM builds it from `KVTransferConfig(kv_connector="RecordingConnector", kv_connector_module_path=
"adapters.vllm_stack.recording_connector", kv_role="kv_both", kv_connector_extra_config={"shardcheck": SPEC})`, in
its scheduler (role SCHEDULER) and in every worker (role WORKER; with tensor parallelism, one per worker process).
`SPEC` names the inner connector (`lmcache`, `lmcache-patched`, `mooncake` (vLLM's `MooncakeStoreConnector` with
its CPU stand-in, `adapters.vllm_stack.mooncake_child`; `SPEC["tier"]` is then "mooncake") or `MOD:ATTR`, a `KVConnectorBase_V1` subclass
built as vLLM would build it: `(vllm_config, role, kv_cache_config)`) and whether to install shardcheck's CPU paged
LMCache connector (`adapters.vllm_stack.cpu_paged_connector`) first: it is installed here, when the connector is
built, the first moment LMCache may be imported in a vLLM-CPU process. Each worker reads its own LMCache config
(`SHARDCHECK_LMCACHE_CONFIG` with `{rank}` replaced by its tensor-parallel rank, as `LMCACHE_CONFIG_FILE`): each
rank's LMCache worker talks to its own Valkey server.

What it records (scheduler side, by vLLM's request id): the inner connector's answers of
`get_num_new_matched_tokens` (`reported`: the last number it answered), the external tokens of
`update_state_after_alloc` (`external`: the allocation that took them; the one vLLM makes again once an asynchronous
load finished, with 0 external tokens, does not overwrite it), and at `request_finished` the request's preemptions and status.

A reference request (`SamplingParams.extra_args["shardcheck"]["reference"]`, the oracle of output-equality) bypasses
the inner connector: it is answered 0 without asking, and it is left out of the scheduler output the inner connector
builds its metadata from, so nothing is loaded or saved for it: vLLM recomputes it with no KV cache at all.

`lmcache-patched`'s fixes live in `adapters.vllm_stack.lmcache_fixes`, applied here when `fixes` is on. The metadata
the workers receive is `RecordingMetadata`: the inner connector's, plus what the fixes send the workers (request ids
whose lookup pins must go) and the ids of the reference requests.

The module-level `worker_probe` runs in every worker (`LLMEngine.collective_rpc`: a function of this module is
pickled by reference) and answers what the checks ask of a rank: its LMCache chunk keys, LocalCPU holdings, pins.
"""
from __future__ import annotations

import collections
import dataclasses
import os
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole

from adapters.vllm_stack.delegating import DelegatingConnector
from adapters.vllm_stack.lmcache_fixes import CONNECTORS, PATCHED, STOCK, lmcache_connector_of

#: vLLM's own `MooncakeStoreConnector` (`adapters.vllm_stack.mooncake_child`).
MOONCAKE = "mooncake"

__all__ = ["RecordingConnector", "RecordingMetadata", "INSTANCES", "worker_probe", "is_reference",
           "load_connector_class"]

#: Every RecordingConnector built in this process (the driver and `worker_probe` find them here).
INSTANCES: list["RecordingConnector"] = []


def is_reference(request: Any) -> bool:
    """Whether a vLLM request is a reference request (served with no KV connector at all)."""
    extra = getattr(getattr(request, "sampling_params", None), "extra_args", None) or {}
    return bool((extra.get("shardcheck") or {}).get("reference"))


def load_connector_class(spec: str) -> type:
    """`MOD:ATTR` -> the connector class (the module imported here, in vLLM's process)."""
    import importlib

    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"a connector is lmcache, lmcache-patched or MOD:ATTR, got {spec!r}")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, KVConnectorBase_V1)):
        raise TypeError(f"{spec} is not a KVConnectorBase_V1 subclass")
    return obj


@dataclasses.dataclass
class RecordingMetadata(KVConnectorMetadata):
    """What a worker gets each step: the inner connector's metadata, the request ids whose LMCache lookup pins the
    workers release (`lmcache-patched`), and the reference requests' ids."""

    inner: Any = None
    ended: tuple[str, ...] = ()
    references: frozenset = frozenset()


def _without(scheduler_output: Any, drop: set[str]) -> Any:
    """A shallow copy of vLLM's `SchedulerOutput` without the requests in `drop` (the inner connector must not see
    reference requests): new requests filtered, the cached requests' parallel lists filtered by index, every
    set and dict keyed by request id filtered."""
    present = {r.req_id for r in scheduler_output.scheduled_new_reqs} | set(scheduler_output.scheduled_cached_reqs.req_ids)
    if not (drop & (present | set(scheduler_output.num_scheduled_tokens) | set(scheduler_output.finished_req_ids))):
        return scheduler_output

    def keep_ids(value: Any) -> Any:
        if isinstance(value, (set, frozenset)):
            return type(value)(v for v in value if v not in drop)
        if isinstance(value, dict):
            return {k: v for k, v in value.items() if k not in drop}
        return value

    cached = scheduler_output.scheduled_cached_reqs
    kept = [i for i, rid in enumerate(cached.req_ids) if rid not in drop]
    changes = {}
    for f in dataclasses.fields(cached):
        value = getattr(cached, f.name)
        if isinstance(value, list) and len(value) == len(cached.req_ids):
            changes[f.name] = [value[i] for i in kept]
        else:
            changes[f.name] = keep_ids(value)
    out = {f.name: keep_ids(getattr(scheduler_output, f.name)) for f in dataclasses.fields(scheduler_output)}
    out["scheduled_new_reqs"] = [r for r in scheduler_output.scheduled_new_reqs if r.req_id not in drop]
    out["scheduled_cached_reqs"] = dataclasses.replace(cached, **changes)
    out["total_num_scheduled_tokens"] = sum(out["num_scheduled_tokens"].values())
    return dataclasses.replace(scheduler_output, **out)


class RecordingConnector(DelegatingConnector):
    """See the module docstring."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config or {}
        self.spec: dict = dict(extra.get("shardcheck") or {})
        self.name = self.spec.get("connector", STOCK)
        self.rank = 0
        if role == KVConnectorRole.WORKER:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

            self.rank = get_tensor_model_parallel_rank()
        template = os.environ.get("SHARDCHECK_LMCACHE_CONFIG")
        if template:
            os.environ["LMCACHE_CONFIG_FILE"] = template.replace("{rank}", str(self.rank))
        #: The tier the connector built stores in: STOCK (LMCache's, every connector but Mooncake's) or
        #: "mooncake" (vLLM's `MooncakeStoreConnector`, `adapters.vllm_stack.mooncake_child`).
        self.tier = self.spec.get("tier", STOCK)
        if self.spec.get("cpu_connector", True) and self.tier != MOONCAKE:
            from adapters.vllm_stack import cpu_paged_connector

            cpu_paged_connector.install()
        if self.name == MOONCAKE:
            from adapters.vllm_stack import mooncake_child

            cls = mooncake_child.connector_class()
        elif self.name in CONNECTORS:
            from vllm.distributed.kv_transfer.kv_connector.v1.lmcache_connector import LMCacheConnectorV1

            cls: type = LMCacheConnectorV1
        else:
            cls = load_connector_class(self.name)
        #: The connector built (`base`) and the one every hook goes to (`inner`: `base`, or a demo around it).
        self.base = cls(vllm_config, role, kv_cache_config)
        self.inner = self.base
        from adapters.vllm_stack import lmcache_fixes

        self.fixes = lmcache_fixes.Fixes(self, on=self.name == PATCHED)
        # scheduler side, by vLLM's request id
        self.reported: dict[str, int | None] = {}
        self.answers: dict[str, list] = collections.defaultdict(list)
        self.external: dict[str, int] = {}
        self.ended: dict[str, dict] = {}
        self._references: set[str] = set()
        self._ended_since: list[str] = []
        INSTANCES.append(self)

    # -- switching the inner connector (the stack's `use_connector`) ----------------------------------------------
    def use(self, name: str) -> None:
        """Serve through `name` from now on, on the LMCache this connector built: `lmcache`, `lmcache-patched`, or a
        `MOD:ATTR` class with `around(connector)` (`adapters.vllm_stack.connector_demos.LMCacheWrapper`), put around
        the `LMCacheConnectorV1` under the connector built."""
        root = self.base if self.tier == MOONCAKE else lmcache_connector_of(self.base)
        if root is None:
            raise ValueError(f"the running connector {self.name} has no LMCacheConnectorV1 to serve {name} through")
        retire = getattr(self.inner, "retire", None)
        if callable(retire):  # (a demo that patched vLLM while it served: vLLM back as it was)
            retire()
        if name in (CONNECTORS if self.tier != MOONCAKE else (MOONCAKE,)):
            self.inner = root
        else:
            cls = load_connector_class(name)
            if not hasattr(cls, "around"):
                raise ValueError(f"{name} cannot be put around the running connector (it has no `around`)")
            self.inner = cls.around(root)
        self.name = name
        self.fixes.on = name == PATCHED

    def register_kv_caches(self, kv_caches: dict) -> None:
        # LMCache builds its storage backends here (`post_init`): the fixes that re-class them apply only now
        super().register_kv_caches(kv_caches)
        self.fixes.registered()

    # -- scheduler side -----------------------------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        rid = request.request_id
        if is_reference(request):
            self._references.add(rid)
            return 0, False
        self.fixes.before_lookup(request)
        answer = self.inner.get_num_new_matched_tokens(request, num_computed_tokens)
        self.answers[rid].append((num_computed_tokens, answer))
        if answer[0] is not None:
            self.reported[rid] = int(answer[0])
        return answer

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        if request.request_id in self._references:
            return None
        # (after an asynchronous load, vLLM allocates the request again with 0 external tokens, its KV already
        # loaded, `num_computed_tokens` > 0: what it took is the first allocation's)
        if num_external_tokens or not request.num_computed_tokens or request.request_id not in self.external:
            self.external[request.request_id] = int(num_external_tokens)
        return self.inner.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        inner = self.inner.build_connector_meta(_without(scheduler_output, self._references))
        ended = self.take_ended()
        refs = frozenset(self._references)
        self._references -= set(scheduler_output.finished_req_ids)
        return RecordingMetadata(inner=inner, ended=ended, references=refs)

    def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, dict | None]:
        rid = request.request_id
        self.ended[rid] = {"preemptions": int(getattr(request, "num_preemptions", 0) or 0),
                           "status": str(getattr(request, "status", ""))}
        if rid in self._references:
            return False, None
        self._ended_since.append(rid)
        return self.inner.request_finished(request, block_ids)

    def take_ended(self) -> tuple[str, ...]:
        """The ids of the requests that ended since the last metadata built (they will not be in it now)."""
        ended, self._ended_since = tuple(self._ended_since), []
        return ended

    def forget(self) -> None:
        """Drop what was recorded (a fresh case)."""
        self.reported.clear()
        self.answers.clear()
        self.external.clear()
        self.ended.clear()

    # -- worker side --------------------------------------------------------------------------------------------------
    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        KVConnectorBase_V1.bind_connector_metadata(self, connector_metadata)
        inner = connector_metadata
        if isinstance(connector_metadata, RecordingMetadata):
            self.fixes.after_ended(connector_metadata.ended)
            inner = connector_metadata.inner
        return self.inner.bind_connector_metadata(inner)

    def handle_preemptions(self, kv_connector_metadata: Any) -> None:
        if isinstance(kv_connector_metadata, RecordingMetadata):
            kv_connector_metadata = kv_connector_metadata.inner
        return self.inner.handle_preemptions(kv_connector_metadata)

    def _references_now(self) -> frozenset:
        meta = self._connector_metadata
        return meta.references if isinstance(meta, RecordingMetadata) else frozenset()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return self.inner.get_finished(set(finished_req_ids) - self._references_now())

    def get_transfer_results(self, finished_req_ids: set[str]) -> Any:
        return super().get_transfer_results(set(finished_req_ids) - self._references_now())



# -- what a worker answers (run in every worker by `collective_rpc`) --------------------------------------------------
def _worker_connector() -> RecordingConnector | None:
    return next((c for c in reversed(INSTANCES) if c.role == KVConnectorRole.WORKER), None)


def worker_probe(worker: Any, what: str, *args: Any) -> Any:
    """One question to this worker's rank (see `adapters.vllm_stack.lmcache_fixes.probe` for the questions)."""
    from adapters.vllm_stack import lmcache_fixes

    connector = _worker_connector()
    if connector is None:
        raise RuntimeError("no KV connector was built in this worker")
    if connector.tier == MOONCAKE:
        from adapters.vllm_stack import mooncake_child

        return mooncake_child.probe(connector, what, *args)
    return lmcache_fixes.probe(connector, what, *args)
