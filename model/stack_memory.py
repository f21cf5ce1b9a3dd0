"""A serving stack in memory (`model.contract.ServingStack`): the behaviour every real stack is judged against, small
enough to read, and the fast target of the stack layer's own tests.

Each rank has a local tier and a server (dicts of chunk key -> KV). A request waits until the scheduler admits it
(blocks free), looks its prompt up (the minimum over ranks of each rank's leading held chunks, a down or paused
server holding nothing: the stack gives up on it and recomputes), takes that many tokens (never the last one) and
loads their KV in the same step, computes the rest and its output, saves every full chunk on every reachable rank,
and ends one scheduler step after it was admitted. A chunk's KV is a function of its tokens alone (as a model's is); its key also names the
tenant, so another tenant's KV never serves a request. The output is a function of the KV the request used: wrong KV
gives another output.
"""
from __future__ import annotations

import hashlib
from typing import Any, Sequence

from model.contract import StackRequest, StackResult
from model.faults import check_held

__all__ = ["MemoryStack", "memory_stack"]


def _digest(*parts: Any) -> str:
    return hashlib.blake2b(repr(parts).encode(), digest_size=8).hexdigest()


class MemoryStack:
    """See the module docstring."""

    connector = "memory"
    #: Its stores land before a request ends.
    store_lag = 0.0
    vocab = 1024

    def __init__(self, n_ranks: int = 1, *, chunk_size: int = 4, block_size: int = 4, blocks: int = 64,
                 lookup_timeout: float = 1.0) -> None:
        self.n_ranks, self.chunk_size, self.block_size = n_ranks, chunk_size, block_size
        self.lookup_timeout = lookup_timeout
        self.total_blocks = blocks
        self.local: list[dict[str, str]] = [{} for _ in range(n_ranks)]
        self.remote: list[dict[str, str]] = [{} for _ in range(n_ranks)]
        self.down: set[int] = set()
        self.paused: set[int] = set()
        self.waiting: list[tuple[StackRequest, bool]] = []
        #: id -> (request, reference, hit, KV loaded, blocks)
        self.running: dict[str, tuple[StackRequest, bool, int, list[str], int]] = {}
        self.pinned: dict[str, int] = {}

    # -- what a real stack computes ------------------------------------------------------------------------------------
    def chunk_keys(self, rank: int, request: StackRequest) -> list[str]:
        n = len(request.tokens) // self.chunk_size
        return [f"{_digest(request.tenant, request.tokens[:(c + 1) * self.chunk_size])}@{rank}" for c in range(n)]

    def _kv(self, request: StackRequest, chunk: int) -> str:
        return _digest("kv", request.tokens[:(chunk + 1) * self.chunk_size])

    def _held(self, rank: int, keys: Sequence[str]) -> int:
        if rank in self.down or rank in self.paused:
            return 0
        n = 0
        for k in keys:
            if k not in self.local[rank] and k not in self.remote[rank]:
                break
            n += 1
        return n

    def lookup(self, request: StackRequest) -> int:
        """Tokens held on every rank (never the last one)."""
        chunks = min(self._held(r, self.chunk_keys(r, request)) for r in range(self.n_ranks))
        return max(0, min(chunks * self.chunk_size, len(request.tokens) - 1))

    def load(self, request: StackRequest, hit: int) -> list[str]:
        """The KV of the `hit` tokens' chunks, as rank 0 holds it."""
        keys = self.chunk_keys(0, request)
        return [self.local[0].get(k) or self.remote[0].get(k, "") for k in keys[:hit // self.chunk_size]]

    def output(self, request: StackRequest, kv: list[str]) -> tuple[int, ...]:
        chunks = len(request.tokens) // self.chunk_size
        used = kv + [self._kv(request, c) for c in range(len(kv), chunks)]
        seed = _digest(tuple(used), request.tokens[chunks * self.chunk_size:])
        return tuple(2 + int(seed[2 * i:2 * i + 4], 16) % (self.vocab - 2) for i in range(request.max_tokens))

    # -- the contract ----------------------------------------------------------------------------------------------------
    def submit(self, request: StackRequest, *, reference: bool = False) -> None:
        self.waiting.append((request, reference))

    def step(self) -> list[StackResult]:
        done = [self._finish(rid) for rid in list(self.running)]
        for request, reference in list(self.waiting):
            need = -(-len(request.tokens) // self.block_size)
            if need > self.total_blocks - sum(b for *_, b in self.running.values()):
                break
            self.waiting.remove((request, reference))
            hit = 0 if reference else self.lookup(request)
            if hit:
                self.pinned[request.id] = hit // self.chunk_size
            self.running[request.id] = (request, reference, hit, self.load(request, hit), need)
        return done

    def _finish(self, rid: str) -> StackResult:
        request, reference, hit, kv, _ = self.running.pop(rid)
        self.pinned.pop(rid, None)
        if not reference:
            for r in range(self.n_ranks):
                if r in self.down or r in self.paused:
                    continue
                for c, key in enumerate(self.chunk_keys(r, request)):
                    self.local[r][key] = self.remote[r][key] = self._kv(request, c)
        return StackResult(id=rid, status="finished", output=self.output(request, kv),
                           top2=[(-0.1, -3.0)] * request.max_tokens, reported=None if reference else hit,
                           external=hit, seconds=0.001)

    def abort(self, request_id: str) -> None:
        self.waiting = [(q, ref) for q, ref in self.waiting if q.id != request_id]
        if self.running.pop(request_id, None) is not None:
            self.pinned.pop(request_id, None)

    def pending(self) -> list[str]:
        return [q.id for q, _ in self.waiting] + list(self.running)

    def holdings(self, rank: int, keys: Sequence[str]) -> tuple[list[bool], list[bool] | None]:
        local = [k in self.local[rank] for k in keys]
        remote = None if rank in self.down or rank in self.paused else [k in self.remote[rank] for k in keys]
        return local, remote

    def leaks(self) -> dict:
        used = sum(b for *_, b in self.running.values())
        return {"pins": [sum(self.pinned.values())] + [0] * (self.n_ranks - 1), "pinned": sorted(self.pinned),
                "free_blocks": self.total_blocks - used, "total_blocks": self.total_blocks}

    def evict(self, rank: int, key: str, tier: str) -> None:
        (self.local if tier == "local" else self.remote)[rank].pop(key, None)

    def fault(self, rank: int, action: str) -> None:
        if check_held(action) == "pause":
            self.paused.add(rank)
        elif action == "resume":
            self.paused.discard(rank)
            self.down.discard(rank)
        elif action == "kill":
            self.down.add(rank)
            self.remote[rank].clear()
        elif action == "restart":
            self.down.discard(rank)
            self.paused.discard(rank)
            self.remote[rank].clear()

    def reachable(self, rank: int) -> bool:
        return rank not in self.down and rank not in self.paused

    def reset(self) -> None:
        for tier in self.local + self.remote:
            tier.clear()
        self.down.clear()
        self.paused.clear()
        self.waiting.clear()
        self.running.clear()
        self.pinned.clear()

    def close(self) -> list[str]:
        self.reset()
        return []


def memory_stack(n_ranks: int = 1, *, connector: str = "memory", tp: int | None = None, **options: Any) -> MemoryStack:
    """The factory of `MemoryStack` (`--engine memory-stack`; its one connector is `memory`; `tp`: its ranks)."""
    if connector != "memory":
        raise ValueError(f"the memory stack has the one connector 'memory', not {connector!r}")
    return MemoryStack(tp or n_ranks, **options)
