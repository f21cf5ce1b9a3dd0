"""The engine-level oracle: what every rank holds, the expected minimum, the bytes, the pins; and the checks.

Pure: the interpreter (`checking.serving.engine_run`) observes the real engine and hands the observations in.

- `kv_bytes(identity, rank, chunk, n_ranks, size)`: the KV bytes a rank computes for a chunk (a function of its KV
  identity, `model.engine_case.kv_identity`): two requests with equal identities have equal KV on a rank.
- `Ledger`: which KV identities were stored under each chunk key on each rank, and whose bytes are whose.
- The checks, each returning `Violation`s: `check_lookup` (`engine-soundness`, `engine-completeness`,
  `engine-isolation`), `check_retrieve` (`engine-integrity`, `engine-isolation`), `check_pins` (`pins`).
  `engine-returns` (every call, close included, returns an answer within its bound) is found by the interpreter.

A rank's prefix for a request counts its leading chunks whose keys the rank holds (LocalCPU or its server) and
that hold this request's KV: `own` counts only keys some store of an equal identity wrote, `any` every held key.
Observed before and after the lookup, `lo` is the prefix held throughout, `hi` the prefix held at either instant.
"""
from __future__ import annotations

import hashlib
from typing import Any, Sequence

import attrs

from model.codec import preview
from model.outcome import Violation

__all__ = ["kv_bytes", "Ledger", "RankView", "check_lookup", "check_retrieve", "check_pins",
           "returns_violation"]

def kv_bytes(identity: tuple, rank: int, chunk: int, n_ranks: int, size: int) -> bytes:
    """Deterministic KV bytes of one chunk on one rank (each rank holds its own shard of the heads)."""
    seed = repr((identity, rank, chunk, n_ranks)).encode()
    out = bytearray()
    counter = 0
    while len(out) < size:
        out += hashlib.blake2b(seed + counter.to_bytes(4, "big"), digest_size=64).digest()
        counter += 1
    return bytes(out[:size])


class Ledger:
    """What the case's stores wrote: per rank, chunk key -> the KV identities stored under it, and the bytes of
    every (identity, rank, chunk) -> a description of whose they are."""

    def __init__(self) -> None:
        self.written: dict[int, dict[str, set[tuple]]] = {}
        self.whose: dict[bytes, str] = {}
        #: Per rank, the keys its server may hold (written, not evicted from it since, not lost in a restart).
        self.remote: dict[int, set[str]] = {}

    def stored(self, rank: int, keys: Sequence[str], identities: Sequence[tuple], kv: Sequence[bytes],
               prompt: str) -> None:
        keys_of = self.written.setdefault(rank, {})
        self.remote.setdefault(rank, set()).update(keys)
        for c, (key, identity, data) in enumerate(zip(keys, identities, kv)):
            keys_of.setdefault(key, set()).add(identity)
            self.whose.setdefault(data, f"prompt {prompt} chunk {c} (rank {rank})")

    def evicted_remote(self, rank: int, key: str) -> None:
        self.remote.get(rank, set()).discard(key)

    def server_lost(self, rank: int) -> None:
        """The rank's server was killed or restarted: it holds nothing of what was written."""
        self.remote[rank] = set()

    def maybe_remote(self, rank: int, key: str) -> bool:
        return key in self.remote.get(rank, set())

    def identities(self, rank: int, key: str) -> set[tuple]:
        return self.written.get(rank, {}).get(key, set())


@attrs.frozen
class RankView:
    """One rank's prefixes (chunks) for one lookup: held throughout (`lo`), at either observation (`hi`), counting
    only keys holding this request's KV (`own_*`) or every held key (`any_hi`); `unknown` when its server could
    not be observed (a paused or killed server)."""

    own_lo: int
    own_hi: int
    any_hi: int
    unknown: bool = False


def prefix(held: Sequence[bool]) -> int:
    n = 0
    for h in held:
        if not h:
            break
        n += 1
    return n


