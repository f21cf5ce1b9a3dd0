"""A concurrent case as data: a `Layout`, which caller thread issues which store-client ops, in order (run at once on
one store by `checking.concurrency`, judged linearizable or not)."""
from __future__ import annotations

from typing import Sequence

import attrs

__all__ = ["Layout"]


@attrs.define
class Layout:
    """Per caller thread, its ops in order: `{"path", "keys", "pad"?, "client"?}` (`pad`: extra value bytes of a put;
    `client`: which of several clients of one server makes the call). `seed`: the seed it was made from."""

    threads: list[list[dict]]
    seed: int = 0

    @property
    def n_ops(self) -> int:
        return sum(len(t) for t in self.threads)

    def to_ops(self) -> list[dict]:
        """Every op in thread order, each naming its `thread` (a trace's `ops`)."""
        return [{"thread": t, **op} for t, ops in enumerate(self.threads) for op in ops]

    @classmethod
    def from_ops(cls, ops: Sequence[dict], *, seed: int = 0) -> "Layout":
        """The layout of a trace's `ops` (threads left without ops are dropped)."""
        n = 1 + max((int(o["thread"]) for o in ops), default=-1)
        threads: list[list[dict]] = [[] for _ in range(n)]
        for o in ops:
            threads[int(o["thread"])].append({k: v for k, v in o.items() if k != "thread"})
        return cls([t for t in threads if t], seed)
