"""The verdict of `checking.linearizability.check` (a module of its own, never compiled: an attrs class)."""
from __future__ import annotations

import attrs

__all__ = ["Verdict"]


@attrs.define
class Verdict:
    """`linearizable`: True, False, or None when a bound stopped the search (undecided: `why` says which, and
    `undecided` lists the keys of every part left undecided). For a violation: the part's keys, the longest
    linearizable prefix found (op ids, in order) and the op that cannot be placed after it. `methods`: how
    many parts each path decided ("replay", "greedy", "register", "search")."""

    linearizable: bool | None
    steps: int = 0
    keys: tuple[str, ...] = ()
    prefix: list[int] = attrs.field(factory=list)
    unplaceable: int | None = None
    parts: int = 0
    why: str | None = None
    undecided: list[tuple[str, ...]] = attrs.field(factory=list)
    methods: dict[str, int] = attrs.field(factory=dict)

    def to_json(self) -> dict:
        return {"linearizable": self.linearizable, "steps": self.steps, "keys": list(self.keys),
                "prefix": list(self.prefix), "unplaceable": self.unplaceable, "parts": self.parts,
                "why": self.why, "undecided": [list(k) for k in self.undecided], "methods": dict(self.methods)}
