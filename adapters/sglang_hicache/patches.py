"""`--engine-patch`es of SGLang's HiCache controller (`--engine sglang-hicache`): the demos of its agreement, one
broken and one correct.

Each is a function with no arguments that patches SGLang's classes in the process it runs in. shardcheck calls every
`--engine-patch` in its own process too (`runtime.serving.ServingEngine.stack`); nothing of SGLang is imported there,
so these do nothing outside a rank process (`SHARDCHECK_SGL_RANK` set): each rank process applies them before it
builds its controller (`sgl_rank`), and they patch the base class, so the `HybridCacheController` production builds
inherits them.

- `agree_max`: every MIN agreement of the storage prefetch takes the MAX instead: the hit query's
  (`HybridCacheController._sync_prefetch_hit_query`, hybrid_cache_controller.py:1504; the base class's at
  cache_controller.py:1377) and the acks' (`_reduce_prefetch_ack`, cache_controller.py:1484, hybrid :1934); and every
  rank then fetches the agreed prefix, as it would after a correct agreement (SGLang cuts each rank's page list to its
  own hits before the agreement, `_storage_hit_query`, hybrid_cache_controller.py:1463: under a MAX alone a rank
  holding fewer pages would put fewer acks through the ack collective than the others, a desync that leaves its
  peers blocked there; this demo keeps one agreement, so that what it shows is the over-reported hit). The agreed
  hit is then the longest prefix any rank holds: found by `engine-soundness` and `hit-accuracy` (the agreed lookup
  counts more than every rank holds), and the pages a rank never had are "loaded" from whatever its host pool held
  there (`output-equality`).
- `agree_allgather_min`: a correct other way to agree: every rank's hit gathered (`all_gather` on the same gloo
  group), the least taken. Holds.
"""
from __future__ import annotations

import os

__all__ = ["agree_max", "agree_allgather_min"]


def _in_rank() -> bool:
    return os.environ.get("SHARDCHECK_SGL_RANK") == "1"


def _flip_min(cls: type, name: str, attr: str) -> None:
    """Wrap `cls.<name>` so that, while it runs, `cls._all_reduce` turns a MIN into a MAX."""
    import threading

    import torch

    original = getattr(cls, name)
    if getattr(original, attr, False):
        return
    local = threading.local()
    base_all_reduce = cls._all_reduce
    if not getattr(base_all_reduce, "_shardcheck_flip", False):
        def _all_reduce(self, tensor, op, groups):  # type: ignore[no-untyped-def]
            if getattr(local, "flip", 0) and op == torch.distributed.ReduceOp.MIN:
                op = torch.distributed.ReduceOp.MAX
            return base_all_reduce(self, tensor, op, groups)
        _all_reduce._shardcheck_flip = True  # type: ignore[attr-defined]
        _all_reduce._local = local  # type: ignore[attr-defined]
        cls._all_reduce = _all_reduce
    else:
        local = base_all_reduce._local

    def flipped(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        local.flip = getattr(local, "flip", 0) + 1
        try:
            return original(self, *args, **kwargs)
        finally:
            local.flip -= 1
    setattr(flipped, attr, True)
    flipped.__name__ = name
    setattr(cls, name, flipped)


def _fetch_agreed(cls: type) -> None:
    """Wrap `cls._storage_hit_query` so that it hands on every page of the span, not only this rank's hits: the
    prefetch thread then cuts that list to the agreed hit (cache_controller.py:1362)."""
    original = cls.__dict__.get("_storage_hit_query")
    if original is None or getattr(original, "_shardcheck_agreed", False):
        return

    def _storage_hit_query(self, operation):  # type: ignore[no-untyped-def]
        hashes, count = original(self, operation)
        return list(getattr(operation, "all_hash_values", None) or hashes), count
    _storage_hit_query._shardcheck_agreed = True  # type: ignore[attr-defined]
    cls._storage_hit_query = _storage_hit_query


def agree_max() -> None:
    """The hit query's and the acks' agreements take the MAX; every rank fetches the agreed prefix (see the module
    docstring)."""
    if not _in_rank():
        return
    from sglang.srt.managers.cache_controller import HiCacheController
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
    for cls in (HiCacheController, HybridCacheController):
        _flip_min(cls, "_sync_prefetch_hit_query", "_shardcheck_max_hit")
        _flip_min(cls, "_reduce_prefetch_ack", "_shardcheck_max_ack")
        _fetch_agreed(cls)


def agree_allgather_min() -> None:
    """Agree on the hit by gathering every rank's and taking the least (see the module docstring)."""
    if not _in_rank():
        return
    import torch

    from sglang.srt.mem_cache.hybrid_cache import hybrid_cache_controller as hcc
    cls = hcc.HybridCacheController
    if getattr(cls._sync_prefetch_hit_query, "_shardcheck_allgather", False):
        return
    original = cls._sync_prefetch_hit_query

    def _sync_prefetch_hit_query(self, operation, storage_hit_count):  # type: ignore[no-untyped-def]
        if any(t.hit_policy == hcc.PoolHitPolicy.TRAILING_PAGES for t in operation.pool_transfers or []):
            return original(self, operation, storage_hit_count)  # (trailing sidecar pools: SGLang's own)
        pools = list(hcc.PoolName)
        local = operation.query_pool_hit_pages
        packed = torch.tensor([storage_hit_count] + [local.get(p, hcc._NO_POOL_VERDICT) for p in pools],
                              dtype=torch.int)
        for group in self.prefetch_hits_sync_groups:
            rows = [torch.empty_like(packed) for _ in range(torch.distributed.get_world_size(group=group))]
            torch.distributed.all_gather(rows, packed, group=group)
            packed = torch.stack(rows).min(dim=0).values
        reduced = packed.tolist()
        operation.query_pool_hit_pages = {p: n for p, n in zip(pools, reduced[1:]) if n != hcc._NO_POOL_VERDICT}
        return int(reduced[0])
    _sync_prefetch_hit_query._shardcheck_allgather = True  # type: ignore[attr-defined]
    cls._sync_prefetch_hit_query = _sync_prefetch_hit_query
