"""Reference sharding protocols, each embodying one claim of the paper."""
from __future__ import annotations

from typing import Any, Callable, ClassVar, Generator, Mapping, Sequence

import attrs

from model.effects import AllGather, AllReduceMin, Broadcast, Effect, Get, GetAsync, Put, TIMED_OUT, Wait

__all__ = ["DEFAULT_WAIT_TIMEOUT", "owned_chunks", "PaperProtocol", "assemble", "PaperProtocolAsync",
           "Rank0SingleWriter", "REFERENCE_PROTOCOLS"]

#: Logical seconds the async flavour waits for one completion before treating the chunk as failed.
DEFAULT_WAIT_TIMEOUT = 1.0


def owned_chunks(protocol: Any, rank: int, n_ranks: int, n_chunks: int) -> list[int]:
    """The chunks in `range(n_chunks)` that `protocol` assigns to `rank`, ascending."""
    return [c for c in range(n_chunks) if protocol.owner(c, n_ranks) == rank]


@attrs.define(frozen=True)
class PaperProtocol:
    """The paper's rank-sharded protocol, synchronous flavour.

    Claims: chunk c is owned by rank c mod N; a rank reports the global index of its first missing owned
    chunk (the chunk count when none is missing, also when it owns no chunk), and the scheduler's minimum
    over ranks is the longest cached prefix. Load: each rank fetches its own chunks below `planned`,
    `AllReduceMin` agrees on the first failure, one `AllGather` exchanges the agreed prefix; every rank
    issues the same two collectives whatever fails, so collectives never desynchronize.
    """

    name: ClassVar[str] = "paper"

    def owner(self, chunk: int, n_ranks: int) -> int:
        return chunk % n_ranks

    def key(self, chunk: int, chunk_hash: str, rank: int, n_ranks: int) -> str:
        return f"kv:{chunk_hash}:pcp{n_ranks}:r{rank}"

    def rank_store(self, rank: int, n_ranks: int, chunk_hashes: Sequence[str],
                   kv: Sequence[bytes]) -> Generator[Effect, Any, None]:
        for c in owned_chunks(self, rank, n_ranks, len(chunk_hashes)):
            yield Put(self.key(c, chunk_hashes[c], rank, n_ranks), kv[c])

    def rank_lookup(self, rank: int, n_ranks: int, chunk_hashes: Sequence[str],
                    contains: Callable[[str], bool]) -> int:
        for c in owned_chunks(self, rank, n_ranks, len(chunk_hashes)):
            if not contains(self.key(c, chunk_hashes[c], rank, n_ranks)):
                return c
        return len(chunk_hashes)

    def combine(self, reports: Sequence[int], n_chunks: int) -> int:
        return min(reports, default=n_chunks)

    def fetch_own(self, rank: int, n_ranks: int, chunk_hashes: Sequence[str],
                  planned: int) -> Generator[Effect, Any, tuple[int, dict[int, bytes]]]:
        """Fetch own chunks below `planned` until the first miss: (first failed chunk or planned, fetched)."""
        fetched: dict[int, bytes] = {}
        for c in owned_chunks(self, rank, n_ranks, planned):
            value = yield Get(self.key(c, chunk_hashes[c], rank, n_ranks))
            if value is None:
                return c, fetched
            fetched[c] = value
        return planned, fetched

    def rank_load(self, rank: int, n_ranks: int, chunk_hashes: Sequence[str],
                  planned: int) -> Generator[Effect, Any, Mapping[int, bytes]]:
        first_failed, fetched = yield from self.fetch_own(rank, n_ranks, chunk_hashes, planned)
        usable = yield AllReduceMin(first_failed)
        shares = yield AllGather({c: v for c, v in fetched.items() if c < usable})
        return assemble(shares, usable)


def assemble(shares: Sequence[Mapping[int, bytes]], usable: int) -> dict[int, bytes]:
    """Merge every rank's gathered share, keeping chunks below `usable`."""
    merged: dict[int, bytes] = {}
    for share in shares:
        merged.update((c, v) for c, v in share.items() if c < usable)
    return merged


@attrs.define(frozen=True)
class PaperProtocolAsync(PaperProtocol):
    """The paper's protocol with asynchronous loading: every own fetch is started with `GetAsync`, then
    each completion is awaited with a bounded `Wait`; a timeout counts as a failed chunk, so a lost
    completion shortens the usable prefix instead of stalling the rank (the paper's fix (iii)+(iv))."""

    name: ClassVar[str] = "paper-async"
    wait_timeout: float = DEFAULT_WAIT_TIMEOUT

    def fetch_own(self, rank: int, n_ranks: int, chunk_hashes: Sequence[str],
                  planned: int) -> Generator[Effect, Any, tuple[int, dict[int, bytes]]]:
        mine = owned_chunks(self, rank, n_ranks, planned)
        handles = []
        for c in mine:
            handles.append((yield GetAsync(self.key(c, chunk_hashes[c], rank, n_ranks))))
        fetched: dict[int, bytes] = {}
        for c, handle in zip(mine, handles):
            value = yield Wait(handle, self.wait_timeout)
            if value is None or value is TIMED_OUT:
                return c, fetched
            fetched[c] = value
        return planned, fetched


@attrs.define(frozen=True)
class Rank0SingleWriter:
    """The pre-fix baseline: rank 0 stores and serves every chunk, then `Broadcast`s the prefix it got.

    Correct (every property holds) but all remote traffic goes through one server: the bottleneck the
    paper measured (one shared Valkey, 0.78-0.89 GB/s against 2.53 GB/s needed).
    """

    name: ClassVar[str] = "rank0-single-writer"

    def owner(self, chunk: int, n_ranks: int) -> int:
        return 0

    def key(self, chunk: int, chunk_hash: str, rank: int, n_ranks: int) -> str:
        return f"kv:{chunk_hash}"

    def rank_store(self, rank: int, n_ranks: int, chunk_hashes: Sequence[str],
                   kv: Sequence[bytes]) -> Generator[Effect, Any, None]:
        if rank == 0:
            for c, h in enumerate(chunk_hashes):
                yield Put(self.key(c, h, 0, n_ranks), kv[c])

    def rank_lookup(self, rank: int, n_ranks: int, chunk_hashes: Sequence[str],
                    contains: Callable[[str], bool]) -> int:
        if rank == 0:
            for c, h in enumerate(chunk_hashes):
                if not contains(self.key(c, h, 0, n_ranks)):
                    return c
        return len(chunk_hashes)

    def combine(self, reports: Sequence[int], n_chunks: int) -> int:
        return min(reports, default=n_chunks)

    def rank_load(self, rank: int, n_ranks: int, chunk_hashes: Sequence[str],
                  planned: int) -> Generator[Effect, Any, Mapping[int, bytes]]:
        fetched: dict[int, bytes] = {}
        if rank == 0:
            for c in range(planned):
                value = yield Get(self.key(c, chunk_hashes[c], 0, n_ranks))
                if value is None:
                    break
                fetched[c] = value
        return dict((yield Broadcast(fetched, root=0)))


REFERENCE_PROTOCOLS = {
    "paper": PaperProtocol,
    "paper-async": PaperProtocolAsync,
    "rank0-single-writer": Rank0SingleWriter,
}
