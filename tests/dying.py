"""Test-only protocols whose lookup ends the worker process that runs it (never the test process itself)."""
from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

from model.protocols import PaperProtocol


def _in_a_worker() -> bool:
    return multiprocessing.current_process().name.startswith("shardcheck-shard")


class DiesInWorkers(PaperProtocol):
    """Every worker process that looks up dies (exit 3): its shard keeps failing."""

    name = "dies-in-workers"

    def rank_lookup(self, rank, n_ranks, chunk_hashes, contains):
        if _in_a_worker():
            os._exit(3)
        return super().rank_lookup(rank, n_ranks, chunk_hashes, contains)


class DiesOnce(PaperProtocol):
    """The first worker process of shard 0 dies (a marker file in $SHARDCHECK_TEST_MARKERS): a retry succeeds."""

    name = "dies-once"

    def rank_lookup(self, rank, n_ranks, chunk_hashes, contains):
        marker = Path(os.environ["SHARDCHECK_TEST_MARKERS"]) / "died"
        if multiprocessing.current_process().name == "shardcheck-shard-0" and not marker.exists():
            marker.write_text("x")
            os._exit(3)
        return super().rank_lookup(rank, n_ranks, chunk_hashes, contains)


class DiesOutsideTheDriver(PaperProtocol):
    """Any process but the one named by $SHARDCHECK_TEST_DRIVER_PID dies (exit 3) when it looks up."""

    name = "dies-outside-the-driver"

    def rank_lookup(self, rank, n_ranks, chunk_hashes, contains):
        if str(os.getpid()) != os.environ.get("SHARDCHECK_TEST_DRIVER_PID"):
            os._exit(3)
        return super().rank_lookup(rank, n_ranks, chunk_hashes, contains)
