"""Values and free text as short, safe, wrapped text for the timeline and the SVG."""
from __future__ import annotations

import base64
import binascii
import re
from typing import Any

__all__ = ["nbytes", "clip", "brief", "read_result", "as_num", "as_int", "as_ints", "plural", "safe", "wrap"]


def nbytes(v: Any) -> int | None:
    if isinstance(v, dict) and isinstance(v.get("$bytes"), str):
        try:
            return len(base64.b64decode(v["$bytes"], validate=True))
        except (binascii.Error, ValueError):
            return None
    if isinstance(v, (bytes, bytearray)):
        return len(v)
    return None


def clip(text: str, width: int) -> str:
    text = re.sub(r"[\r\n\t]+", " ", str(text))
    return text if len(text) <= width else text[: max(0, width - 2)] + ".."


def brief(v: Any, width: int = 40) -> str:
    """A short human form of an encoded value (bytes as sizes, chunk maps as chunk sets)."""
    n = nbytes(v)
    if n is not None:
        return f"{n}B"
    if v is None:
        return "None"
    if isinstance(v, dict):
        if v.get("$timed_out"):
            return "TIMED_OUT"
        if "$handle" in v and isinstance(v["$handle"], list) and len(v["$handle"]) == 3:
            return f"h{v['$handle'][1]}"
        if "$map" in v and isinstance(v["$map"], list):
            pairs = [p for p in v["$map"] if isinstance(p, list) and len(p) == 2]
            if all(isinstance(k, int) and nbytes(x) is not None for k, x in pairs):
                return clip("{" + ",".join(f"c{k}" for k, _ in pairs) + "}", width)
            return clip("{" + ", ".join(f"{brief(k, 12)}: {brief(x, 12)}" for k, x in pairs) + "}", width)
        if "$repr" in v:
            return clip(str(v["$repr"]), width)
        if not v:
            return "{}"
        return clip("{" + ", ".join(f"{k}: {brief(x, 12)}" for k, x in v.items()) + "}", width)
    if isinstance(v, list):
        return clip("[" + ", ".join(brief(x, 16) for x in v) + "]", width)
    return clip(repr(v) if isinstance(v, str) else str(v), width)


def read_result(v: Any) -> str:
    """The result of a read: `hit 23B`, `miss`, `TIMED_OUT`, or the value in brief."""
    n = nbytes(v)
    if n is not None:
        return f"hit {n}B"
    if v is None:
        return "miss"
    return brief(v, 24)


def as_num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def as_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def as_ints(v: Any) -> list[int]:
    return [x for x in v if as_int(x) is not None] if isinstance(v, (list, tuple)) else []


def plural(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def safe(text: str) -> str:
    return _CONTROL.sub("?", text)

def wrap(text: str, width: int) -> list[str]:
    """`text` in lines of at most `width` characters (continuation lines indented by 3)."""
    width = max(width, 8)
    words, lines, cur = [], [], ""
    for w in text.split(" "):  # a word too long for a line is cut into pieces
        words.extend(w[i:i + width - 4] for i in range(0, max(len(w), 1), width - 4))
    for w in words:
        if cur and len(cur) + 1 + len(w) > width:
            lines.append(cur)
            cur = "   " + w
        else:
            cur = f"{cur} {w}" if cur else w
    return lines + [cur] if cur else lines
