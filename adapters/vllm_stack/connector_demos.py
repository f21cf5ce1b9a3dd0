"""Demo KV connectors for `--connector adapters.vllm_stack.connector_demos:NAME`: each wraps vLLM's stock
`LMCacheConnectorV1` (composition: `LMCacheWrapper`) and breaks one stack property, except `CorrectWrapper`.

- `CorrectWrapper`: pure delegation; holds wherever stock LMCache holds.
- `OverReporting`: when LMCache has a hit, answers one vLLM block (32 tokens) more than it holds (as long as one
  prompt token is left to compute) and tells LMCache the true count, so vLLM takes that block as loaded while nothing
  was written into it: `hit-accuracy` (reported > held), and the output is computed over a block of stale KV
  (`output-equality`).
- `NeverFinishedLoad`: when LMCache has a hit, answers it as an asynchronous load (`load_kv_async=True`) and never
  lists the request in `get_finished`'s finished-receiving set: vLLM parks the request in WAITING_FOR_REMOTE_KVS for
  good (`request-returns`), and once it is aborted its blocks are never freed (`kv-leaks`: vLLM frees a
  WAITING_FOR_REMOTE_KVS request's blocks only once its load is reported finished).
- `HeldBlocks`: every finished request's blocks are said to be still saving (`request_finished` answers
  `delay_free_blocks=True`) and the save is never reported done (`get_finished` lists no finished sending): vLLM
  never frees them (`kv-leaks`); hits, counts and outputs stay right.
- `SwappedLoads`: when two requests of one step load the same number of tokens into prompts of one length, each
  request's KV goes into the other's blocks (their slot mappings swapped for the load): each request computes over
  another request's KV (`output-equality`); hits and counts stay right.

Each can also be put around a running stack's LMCache (`LMCacheWrapper.around`, the stack's `use_connector`), so one
vLLM start serves them all. Around vLLM's `MooncakeStoreConnector` (`--connector mooncake`) the same wrappers go, by
`around` only (`MOONCAKE_DEMOS`): `CorrectWrapper`, `OverReporting`, `NeverFinishedLoad` and `HeldBlocks` as above,
and two of Mooncake's own: `DuplicatedLoads` (each load reads its first chunk's KV into every block: `output-equality`) and `SaltBlind`
(vLLM's block hashes without the tenant's salt: `engine-isolation`).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole

from adapters.vllm_stack.delegating import DelegatingConnector

__all__ = ["LMCacheWrapper", "CorrectWrapper", "OverReporting", "NeverFinishedLoad", "HeldBlocks", "SwappedLoads",
           "DuplicatedLoads", "SaltBlind", "DEMOS", "MOONCAKE_DEMOS"]


class LMCacheWrapper(DelegatingConnector):
    """vLLM's `LMCacheConnectorV1`, wrapped: every hook delegated (`DelegatingConnector`)."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        from vllm.distributed.kv_transfer.kv_connector.v1.lmcache_connector import LMCacheConnectorV1

        self.inner = LMCacheConnectorV1(vllm_config, role, kv_cache_config)
        self._setup()

    @classmethod
    def around(cls, connector: KVConnectorBase_V1) -> "LMCacheWrapper":
        """This wrapper around an `LMCacheConnectorV1` already built (no second LMCache)."""
        self = cls.__new__(cls)
        KVConnectorBase_V1.__init__(self, connector._vllm_config, connector.role, connector._kv_cache_config)
        self.inner = connector
        self._setup()
        return self

    def _setup(self) -> None:
        """A subclass's own state."""


class CorrectWrapper(LMCacheWrapper):
    """Pure delegation."""


class OverReporting(LMCacheWrapper):
    """One block more than LMCache holds (see the module docstring)."""

    def _setup(self) -> None:
        self.block_size = self._vllm_config.cache_config.block_size
        self.extra: dict[str, int] = {}

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        held, load_async = self.inner.get_num_new_matched_tokens(request, num_computed_tokens)
        if not held:
            return held, load_async
        room = request.num_tokens - 1 - num_computed_tokens
        claimed = min(held + self.block_size, room)
        self.extra[request.request_id] = max(0, claimed - held)
        return max(held, claimed), load_async

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        extra = self.extra.pop(request.request_id, 0) if num_external_tokens else 0
        return self.inner.update_state_after_alloc(request, blocks, num_external_tokens - extra)


class NeverFinishedLoad(LMCacheWrapper):
    """A hit answered as an asynchronous load that is never reported finished (see the module docstring)."""

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        held, _ = self.inner.get_num_new_matched_tokens(request, num_computed_tokens)
        return held, bool(held)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        sending, _ = self.inner.get_finished(finished_req_ids)
        return sending, None

    def get_transfer_results(self, finished_req_ids: set[str]) -> Any:
        # (a connector with transfer results of its own, Mooncake's, reports its loads there, not in get_finished)
        results = super().get_transfer_results(finished_req_ids)
        return dataclasses.replace(results, finished_recving=set())


