"""Known-bad demo variants: each violates at least one property, proving that check can fail.

`DEMO_VARIANTS` maps every variant to the property it is built to violate (each property's record in
`model.checks.CATALOG` names its demos).
"""
from __future__ import annotations

from typing import ClassVar

import attrs

from model.checks import CATALOG
from model.effects import AllGather, AllReduceMin, Get, GetAsync, Put, TIMED_OUT, Wait
from model.protocols import PaperProtocol, PaperProtocolAsync, assemble, owned_chunks

__all__ = ["OwnCountReport", "EmptyRankReportsZero", "MaxCombine", "MismatchedOwnership", "GappyLoad",
           "GiveUpOnLocalMiss", "AlignedPlanGreedyLoad", "ByteOffByOne", "PessimisticLoad", "EarlyExitOnMiss",
           "SkipEmptyGather", "UnboundedWaitAsync", "RetryUntilPresent", "WrongAsyncKey", "PositionKeys", "PositionKeyedLoad", "PositionMarkedLookup", "DEMO_VARIANTS"]


@attrs.define(frozen=True)
class OwnCountReport(PaperProtocol):
    """Flawed lookup (i): a rank reports how many of its OWN chunks are present in a row, not a global index."""

    name: ClassVar[str] = "own-count-report"

    def rank_lookup(self, rank, n_ranks, chunk_hashes, contains) -> int:
        count = 0
        for c in owned_chunks(self, rank, n_ranks, len(chunk_hashes)):
            if not contains(self.key(c, chunk_hashes[c], rank, n_ranks)):
                break
            count += 1
        return count


@attrs.define(frozen=True)
class EmptyRankReportsZero(PaperProtocol):
    """Flawed lookup (ii): a rank that owns no chunk (short prompt, n_chunks < n_ranks) reports 0."""

    name: ClassVar[str] = "empty-rank-reports-zero"

    def rank_lookup(self, rank, n_ranks, chunk_hashes, contains) -> int:
        if not owned_chunks(self, rank, n_ranks, len(chunk_hashes)):
            return 0
        return super().rank_lookup(rank, n_ranks, chunk_hashes, contains)


@attrs.define(frozen=True)
class MaxCombine(PaperProtocol):
    """Flawed scheduler (iii): takes the maximum over ranks instead of the minimum."""

    name: ClassVar[str] = "max-combine"

    def combine(self, reports, n_chunks) -> int:
        return max(reports, default=n_chunks)


@attrs.define(frozen=True)
class MismatchedOwnership(PaperProtocol):
    """Flawed (iv): the store path places chunk c on rank c mod N, the lookup and load look on (c+1) mod N."""

    name: ClassVar[str] = "mismatched-ownership"

    def rank_store(self, rank, n_ranks, chunk_hashes, kv):
        for c in range(len(chunk_hashes)):
            if c % n_ranks == rank:
                yield Put(self.key(c, chunk_hashes[c], rank, n_ranks), kv[c])

    def owner(self, chunk: int, n_ranks: int) -> int:
        return (chunk + 1) % n_ranks


@attrs.define(frozen=True)
class GappyLoad(PaperProtocol):
    """Load keeps fetching past a miss and gathers whatever it got: results with holes (prefix)."""

    name: ClassVar[str] = "gappy-load"

    def rank_load(self, rank, n_ranks, chunk_hashes, planned):
        fetched = {}
        for c in owned_chunks(self, rank, n_ranks, planned):
            value = yield Get(self.key(c, chunk_hashes[c], rank, n_ranks))
            if value is not None:
                fetched[c] = value
        yield AllReduceMin(planned)
        shares = yield AllGather(fetched)
        return assemble(shares, planned)


@attrs.define(frozen=True)
class GiveUpOnLocalMiss(PaperProtocol):
    """A rank whose own fetch missed falls back to recomputing everything (returns no chunk) yet still joins
    both collectives, while the other ranks load the agreed prefix (agreement)."""

    name: ClassVar[str] = "give-up-on-local-miss"

    def rank_load(self, rank, n_ranks, chunk_hashes, planned):
        first_failed, fetched = yield from self.fetch_own(rank, n_ranks, chunk_hashes, planned)
        usable = yield AllReduceMin(first_failed)
        shares = yield AllGather({c: v for c, v in fetched.items() if c < usable})
        return {} if first_failed < planned else assemble(shares, usable)


@attrs.define(frozen=True)
class AlignedPlanGreedyLoad(PaperProtocol):
    """Scheduler rounds the plan down to whole rounds of N chunks; load ignores the plan and takes all it
    finds (within-plan, and completeness)."""

    name: ClassVar[str] = "aligned-plan-greedy-load"

    def combine(self, reports, n_chunks) -> int:
        planned = min(reports, default=n_chunks)
        return planned - planned % max(1, len(reports))

    def rank_load(self, rank, n_ranks, chunk_hashes, planned):
        return (yield from super().rank_load(rank, n_ranks, chunk_hashes, len(chunk_hashes)))


@attrs.define(frozen=True)
class ByteOffByOne(PaperProtocol):
    """Assembles gathered chunks with an off-by-one slice: the last byte of every value is lost (integrity)."""

    name: ClassVar[str] = "byte-off-by-one"

    def rank_load(self, rank, n_ranks, chunk_hashes, planned):
        result = yield from super().rank_load(rank, n_ranks, chunk_hashes, planned)
        return {c: v[:-1] for c, v in result.items()}


@attrs.define(frozen=True)
class PessimisticLoad(PaperProtocol):
    """Always drops the last planned chunk "to be safe", even with no fault (maximality)."""

    name: ClassVar[str] = "pessimistic-load"

    def rank_load(self, rank, n_ranks, chunk_hashes, planned):
        return (yield from super().rank_load(rank, n_ranks, chunk_hashes, max(0, planned - 1)))


