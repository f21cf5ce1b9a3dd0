"""The terminal timeline: a header, then one row per event and one column (lifeline) per rank."""
from __future__ import annotations

from model.trace import Trace
from shardcheck.show.picture import picture
from shardcheck.show.text import clip, plural, wrap

__all__ = ["timeline"]

_RED, _RESET = "\x1b[31m", "\x1b[0m"


def timeline(trace: Trace, *, width: int = 120, color: bool = False) -> str:
    """The trace as plain text: a header, then one row per event and one column (lifeline) per rank."""
    p = picture(trace)
    prefix = 18
    col = max(14, min(52, (width - prefix) // max(1, p.n)))
    red = (lambda s: f"{_RED}{s}{_RESET}") if color else (lambda s: s)
    out = [clip(f"== shardcheck trace: {p.title}", width)] + wrap(f"summary  {p.summary}", width)[:6]
    out += [clip(h, width) for h in p.header] + [""]
    out.append(f"{'phase':<6}{'step':>5}{'t':>6} " + "".join(f"| rank {r}".ljust(col) for r in range(p.n)))
    out.append("-" * min(width, prefix + col * p.n))
    gone: set[int] = set()  # lifelines that ended (hung)
    timed = any(row.time for row in p.rows)  # logical time only matters once a Wait or timeout advanced it
    last_phase = None

    def lifelines(cells: dict[int, str]) -> str:
        parts = []
        for r in range(p.n):
            if r in cells:
                cell = cells[r]
                if len(cell) > col - 1:  # narrow columns: the short form of an arrival, then cut visibly
                    cell = cell.replace("enter #", "> #")
                parts.append(clip(cell, col - 1).ljust(col))
            else:
                parts.append((" " if r in gone else "|").ljust(col))
        return "".join(parts).rstrip()

    for i, row in enumerate(p.rows):
        if row.phase != last_phase:
            out.append(f"-- {row.phase} " + "-" * max(0, min(width, prefix + col * p.n) - len(row.phase) - 4))
            last_phase = row.phase
        lookup = row.phase == "lookup"
        lead = f"{row.phase[:6]:<6}{'' if row.step is None or lookup else row.step:>5}" \
               f"{'' if row.time is None or lookup or not timed else format(row.time, 'g'):>6} "
        mark = [v for v in p.violations if v.row == i]
        if row.kind in ("collective", "combine") or (row.kind == "evict" and row.rank is None):
            span = row.ranks if row.kind == "evict" else tuple(range(p.n))
            text = row.text + (f" {row.result}" if row.result else "")
            if row.bad:
                text = f"!! {text} ({row.prop})"
            line = lead + _band(text, span, p.n, col, "=" if row.kind != "evict" else "~", gone)
        else:
            text = row.text + (f" -> {row.result}" if row.result else "")
            if row.hung:
                text = f"X {row.text}: {row.result}"
            if row.bad:
                text = f"!! {text}" + (f" <- {row.bad}" if not row.hung else "")
            line = lead + lifelines({row.rank: "|" + (" " if not row.bad and not row.hung else "") + text}
                                    if row.rank is not None else {})
            if row.hung and row.rank is not None:
                gone.add(row.rank)
        out.append(red(line) if row.bad else line)
        for v in mark:
            out.extend(red(" " * prefix + line) for line in wrap(v.text, width - prefix))
    out.append("-- end " + "-" * max(0, min(width, prefix + col * p.n) - 7))
    cells = {r: ("X " if p.status[r] == "HUNG" else "# " if r in p.bad_status else "o ") + p.status[r]
             for r in range(p.n)}
    end = f"{'end':<6}{'':>5}{'':>6} " + lifelines(cells)
    out.append(red(end) if p.bad_status else end)
    for v in p.violations:
        if v.waits_for:
            for r, qs in sorted(v.waits_for.items()):
                out.append(red(" " * prefix + f"wait-for: rank {r} --waits for--> {plural(qs)} "
                               f"({', '.join(p.status.get(q, '?') for q in qs)})"))
    if p.violations:
        out.append("")
        out.extend(red(line) for v in p.violations for line in wrap(v.text, width))
    else:
        out.append("")
        out.append("verdict: every property held")
    return "\n".join(out) + "\n"


def _band(text: str, span: tuple[int, ...], n: int, col: int, fill: str, gone: set[int]) -> str:
    """A row drawn across the columns of `span` (the others keep their lifeline)."""
    if not span:
        span = tuple(range(n))
    lo, hi = min(span), max(span)
    width = (hi - lo + 1) * col - 1
    inner = f" {text} "
    if len(inner) > width - 2:
        inner = " " + clip(text, max(1, width - 4)) + " "
    left = (width - 2 - len(inner)) // 2
    band = "+" + fill * left + inner + fill * (width - 2 - len(inner) - left) + "+"
    before = "".join((" " if r in gone else "|").ljust(col) for r in range(lo))
    after = "".join((" " if r in gone else "|").ljust(col) for r in range(hi + 1, n))
    return (before + band + " " + after).rstrip()