class HeldBlocks(LMCacheWrapper):
    """Blocks held for a save that is never reported done (see the module docstring)."""

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        _, params = self.inner.request_finished(request, block_ids)
        return True, params

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        _, receiving = self.inner.get_finished(finished_req_ids)
        return None, receiving

    def get_transfer_results(self, finished_req_ids: set[str]) -> Any:
        results = super().get_transfer_results(finished_req_ids)
        return dataclasses.replace(results, finished_sending=set())


class SwappedLoads(LMCacheWrapper):
    """Two requests' loads swapped between their blocks (see the module docstring)."""

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self.inner._get_connector_metadata()
        original = list(getattr(meta, "requests", ()))
        loading = [r for r in original if r.load_spec is not None and r.load_spec.can_load]
        swapped = {}
        for i, a in enumerate(loading):
            b = next((b for b in loading[i + 1:] if id(b) not in swapped and id(a) not in swapped
                      and len(b.token_ids) == len(a.token_ids)
                      and (b.load_spec.vllm_cached_tokens, b.load_spec.lmcache_cached_tokens)
                      == (a.load_spec.vllm_cached_tokens, a.load_spec.lmcache_cached_tokens)), None)
            if b is not None:
                swapped[id(a)] = dataclasses.replace(a, slot_mapping=b.slot_mapping)
                swapped[id(b)] = dataclasses.replace(b, slot_mapping=a.slot_mapping)
        if not swapped:
            return self.inner.start_load_kv(forward_context, **kwargs)
        meta.requests = [swapped.get(id(r), r) for r in original]
        try:
            return self.inner.start_load_kv(forward_context, **kwargs)
        finally:
            meta.requests = original


class DuplicatedLoads(LMCacheWrapper):
    """Mooncake: each load reads its first chunk's KV into every block it loads (the load's copy of the request's
    block hashes starts every chunk with chunk 0's), the hit and its count right: a request that loads two chunks or
    more computes over chunk 0's KV twice and never sees the rest (`output-equality`; a mere reordering of the
    blocks would not show: attention over the prompt's keys does not depend on where they sit). Around vLLM's
    `MooncakeStoreConnector` only (its `ReqMeta.block_hashes`)."""

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self.inner._get_connector_metadata()
        original = list(getattr(meta, "requests", ()))
        block = self._vllm_config.cache_config.block_size
        changed = []
        for r in original:
            spec = r.load_spec
            n = spec.kvpool_cached_tokens // block if spec is not None and spec.can_load else 0
            if n >= 2:  # (a copy: the receiving threads read it later)
                hashes = list(r.block_hashes)
                r = dataclasses.replace(r, block_hashes=[hashes[0]] * n + hashes[n:])
            changed.append(r)
        meta.requests = changed
        try:
            return self.inner.start_load_kv(forward_context, **kwargs)
        finally:
            meta.requests = original


class SaltBlind(LMCacheWrapper):
    """Mooncake: vLLM's block hashes without the tenant's `cache_salt` while this demo serves (vLLM's
    `generate_block_hash_extra_keys`, vllm/v1/core/kv_cache_utils.py:614, answered without its salt key), so two
    tenants' identical prompts share the connector's keys and one is served the other's KV (`engine-isolation`).
    `retire()` puts vLLM's function back (the stack's `use_connector` calls it when it moves on)."""

    _stock: Any = None

    def _setup(self) -> None:
        from vllm.v1.core import kv_cache_utils as K

        if SaltBlind._stock is None:
            SaltBlind._stock = K.generate_block_hash_extra_keys
        stock = SaltBlind._stock

        def without_salt(request: Any, *args: Any, **kwargs: Any) -> Any:
            keys, nxt = stock(request, *args, **kwargs)
            if keys:
                keys = tuple(k for k in keys if not (isinstance(k, tuple) and k and k[0] == "cache_salt")) or None
            return keys, nxt

        K.generate_block_hash_extra_keys = without_salt

    def retire(self) -> None:
        from vllm.v1.core import kv_cache_utils as K

        if SaltBlind._stock is not None:
            K.generate_block_hash_extra_keys = SaltBlind._stock


#: The demos by name, with the property each breaks.
DEMOS = {"CorrectWrapper": None, "OverReporting": "hit-accuracy", "NeverFinishedLoad": "request-returns",
         "HeldBlocks": "kv-leaks", "SwappedLoads": "output-equality"}
#: The demos put around vLLM's `MooncakeStoreConnector` (`--connector mooncake`, the stack's `use_connector`), with
#: the property each breaks.
MOONCAKE_DEMOS = {"CorrectWrapper": None, "OverReporting": "hit-accuracy", "NeverFinishedLoad": "request-returns",
                  "HeldBlocks": "kv-leaks", "DuplicatedLoads": "output-equality", "SaltBlind": "engine-isolation"}