def check_lookup(answer: Any, views: Sequence[RankView], chunk_size: int, *, failed: str, request: str,
                 prompt: str) -> list[Violation]:
    """The lookup's answer (hit tokens) against every rank's prefix: never more than the minimum of what the ranks
    hold (`engine-soundness`; counting chunks that hold another request's KV: `engine-isolation`), and, when
    nothing failed (`failed` is empty), exactly the minimum over ranks (`engine-completeness`)."""
    if not isinstance(answer, int) or isinstance(answer, bool):
        return [Violation("engine-returns", f"the lookup of {request} answered {answer!r}, not a token count",
                          {"request": request})]
    planned = answer // chunk_size
    any_hi = min(v.any_hi for v in views)
    own_hi = min(v.own_hi for v in views)
    own_lo = min(v.own_lo for v in views)
    per_rank = {r: [v.own_lo, v.own_hi] for r, v in enumerate(views)}
    detail = {"request": request, "prompt": prompt, "answer": answer, "planned": planned, "min_own": [own_lo, own_hi],
              "min_any": any_hi, "ranks": per_rank}
    if planned > any_hi:
        return [Violation("engine-soundness", f"the lookup of {request} ({prompt}) answered {answer} tokens "
                          f"({planned} chunks), more than the {any_hi} leading chunks every rank holds "
                          f"(prefix per rank: {_ranks(views, 'any_hi')})", detail)]
    if planned > own_hi:
        return [Violation("engine-isolation", f"the lookup of {request} ({prompt}) counted {planned} chunks, but "
                          f"only {own_hi} leading chunks on every rank hold this request's KV: chunks "
                          f"{own_hi}..{planned - 1} are another request's under the same engine keys", detail)]
    if not failed and planned < own_lo:
        return [Violation("engine-completeness", f"the lookup of {request} ({prompt}) answered {answer} tokens "
                          f"({planned} chunks) though every rank held the leading {own_lo} chunks throughout "
                          f"(prefix per rank: {_ranks(views, 'own_lo')}) and nothing failed", detail)]
    return []


def _ranks(views: Sequence[RankView], field: str) -> str:
    return ", ".join(f"rank {r}: {getattr(v, field)}" for r, v in enumerate(views))


def check_retrieve(rank: int, planned: int, got: Any, expected: Sequence[bytes], ledger: Ledger, *, chunk_size: int,
                   disturbed: str, request: str, prompt: str) -> list[Violation]:
    """One rank's retrieve of the `planned` leading chunks: exactly their stored bytes (never freed memory, never
    another request's bytes: `engine-isolation` when they are some other request's KV), a prefix within the plan,
    and the whole plan when nothing was disturbed since the lookup (`disturbed` empty)."""
    where = f"rank {rank}'s retrieve of {request} ({prompt})"
    base = {"request": request, "prompt": prompt, "rank": rank, "planned": planned}
    out: list[Violation] = []
    for f in getattr(got, "freed", None) or []:
        c = f.get("chunk")
        whose = ledger.whose.get(bytes(f.get("bytes", b"")))
        held = f"; its address now holds {whose}" if whose else ""
        out.append(Violation("engine-integrity", f"{where} was handed chunk {c}'s memory after the engine had freed "
                             f"it (the object is no longer valid{held})", {**base, "chunk": c, "freed": True}))
        return out
    chunks = list(getattr(got, "chunks", None) or [])
    retrieved = getattr(got, "retrieved", 0)
    present = [c for c, data in enumerate(chunks) if data is not None]
    if present != list(range(len(present))):
        return [Violation("engine-integrity", f"{where} filled chunks {present}, not a prefix", {**base, "chunks": present})]
    if retrieved > planned * chunk_size or len(present) > planned:
        return [Violation("engine-integrity", f"{where} loaded {len(present)} chunks, more than the {planned} planned",
                          {**base, "loaded": len(present)})]
    for c in present:
        if chunks[c] != expected[c]:
            whose = ledger.whose.get(bytes(chunks[c]))
            if whose:
                return [Violation("engine-isolation", f"{where} loaded chunk {c} with the KV of {whose}, another "
                                  "request's", {**base, "chunk": c, "from": whose})]
            return [Violation("engine-integrity", f"{where} loaded wrong bytes for chunk {c} ({preview(chunks[c])} "
                              f"instead of {preview(expected[c])})", {**base, "chunk": c})]
    if not disturbed and len(present) < planned:
        return [Violation("engine-integrity", f"{where} loaded {len(present)} of the {planned} planned chunks, though "
                          "nothing was evicted or failed since the lookup", {**base, "loaded": len(present)})]
    return out


def check_pins(pins: Sequence[int], *, when: str, deployment: int = 0) -> list[Violation]:
    """Every pin a lookup took is released once its request ended: with no request open, no rank holds a pin."""
    held = {r: p for r, p in enumerate(pins) if p}
    if not held:
        return []
    shown = ", ".join(f"rank {r}: {p}" for r, p in sorted(held.items()))
    where = f" of deployment {deployment}" if deployment else ""
    return [Violation("pins", f"{when}, ranks{where} still hold lookup pins ({shown}): a lookup pinned chunks "
                      "that ending its request did not release", {"pins": {str(r): p for r, p in held.items()},
                                                                     "deployment": deployment})]


def returns_violation(call: str, problem: str, **detail: Any) -> Violation:
    """`engine-returns`: a call (`close` included) that did not return within its bound, or raised."""
    return Violation("engine-returns", f"{call} {problem}", {"call": call, **detail})
