"""Short names for the store keys of a trace."""
from __future__ import annotations

import hashlib
import re
from typing import Any

from model.trace import Trace
from shardcheck.show.text import brief, clip

__all__ = ["Keys"]


class Keys:
    """Short names for store keys: `cI` for the standard key of chunk I (else the key with its hash cut)."""

    def __init__(self, trace: Trace) -> None:
        cfg = trace.config if isinstance(trace.config, dict) else {}
        self.n = cfg.get("n_ranks")
        self.hashes: dict[str, int] = {}
        k, salt = cfg.get("n_chunks"), cfg.get("salt", "s0")
        if isinstance(k, int) and 0 <= k <= 4096 and isinstance(salt, str):
            prev = salt
            for c in range(k):  # the harness's prefix-chain chunk hashes, to name keys by chunk
                prev = hashlib.sha256(f"{prev}|{c}".encode()).hexdigest()[:16]
                self.hashes[prev] = c
        self.pattern = re.compile("|".join(map(re.escape, self.hashes))) if self.hashes else None

    def __call__(self, key: Any, rank: int | None = None) -> str:
        if not isinstance(key, str):
            return brief(key, 20)
        m = self.pattern.search(key) if self.pattern else None
        if m is None:
            return key if len(key) <= 18 else key[:8] + ".." + key[-8:]
        c = self.hashes[m.group(0)]
        if rank is not None and key == f"kv:{m.group(0)}:pcp{self.n}:r{rank}":
            return f"c{c}"
        return f"c{c}[{clip(key.replace(m.group(0), '#'), 16)}]"  # a non-standard key: show its shape

    def chunk(self, key: Any) -> int | None:
        m = self.pattern.search(key) if self.pattern and isinstance(key, str) else None
        return self.hashes[m.group(0)] if m else None
