"""A CPU stand-in for vLLM's paged KV buffer and LMCache's GPU connector, copying real bytes.

LMCache's `MockGPUConnector` copies nothing, so a retrieve could not be checked byte for byte. `CPUConnector`
implements LMCache's `GPUConnectorInterface` over a plain `uint8` tensor of shape `[2, layers, tokens, hidden]`
(LMCache's `KV_2LTD` layout): `batched_from_gpu` (the store path) copies each chunk's token range out of the
request's KV tensor into the memory object, `batched_to_gpu` (the retrieve path) copies each memory object into
the request's output tensor. A memory object LMCache hands over after freeing it (`is_valid()` false) is not
copied: it is recorded in `invalid` (with the bytes still at its address), so a retrieve of freed memory is seen.
"""
from __future__ import annotations

from typing import Any, Sequence

__all__ = ["KV_LAYERS", "KV_HIDDEN", "bytes_per_token", "connector_class", "kv_tensor", "chunk_bytes_of"]

#: The KV geometry of every rank: 2 (K and V) x KV_LAYERS layers x KV_HIDDEN bytes per token.
KV_LAYERS = 2
KV_HIDDEN = 8


def bytes_per_token() -> int:
    return 2 * KV_LAYERS * KV_HIDDEN


_CLASS: Any = None


def connector_class() -> type:
    """`CPUConnector` (built lazily: importing this module does not import torch or LMCache)."""
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    import torch
    from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface

    class CPUConnector(GPUConnectorInterface):
        """LMCache's GPU connector interface over CPU tensors; `kvcaches` (a keyword of store and retrieve, as
        in vLLM) is the request's KV tensor to read from or to write into."""

        def __init__(self) -> None:
            self.invalid: list[dict] = []  # memory objects handed over after they were freed

        def from_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
            self.batched_from_gpu([memory_obj], [start], [end], **kwargs)

        def to_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
            self.batched_to_gpu([memory_obj], [start], [end], **kwargs)

        def batched_from_gpu(self, memory_objs: Sequence[Any], starts: Sequence[int], ends: Sequence[int],
                             **kwargs: Any) -> None:
            kv = kwargs["kvcaches"]
            for mo, s, e in zip(memory_objs, starts, ends):
                mo.tensor.copy_(kv[:, :, s:e, :])

        def batched_to_gpu(self, memory_objs: Sequence[Any], starts: Sequence[int], ends: Sequence[int],
                           **kwargs: Any) -> None:
            out = kwargs["kvcaches"]
            for mo, s, e in zip(memory_objs, starts, ends):
                if not mo.is_valid():
                    raw = mo.raw_data
                    n = (e - s) * bytes_per_token()
                    self.invalid.append({"start": int(s), "end": int(e), "address": int(mo.meta.address),
                                         "bytes": bytes(raw.view(torch.uint8).flatten()[:n].tolist())})
                    continue
                out[:, :, s:e, :].copy_(mo.tensor)

        def get_shape(self, num_tokens: int) -> Any:
            return torch.Size([2, KV_LAYERS, num_tokens, KV_HIDDEN])

    _CLASS = CPUConnector
    return _CLASS


def kv_tensor(chunks: Sequence[bytes], chunk_size: int, n_tokens: int) -> Any:
    """The request's KV tensor `[2, layers, n_tokens, hidden]` holding `chunks[c]` (the KV bytes of chunk `c`, in
    KV_2LTD order) at tokens `c*chunk_size ...`; tokens past the full chunks (a partial tail) are zero."""
    import torch

    kv = torch.zeros((2, KV_LAYERS, n_tokens, KV_HIDDEN), dtype=torch.uint8)
    for c, data in enumerate(chunks):
        block = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(2, KV_LAYERS, chunk_size, KV_HIDDEN)
        kv[:, :, c * chunk_size:(c + 1) * chunk_size, :] = block
    return kv


def chunk_bytes_of(kv: Any, chunk: int, chunk_size: int) -> bytes:
    """The bytes of chunk `chunk` in a KV tensor (the inverse of `kv_tensor`)."""
    return bytes(kv[:, :, chunk * chunk_size:(chunk + 1) * chunk_size, :].contiguous().flatten().tolist())
