"""Short labels for the store keys of a trace, and the legend mapping each label back to its key.

Labels come from the keys the trace itself uses, whatever their format:

- A key holding the prefix hash of chunk I is labelled from `cI`. Its template is the key with the hash
  written `<hash of chunk I>` and, when keys of two or more ranks then differ only in the number of the rank
  using them, that number written `<rank>`. The template used first is `cI`, the next `cIa`, `cIb`, ...
- Any other key of at most 18 characters is shown as it is.
- A longer key is shown with each hash-like run cut to 4 characters (`tenantA|3f2a..`) when that is at most
  18 characters and names no other key, else as `k1`, `k2`, ... in order of first use.

Every label that is not its key is in the legend. The same trace always gets the same labels.
"""
from __future__ import annotations

import re
from typing import Any, Iterator

from model.harness import chunk_hashes
from model.trace import Trace
from shardcheck.show.text import as_int, brief

__all__ = ["Keys"]

_SHORT = 18          # keys this long or shorter are shown as they are
_MAX_CHUNKS = 4096   # chunk hashes computed at most (a hand-edited trace may claim any count)
_HEXRUN = re.compile(r"[0-9a-fA-F]{12,}")
_GENERATED = re.compile(r"[ck]\d+[a-z]*")


def _uses(trace: Trace) -> Iterator[tuple[str, int | None]]:
    """Every (key, rank using it) of the trace's events and ops, in order."""
    for item in list(trace.events) + list(trace.ops):
        if not isinstance(item, dict):
            continue
        rank = as_int(item.get("rank"))
        found: list[Any] = [item.get("key")] + (item["keys"] if isinstance(item.get("keys"), list) else [])
        for v in (item.get("effect"), item.get("result")):
            if isinstance(v, list) and len(v) == 2 and v[0] == "contains":
                found.append(v[1])
            if isinstance(v, dict):
                found.append(v.get("key"))
                handle = v.get("handle") if isinstance(v.get("handle"), dict) else v
                h = handle.get("$handle")
                if isinstance(h, list) and len(h) == 3:
                    found.append(h[2])
        yield from ((k, rank) for k in found if isinstance(k, str))


def _letters(i: int) -> str:
    """'' for 0, then a, b, ..., z, aa, ab, ..."""
    out = ""
    while i:
        i, d = divmod(i - 1, 26)
        out = "abcdefghijklmnopqrstuvwxyz"[d] + out
    return out


class Keys:
    """Call with (key, rank using it) for the key's label; `legend()` lists `label = key` entries."""

    def __init__(self, trace: Trace) -> None:
        cfg = trace.config if isinstance(trace.config, dict) else {}
        k, salt = cfg.get("n_chunks"), cfg.get("salt", "s0")
        known = chunk_hashes(k, salt) if isinstance(k, int) and 0 <= k <= _MAX_CHUNKS and isinstance(salt, str) else []
        self.chunks = {h: c for c, h in enumerate(known)}
        self.pattern = re.compile("|".join(map(re.escape, self.chunks))) if self.chunks else None
        uses = list(_uses(trace))
        chunked = [(raw, rank) for key, rank in uses if (raw := self._raw(key)) is not None]
        ranks_of: dict[str, set[int]] = {}
        for raw, rank in chunked:
            if rank is not None and self._ranked(raw, rank) != raw:
                ranks_of.setdefault(self._ranked(raw, rank), set()).add(rank)
        self.shared = {t for t, ranks in ranks_of.items() if len(ranks) > 1}
        used = dict.fromkeys(self._template(raw, rank) for raw, rank in chunked)
        self.templates = {t: _letters(i) for i, t in enumerate(used)}
        self.labels: dict[str, str] = {}
        plain = list(dict.fromkeys(key for key, _ in uses if self._raw(key) is None))
        taken = {f"c{c}{s}" for c in self.chunks.values() for s in self.templates.values()} | set(plain)
        n = 0
        for key in plain:
            label = key if len(key) <= _SHORT else _HEXRUN.sub(lambda m: m.group(0)[:4] + "..", key)
            if len(label) > _SHORT or _GENERATED.fullmatch(label) or (label != key and label in taken):
                n += 1
                while f"k{n}" in taken:
                    n += 1
                label = f"k{n}"
            self.labels[key] = label
            taken.add(label)

    def _raw(self, key: str) -> str | None:
        """The key with its chunk hash written `<hash of chunk I>`, or None if it holds none."""
        m = self.pattern.search(key) if self.pattern else None
        return key.replace(m.group(0), "<hash of chunk I>") if m else None

    @staticmethod
    def _ranked(raw: str, rank: int | None) -> str:
        """`raw` with its last standalone number equal to `rank` written `<rank>`."""
        found = list(re.finditer(rf"(?<!\d){rank}(?!\d)", raw)) if rank is not None else []
        return raw[:found[-1].start()] + "<rank>" + raw[found[-1].end():] if found else raw

    def _template(self, raw: str, rank: int | None) -> str:
        r = self._ranked(raw, rank)
        return r if r in self.shared else raw

    def __call__(self, key: Any, rank: int | None = None) -> str:
        if not isinstance(key, str):
            return brief(key, 20)
        raw = self._raw(key)
        if raw is None:
            return self.labels.get(key) or (key if len(key) <= _SHORT else key[:8] + ".." + key[-8:])
        m = self.pattern.search(key)
        t = self._template(raw, rank)
        suffix = self.templates.setdefault(t, _letters(len(self.templates)))  # a use the walk did not see
        return f"c{self.chunks[m.group(0)]}{suffix}"

    def legend(self, extra: tuple[str, ...] = (), width: int = 100) -> list[str]:
        """The `label = key` entries (templates first, then keys in order of first use, then `extra`) as lines
        of at most `width` characters: `; ` between entries, a line ending in `;` when the next line starts a
        new entry, an entry longer than a line cut into pieces."""
        entries = [f"cI{s} = {t}" for t, s in self.templates.items()]
        entries += [f"{label} = {key}" for key, label in self.labels.items() if label != key]
        lines: list[str] = []
        for entry in [*entries, *extra]:
            if lines and len(lines[-1]) + 2 + len(entry) <= width:
                lines[-1] += "; " + entry
                continue
            if lines:
                lines[-1] += ";"
            lines += [entry[i:i + width] for i in range(0, len(entry), width)]
        return lines
