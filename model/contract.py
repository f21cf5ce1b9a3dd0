"""The public plug-in contract: `ShardingProtocol` and `RankStore` (see CONTRACT.md)."""
from __future__ import annotations

import concurrent.futures
import typing
from typing import Any, Callable, Generator, Mapping, Sequence

from model.effects import Effect

__all__ = ["ShardingProtocol", "RankStore", "PROTOCOL_METHODS", "STORE_METHODS",
           "StoreCallTimeout", "missing_members", "declared_paths", "DEFAULT_PATHS"]


@typing.runtime_checkable
class ShardingProtocol(typing.Protocol):
    """A sharding protocol: ownership, keys, and the per-rank store, lookup and load programs."""

    name: str

    def owner(self, chunk: int, n_ranks: int) -> int: ...

    def key(self, chunk: int, chunk_hash: str, rank: int, n_ranks: int) -> str: ...

    def rank_store(self, rank: int, n_ranks: int, chunk_hashes: Sequence[str],
                   kv: Sequence[bytes]) -> Generator[Effect, Any, None]: ...

    def rank_lookup(self, rank: int, n_ranks: int, chunk_hashes: Sequence[str],
                    contains: Callable[[str], bool]) -> int: ...

    def combine(self, reports: Sequence[int], n_chunks: int) -> int: ...

    def rank_load(self, rank: int, n_ranks: int, chunk_hashes: Sequence[str],
                  planned: int) -> Generator[Effect, Any, Mapping[int, bytes]]: ...


@typing.runtime_checkable
class RankStore(typing.Protocol):
    """One rank's remote store client.

    Optional members shardcheck uses when present: `paths` (CONTRACT.md: every public read/lookup operation,
    sync, async and batch, e.g. `("get", "get_async", "get_batch", "contains_batch")`; every store layer
    drives each, see `declared_paths`), `thread_safe` (False: reported, not driven concurrently; default True),
    `retention` (seconds the client keeps a value nobody deleted), `get_batch(keys)`, and `max_value_bytes`
    (the largest value the client stores; the properties keep values within it).
    """

    def put(self, key: str, value: bytes) -> None: ...

    def get(self, key: str) -> bytes | None: ...

    def contains(self, key: str) -> bool: ...

    def delete(self, key: str) -> None: ...

    def get_async(self, key: str) -> concurrent.futures.Future: ...

    def close(self) -> None: ...


PROTOCOL_METHODS = ("owner", "key", "rank_store", "rank_lookup", "combine", "rank_load")
STORE_METHODS = ("put", "get", "contains", "delete", "get_async", "close")


class StoreCallTimeout(Exception):
    """A bounded store client call did not return within `seconds`: the outcome 'hang'."""

    def __init__(self, op: str, key: str, seconds: float) -> None:
        super().__init__(f"store call {op}({key!r}) did not return within {seconds:g} s")
        self.op = op
        self.key = key
        self.seconds = seconds


#: The paths of a client that declares none: the contract's own reads.
DEFAULT_PATHS = ("get", "get_async", "contains")


def declared_paths(store: Any) -> tuple[str, ...]:
    """Every read/lookup path a store (or its class) declares in `paths` (CONTRACT.md), with `contains` (a
    contract method) always included; `DEFAULT_PATHS` when it declares none. `read_paths`, the older name,
    is still read from a user's client that has no `paths` (docs/CONTRACT.md says so); shardcheck's own
    clients declare `paths` only."""
    declared = getattr(store, "paths", None)
    if declared is None:
        declared = getattr(store, "read_paths", None)
    out = tuple(dict.fromkeys(declared or DEFAULT_PATHS))
    return out if "contains" in out else out + ("contains",)


def missing_members(obj: Any, names: Sequence[str]) -> list[str]:
    """The names of `names` that `obj` lacks or has as non-callables (except `name`)."""
    return [n for n in names if not callable(getattr(obj, n, None))]
