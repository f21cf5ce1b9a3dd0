"""The effects a rank program yields, and the results it gets back (see CONTRACT.md)."""
from __future__ import annotations

from typing import Any

import attrs

__all__ = ["TIMED_OUT", "Put", "Get", "GetAsync", "Wait", "AllReduceMin", "AllGather", "Broadcast",
           "COLLECTIVES", "Effect", "Handle", "collective_signature"]


class _TimedOut:
    """The result of a `Wait` whose timeout passed before the completion arrived."""

    _instance: "_TimedOut | None" = None

    def __new__(cls) -> "_TimedOut":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "TIMED_OUT"

    def __reduce__(self) -> str:
        return "TIMED_OUT"


TIMED_OUT = _TimedOut()


@attrs.frozen
class Put:
    """Write `value` under `key` into this rank's own store; result `None`."""

    key: str
    value: bytes


@attrs.frozen
class Get:
    """Read `key` from this rank's own store; result `bytes` or `None` on a miss."""

    key: str


@attrs.frozen
class GetAsync:
    """Start reading `key` from this rank's own store; result an opaque handle for `Wait`."""

    key: str


@attrs.frozen
class Wait:
    """Wait for a `GetAsync` handle: `bytes`, `None` (miss) or `TIMED_OUT` after `timeout` logical seconds.

    `timeout=None` waits forever.
    """

    handle: Any
    timeout: float | None = None


@attrs.frozen
class AllReduceMin:
    """Collective: every rank gets the minimum of all ranks' `value`."""

    value: int


@attrs.frozen
class AllGather:
    """Collective: every rank gets a list, index = rank, of every rank's `value`."""

    value: Any


@attrs.frozen
class Broadcast:
    """Collective: every rank gets `root`'s `value`."""

    value: Any
    root: int


COLLECTIVES = (AllReduceMin, AllGather, Broadcast)
Effect = Put | Get | GetAsync | Wait | AllReduceMin | AllGather | Broadcast


@attrs.frozen
class Handle:
    """The handle of a `GetAsync`: which rank issued it, its sequence number and key."""

    rank: int
    seq: int
    key: str


def collective_signature(effect: Any) -> tuple[str, int | None]:
    """What must match across ranks for the k-th collective: its kind (and root for Broadcast)."""
    root = effect.root if isinstance(effect, Broadcast) else None
    return (type(effect).__name__, root)
