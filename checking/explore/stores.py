"""Interned store contents of one rank, and the initial configurations they start from.

A `Store` is one rank's store as the explorer sees it: `data` (key -> bytes), `present` (the store-phase
keys the harness can still evict), `init` (with the lazy initial state: the chunks whose unit (this rank,
chunk) was present at lookup, evicted later or not; empty otherwise, where the configuration says it, so
that configurations share rank-local states) and `undecided` (the chunks whose unit's presence at lookup nobody has observed yet;
see `checking.explore.lazy`; empty unless the initial state is lazy). Stores are interned: equal contents
are one object, so a rank-local state can be keyed by identity.
"""
from __future__ import annotations

from typing import Any

import attrs

from model.faults import Eviction

__all__ = ["Store", "Stores", "Config"]


class Store:
    """One rank's store: its data, the store-phase keys the harness can still evict (`present`; `chunks`: per chunk,
    those of its keys), and its units' state."""

    __slots__ = ("data", "present", "init", "undecided", "evict_memo", "put_memo", "decide_memo", "chunks")

    def __init__(self, data: dict, present: frozenset, init: frozenset, undecided: frozenset, chunks: dict) -> None:
        self.data, self.present, self.init, self.undecided, self.chunks = data, present, init, undecided, chunks
        self.evict_memo: dict = {}  # chunk -> this store after its eviction
        self.put_memo: dict = {}  # (key, value) -> this store after the Put
        self.decide_memo: dict = {}  # (chunk, present at lookup) -> this store once that unit is decided


class Stores:
    """The table of interned `Store`s, and their transitions (evict, put, decide), memoised per store."""

    def __init__(self) -> None:
        self.table: dict = {}

    def make(self, data: dict, present: frozenset, written: dict, init: frozenset = frozenset(),
             undecided: frozenset = frozenset()) -> Store:
        """The interned store with these contents."""
        key = (frozenset(data.items()), present, init, undecided)
        got = self.table.get(key)
        if got is None:
            chunks: dict = {}
            for k in present:
                chunks.setdefault(written[k], []).append(k)
            got = self.table[key] = Store(data, present, init, undecided, chunks)
        return got

    def evict(self, s: Store, chunk: int, written: dict) -> Store | None:
        """`s` after the harness evicts `chunk` (None when no evictable key of it is present)."""
        got = s.evict_memo.get(chunk)
        if got is None and chunk in s.chunks:
            keys = s.chunks[chunk]
            data = {k: v for k, v in s.data.items() if k not in keys}
            got = s.evict_memo[chunk] = self.make(data, s.present.difference(keys), written, s.init, s.undecided)
        return got

    def put(self, s: Store, key: str, value: Any, written: dict) -> Store:
        """`s` after a `Put(key, value)`."""
        got = s.put_memo.get((key, value))
        if got is None:
            data = dict(s.data)
            data[key] = bytes(value)
            got = s.put_memo[(key, value)] = self.make(data, s.present, written, s.init, s.undecided)
        return got

    def decide(self, s: Store, chunk: int, present: bool, unit: dict, written: dict) -> Store:
        """`s` once undecided unit `chunk` is decided: present at lookup (its store-phase keys and values
        `unit` are in the store) or not."""
        got = s.decide_memo.get((chunk, present))
        if got is None:
            if present:
                data = {**unit, **s.data}
                got = self.make(data, s.present.union(unit), written, s.init | {chunk}, s.undecided - {chunk})
            else:
                got = self.make(s.data, s.present, written, s.init, s.undecided - {chunk})
            s.decide_memo[(chunk, present)] = got
        return got


@attrs.frozen
class Config:
    """One initial configuration: the units known absent at lookup, what the lookup saw, and the lookup
    phase's violations (then there is no load). `cached`/`lcp` take every undecided unit as present,
    `lcp_min` as absent (equal unless the initial state is lazy)."""

    evicted: tuple[Eviction, ...]
    cached: frozenset
    lcp: int
    reports: list | None
    planned: Any
    stores: tuple
    violations: tuple = ()
    lcp_min: int | None = None
