"""Values of a run as JSON: `encode` / `decode` (bytes, handles, effects, int-keyed maps...), and `TraceError`,
the one error of a file that cannot be used (it names the file and the field)."""
from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import attrs

from model import effects
from model.faults import Eviction

__all__ = ["TraceError", "encode", "decode", "preview"]


class TraceError(Exception):
    """A trace file that cannot be used: names the file and the field."""

    def __init__(self, path: str | Path | None, field: str, message: str) -> None:
        self.path, self.field = str(path) if path else "<trace>", field
        super().__init__(f"{self.path}: field '{field}': {message}")


def preview(value: Any, width: int = 8) -> str:
    """A value in a message, short: bytes as their length and first `width` bytes, a list item by item, anything
    else as its repr."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        b = bytes(value)
        return f"{len(b)} bytes {b[:width]!r}{'...' if len(b) > width else ''}"
    if isinstance(value, list):
        return "[" + ", ".join(preview(v, width) for v in value) + "]"
    return repr(value)


_EFFECTS = {cls.__name__: cls for cls in (effects.Put, effects.Get, effects.GetAsync, effects.Wait,
                                          effects.AllReduceMin, effects.AllGather, effects.Broadcast)}


def encode(value: Any) -> Any:
    """A JSON-able form of a value that occurs in a run (bytes, handles, effects, int-keyed maps...)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray)):
        return {"$bytes": base64.b64encode(bytes(value)).decode()}
    if value is effects.TIMED_OUT:
        return {"$timed_out": True}
    if isinstance(value, effects.Handle):
        return {"$handle": [value.rank, value.seq, value.key]}
    if type(value).__name__ in _EFFECTS and attrs.has(type(value)):
        return {"$effect": type(value).__name__, **{k: encode(v) for k, v in attrs.asdict(value, recurse=False).items()}}
    if isinstance(value, Eviction):
        return {"$evict": attrs.asdict(value)}
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in value):
            return {k: encode(v) for k, v in value.items()}
        return {"$map": [[encode(k), encode(v)] for k, v in value.items()]}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [encode(v) for v in value]
    return {"$repr": repr(value)}


def decode(value: Any, field: str = "value", path: Any = None) -> Any:
    """The inverse of `encode`."""
    if isinstance(value, list):
        return [decode(v, f"{field}[{i}]", path) for i, v in enumerate(value)]
    if not isinstance(value, dict):
        return value
    try:
        if "$bytes" in value:
            return base64.b64decode(value["$bytes"], validate=True)
        if "$timed_out" in value:
            return effects.TIMED_OUT
        if "$handle" in value:
            r, s, k = value["$handle"]
            return effects.Handle(int(r), int(s), str(k))
        if "$effect" in value:
            cls = _EFFECTS[value["$effect"]]
            return cls(**{k: decode(v, f"{field}.{k}", path) for k, v in value.items() if k != "$effect"})
        if "$evict" in value:
            return Eviction(**value["$evict"])
        if "$map" in value:
            return {_hashable(decode(k, field, path)): decode(v, field, path) for k, v in value["$map"]}
        if "$repr" in value:
            return value["$repr"]
    except (KeyError, TypeError, ValueError) as exc:
        raise TraceError(path, field, f"cannot decode {json.dumps(value)[:80]}: {exc}") from None
    return {k: decode(v, f"{field}.{k}", path) for k, v in value.items()}


def _hashable(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v
