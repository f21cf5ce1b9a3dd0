"""One breadth-first level of the search: the states first reached at one depth -> their BFS parent."""
from __future__ import annotations

from itertools import chain
from typing import Iterator

__all__ = ["Level"]


class Level:
    """The states first reached at one depth -> their BFS parent, held as the dicts the level was built from (one
    per configuration, in order: `checking.explore.bfs`), never merged into one: merging them into one dict cost a
    tenth of the search's time (a big dict's cache misses). Read like a dict: `in`, `[]`, iteration in order,
    `len`."""

    __slots__ = ("parts", "size")

    def __init__(self) -> None:
        self.parts: list[dict[int, int | None]] = []
        self.size = 0

    def add(self, part: dict[int, int | None]) -> None:
        """Append a finished part (its states reached at this depth for no earlier part; not changed after)."""
        self.parts.append(part)
        self.size += len(part)

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[int]:
        return chain.from_iterable(self.parts)

    def __contains__(self, state: int) -> bool:
        return any(state in part for part in self.parts)

    def __getitem__(self, state: int) -> int | None:
        for part in self.parts:
            if state in part:
                return part[state]
        raise KeyError(state)
