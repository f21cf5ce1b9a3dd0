"""The synthetic KV of `--engine sglang-hicache`, the same on both sides of the pipe (no SGLang, no torch here).

There is no model: the KV of a page is a deterministic function of the tokens up to the page's end and of the rank
(each rank holds its own shard of every page, as tensor-parallel ranks hold their heads), `page_kv`. A rank writes it
into SGLang's host pool and backs it up through SGLang's own storage calls; after a load it digests what its host pool
holds (`digest`), and the parent compares that with the digest of what the page should hold, computed (`expected`).
A request's `output` is one number per page of its prefetchable span, the pages' digests over every rank combined
(`combine`), and one for the tokens after it: wrong, missing or stale KV on any rank changes the page's number.
"""
from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

__all__ = ["page_kv", "digest", "expected", "combine", "tail_token"]


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little")


def page_kv(tokens_to_end: Sequence[int], rank: int, numel: int) -> np.ndarray:
    """The flat float32 KV page (`numel` values: SGLang's flat data page) rank `rank` holds for the page ending after
    `tokens_to_end`."""
    rng = np.random.default_rng(_seed("kv", tuple(int(t) for t in tokens_to_end), rank))
    return rng.standard_normal(numel, dtype=np.float32)


def digest(data: bytes) -> str:
    """A page's digest: of its raw bytes."""
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def expected(tokens_to_end: Sequence[int], rank: int, numel: int) -> str:
    """The digest of the page as it should be (computed, never loaded)."""
    return digest(page_kv(tokens_to_end, rank, numel).tobytes())


def combine(per_rank: Sequence[str]) -> int:
    """One output number from the digests of one page on every rank."""
    return 2 + _seed("page", tuple(per_rank)) % (2 ** 31 - 2)


def tail_token(tokens: Sequence[int]) -> int:
    """The output number for what is computed after the prefetchable span (always computed: the same for a hit)."""
    return 2 + _seed("tail", tuple(int(t) for t in tokens)) % (2 ** 31 - 2)
