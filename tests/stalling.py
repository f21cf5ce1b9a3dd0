"""Protocols whose code blocks (for tests of `runtime.watchdog`): `MOD:ATTR` targets as `tests.stalling:NAME`."""
from __future__ import annotations

import threading
import time
from typing import Any

from model.protocols import PaperProtocol


class SleepyLookup(PaperProtocol):
    """Rank 1's lookup sleeps for an hour once the prompt has two chunks."""

    name = "sleepy-lookup"

    def rank_lookup(self, rank: int, n_ranks: int, chunk_hashes: Any, contains: Any) -> int:
        if rank == 1 and len(chunk_hashes) >= 2:
            time.sleep(3600)
        return super().rank_lookup(rank, n_ranks, chunk_hashes, contains)


class LockedLoad(PaperProtocol):
    """Every rank's load waits forever on an event nobody sets once three chunks are planned."""

    name = "locked-load"

    def rank_load(self, rank: int, n_ranks: int, chunk_hashes: Any, planned: int) -> Any:
        if planned >= 3:
            threading.Event().wait()
        return (yield from super().rank_load(rank, n_ranks, chunk_hashes, planned))


class SwallowingLookup(PaperProtocol):
    """A lookup that retries a sleep forever and catches every `Exception` on the way."""

    name = "swallowing-lookup"

    def rank_lookup(self, rank: int, n_ranks: int, chunk_hashes: Any, contains: Any) -> int:
        while True:
            try:
                time.sleep(3600)
            except Exception:  # noqa: BLE001 - the point: a stall must not be an Exception
                pass


class PollingLookup(PaperProtocol):
    """A lookup that polls its store for a key nobody writes, forever."""

    name = "polling-lookup"

    def rank_lookup(self, rank: int, n_ranks: int, chunk_hashes: Any, contains: Any) -> int:
        while not contains("never-written"):
            pass
        return 0


class SlowSteps(PaperProtocol):
    """A load whose steps each take 0.15 s: slow, but every step returns."""

    name = "slow-steps"

    def rank_load(self, rank: int, n_ranks: int, chunk_hashes: Any, planned: int) -> Any:
        program = super().rank_load(rank, n_ranks, chunk_hashes, planned)
        result = None
        try:
            while True:
                time.sleep(0.15)
                effect = program.send(result)
                result = yield effect
        except StopIteration as stop:
            return stop.value


class KeyLoopLookup(PaperProtocol):
    """A lookup that loops forever through another method of the contract (`key`)."""

    name = "key-loop-lookup"

    def rank_lookup(self, rank: int, n_ranks: int, chunk_hashes: Any, contains: Any) -> int:
        while True:
            self.key(0, chunk_hashes[0] if chunk_hashes else "h", rank, n_ranks)


class CatchOnceLookup(PaperProtocol):
    """A lookup that catches the interruption of its endless sleep (a bare except) and reports 0."""

    name = "catch-once-lookup"

    def rank_lookup(self, rank: int, n_ranks: int, chunk_hashes: Any, contains: Any) -> int:
        try:
            time.sleep(3600)
        except BaseException:  # noqa: BLE001 - the point: a bare except around a blocking call
            pass
        return 0


class SleepsByLength(PaperProtocol):
    """A lookup through a helper: sleeps forever from two chunks on (one line), 0.3 s below that (another)."""

    name = "sleeps-by-length"

    def rank_lookup(self, rank: int, n_ranks: int, chunk_hashes: Any, contains: Any) -> int:
        return self._impl(rank, n_ranks, chunk_hashes, contains)

    def _impl(self, rank: int, n_ranks: int, chunk_hashes: Any, contains: Any) -> int:
        if len(chunk_hashes) >= 2:
            time.sleep(3600)
        time.sleep(0.3)
        return super().rank_lookup(rank, n_ranks, chunk_hashes, contains)
