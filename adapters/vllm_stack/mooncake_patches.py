"""`--engine-patch` functions for vLLM's `MooncakeStoreConnector` lookup (`adapters.vllm_stack.mooncake_lookup`).

`MooncakeStoreWorker.lookup` asks `batch_is_exist` for every rank namespace's key of every chunk and counts a chunk
present only when every namespace has it (store/worker.py, `MooncakeStoreWorker.lookup`: `all(res[pos + j] == 1 ...)`).
Each patch wraps `lookup` so that its store answers through a view of `batch_is_exist`'s results:

- `any_rank` (a demo, violates `engine-soundness`): a chunk counts when ANY rank's key exists: each chunk's run of
  namespace results is answered all 1 when one of them is 1;
- `every_rank` (a correct patch, holds): each chunk's run is answered all 1 only when every one is 1, else all 0: the
  same count as stock, spelled out.
"""
from __future__ import annotations

from typing import Any, Callable

__all__ = ["any_rank", "every_rank"]


class _Answering:
    """The worker's store, its `batch_is_exist` answered through `rule(run) -> run` per chunk (`count` results)."""

    def __init__(self, store: Any, count: int, rule: Callable[[list[int]], list[int]]) -> None:
        self._store, self._count, self._rule = store, count, rule

    def batch_is_exist(self, keys: list[str]) -> list[int]:
        res = list(self._store.batch_is_exist(keys))
        out: list[int] = []
        for i in range(0, len(res), self._count):
            out.extend(self._rule(res[i:i + self._count]))
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def _wrap(rule: Callable[[list[int]], list[int]], tag: str) -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.worker import MooncakeStoreWorker

    stock = MooncakeStoreWorker.lookup
    if getattr(stock, "_shardcheck_patch", None):
        stock = stock._shardcheck_stock  # type: ignore[attr-defined]  (one patch at a time, over stock)

    def lookup(self: Any, num_tokens: int, block_hashes: Any) -> Any:
        prefixes = getattr(self, "_lookup_key_prefixes", ((),))
        count = max(1, len(prefixes[0])) if prefixes else 1
        store = self.store
        self.store = _Answering(store, count, rule)
        try:
            return stock(self, num_tokens, block_hashes)
        finally:
            self.store = store

    lookup._shardcheck_patch = tag  # type: ignore[attr-defined]
    lookup._shardcheck_stock = stock  # type: ignore[attr-defined]
    MooncakeStoreWorker.lookup = lookup  # type: ignore[method-assign]


def any_rank() -> None:
    """The lookup counts a chunk present on ANY rank instead of every rank (a demo: `engine-soundness` fails)."""
    _wrap(lambda run: [1] * len(run) if any(r == 1 for r in run) else [0] * len(run), "any-rank")


def every_rank() -> None:
    """The lookup counts a chunk only when every rank holds it (the stock rule, spelled out: it holds)."""
    _wrap(lambda run: [1] * len(run) if all(r == 1 for r in run) else [0] * len(run), "every-rank")


def unpatch() -> None:
    """Stock `lookup` again (tests)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.worker import MooncakeStoreWorker

    current = MooncakeStoreWorker.lookup
    if getattr(current, "_shardcheck_patch", None):
        MooncakeStoreWorker.lookup = current._shardcheck_stock  # type: ignore[attr-defined,method-assign]