@attrs.define(frozen=True)
class EarlyExitOnMiss(PaperProtocol):
    """A rank whose fetch missed skips the agreement and goes straight to the exchange (desync)."""

    name: ClassVar[str] = "early-exit-on-miss"

    def rank_load(self, rank, n_ranks, chunk_hashes, planned):
        first_failed, fetched = yield from self.fetch_own(rank, n_ranks, chunk_hashes, planned)
        usable = first_failed if first_failed < planned else (yield AllReduceMin(first_failed))
        shares = yield AllGather({c: v for c, v in fetched.items() if c < usable})
        return assemble(shares, usable)


@attrs.define(frozen=True)
class SkipEmptyGather(PaperProtocol):
    """A rank with nothing to contribute below the agreed prefix skips the AllGather (deadlock)."""

    name: ClassVar[str] = "skip-empty-gather"

    def rank_load(self, rank, n_ranks, chunk_hashes, planned):
        first_failed, fetched = yield from self.fetch_own(rank, n_ranks, chunk_hashes, planned)
        usable = yield AllReduceMin(first_failed)
        mine = {c: v for c, v in fetched.items() if c < usable}
        if not mine:
            return {}
        return assemble((yield AllGather(mine)), usable)


@attrs.define(frozen=True)
class UnboundedWaitAsync(PaperProtocolAsync):
    """Async load that waits for each completion with no timeout: a lost completion stalls it (hang)."""

    name: ClassVar[str] = "unbounded-wait-async"
    wait_timeout: float | None = None


@attrs.define(frozen=True)
class RetryUntilPresent(PaperProtocol):
    """Retries a missing chunk's GET until it appears: an evicted chunk never does (termination)."""

    name: ClassVar[str] = "retry-until-present"

    def fetch_own(self, rank, n_ranks, chunk_hashes, planned):
        fetched = {}
        for c in owned_chunks(self, rank, n_ranks, planned):
            value = None
            while value is None:
                value = yield Get(self.key(c, chunk_hashes[c], rank, n_ranks))
            fetched[c] = value
        return planned, fetched


@attrs.define(frozen=True)
class WrongAsyncKey(PaperProtocolAsync):
    """Async GET builds its key without the rank suffix the store path used (key-consistency): every async
    read misses, as in the paper's third client bug."""

    name: ClassVar[str] = "wrong-async-key"

    def fetch_own(self, rank, n_ranks, chunk_hashes, planned):
        mine = owned_chunks(self, rank, n_ranks, planned)
        handles = []
        for c in mine:
            handles.append((yield GetAsync(f"kv:{chunk_hashes[c]}:pcp{n_ranks}")))
        fetched = {}
        for c, handle in zip(mine, handles):
            value = yield Wait(handle, self.wait_timeout)
            if value is None or value is TIMED_OUT:
                return c, fetched
            fetched[c] = value
        return planned, fetched


@attrs.define(frozen=True)
class PositionKeys(PaperProtocol):
    """Keys name the chunk's position, not its prefix hash: in a tier shared by many prompts, another prompt's
    chunk at the same position counts as a hit and is loaded (isolation-lookup; cache poisoning)."""

    name: ClassVar[str] = "position-keys"

    def key(self, chunk, chunk_hash, rank, n_ranks):
        return f"kv:pos{chunk}:pcp{n_ranks}:r{rank}"


@attrs.define(frozen=True)
class PositionKeyedLoad(PaperProtocol):
    """Stores every chunk under its prefix hash and under its position; looks up by hash (right) but loads by
    position first (falling back to the hash), so a prompt stored later under the same positions is what gets
    loaded (isolation-load)."""

    name: ClassVar[str] = "position-keyed-load"

    def rank_store(self, rank, n_ranks, chunk_hashes, kv):
        for c in owned_chunks(self, rank, n_ranks, len(chunk_hashes)):
            yield Put(self.key(c, chunk_hashes[c], rank, n_ranks), kv[c])
            yield Put(f"kv:pos{c}:pcp{n_ranks}:r{rank}", kv[c])

    def fetch_own(self, rank, n_ranks, chunk_hashes, planned):
        fetched = {}
        for c in owned_chunks(self, rank, n_ranks, planned):
            value = yield Get(f"kv:pos{c}:pcp{n_ranks}:r{rank}")
            if value is None:
                value = yield Get(self.key(c, chunk_hashes[c], rank, n_ranks))
            if value is None:
                return c, fetched
            fetched[c] = value
        return planned, fetched


@attrs.define(frozen=True)
class PositionMarkedLookup(PositionKeyedLoad):
    """Loads by prefix hash (right) but its lookup first asks a position marker shared by every prompt ("is any
    chunk stored at this position?"): evicting another prompt's chunk drops the marker and this prompt's plan
    with it (isolation-eviction)."""

    name: ClassVar[str] = "position-marked-lookup"

    def fetch_own(self, rank, n_ranks, chunk_hashes, planned):
        return (yield from PaperProtocol.fetch_own(self, rank, n_ranks, chunk_hashes, planned))

    def rank_lookup(self, rank, n_ranks, chunk_hashes, contains):
        for c in owned_chunks(self, rank, n_ranks, len(chunk_hashes)):
            if not contains(f"kv:pos{c}:pcp{n_ranks}:r{rank}") or \
                    not contains(self.key(c, chunk_hashes[c], rank, n_ranks)):
                return c
        return len(chunk_hashes)


#: Every demo variant and the property it is built to violate (from `model.checks.CATALOG`).
DEMO_VARIANTS: dict[type, str] = {globals()[name]: p.name for p in CATALOG if p.layer == "protocol" for name in p.demos}
