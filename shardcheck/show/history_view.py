"""A concurrent trace's history drawn Porcupine-style: one lane per caller, each op an interval from its invocation
to its completion, an op that never completed running off the end, and for a linearizability violation the longest
linearizable prefix (ops marked `+`) and the op that cannot be placed (`X`).

The lanes come from the trace's `verdict.picture` (`model.history.lanes`), or are rebuilt from `verdict.history`.
"""
from __future__ import annotations

import copy
from typing import Any

from model.history import Op
from model.trace import Trace
from shardcheck.show.text import clip, safe
from shardcheck.show.diagram import _t

__all__ = ["history_lanes", "history_timeline", "history_svg"]


def history_lanes(trace: Trace) -> dict:
    """The picture data of a concurrent trace: {"lanes": [{"caller", "ops": [{op, label, outcome, start, end,
    pending}]}], "pending": [...], "linearizable_prefix"?, "unplaceable"?}. An op's `outcome` (what its caller
    got) comes from the picture, else from the recorded history."""
    verdict = trace.verdict if isinstance(trace.verdict, dict) else {}
    history = [op for op in verdict.get("history") or [] if isinstance(op, dict)]
    outcomes = {}
    for raw in history:
        try:
            op = Op.from_json(raw)
        except (KeyError, TypeError, ValueError):
            continue
        outcomes[op.id] = op.outcome()
    picture = verdict.get("picture")
    if isinstance(picture, dict) and isinstance(picture.get("lanes"), list):
        picture = copy.deepcopy(picture)  # (the trace's own record stays as it was)
        for lane in picture["lanes"]:
            for op in lane.get("ops", []) if isinstance(lane, dict) else []:
                if isinstance(op, dict) and "outcome" not in op:
                    op["outcome"] = outcomes.get(op.get("op"), "")
        return picture
    t0 = min((op.get("invoked", 0.0) for op in history), default=0.0)
    lanes: dict[str, list[dict]] = {}
    for op in sorted(history, key=lambda o: o.get("invoked", 0.0)):
        end = op.get("completed")
        lanes.setdefault(str(op.get("caller")), []).append({
            "op": op.get("id"), "label": f"op {op.get('id')} {op.get('caller')}: {op.get('path')}({','.join(op.get('keys') or [])})",
            "outcome": outcomes.get(op.get("id"), ""),
            "start": op.get("invoked", 0.0) - t0, "end": None if end is None else end - t0, "pending": end is None,
            "error": op.get("error")})
    out: dict[str, Any] = {"lanes": [{"caller": c, "ops": ops} for c, ops in sorted(lanes.items())],
                           "pending": [o["op"] for ops in lanes.values() for o in ops if o["pending"]]}
    lin = verdict.get("linearizability") or {}
    if lin.get("linearizable") is False:
        out["linearizable_prefix"], out["unplaceable"] = list(lin.get("prefix") or []), lin.get("unplaceable")
    return out


def _text(op: dict) -> str:
    """An op's label and what its caller got: `op 3 t1: get(k0) -> 21 bytes 'k0|t0.0|v'`."""
    return f"{op.get('label', '')} {op.get('outcome') or ''}".strip()


def _span(pic: dict) -> float:
    ends = [o["end"] if o["end"] is not None else o["start"] for lane in pic["lanes"] for o in lane["ops"]]
    return max(ends, default=0.0) or 1.0


def _mark(pic: dict, op: dict) -> str:
    if op["pending"]:
        return "!"
    if op["op"] == pic.get("unplaceable"):
        return "X"
    return "+" if op["op"] in set(pic.get("linearizable_prefix") or ()) else "="


def history_timeline(trace: Trace, *, width: int = 100) -> str:
    """The terminal picture: a header, one row per op (lane, interval bar on a shared time axis, label)."""
    pic = history_lanes(trace)
    span = _span(pic) * 1.05
    bar = max(20, width - 60)
    lines = [f"== shardcheck trace: {safe(trace.client)}: {trace.property or 'no violation'} (concurrent history)",
             f"summary  {clip(safe(trace.summary), width)}"]
    rate = trace.config.get("rate") if isinstance(trace.config, dict) else None
    if isinstance(rate, dict):
        lines.append(f"rate     shown in {rate.get('k')} of {rate.get('n')} runs (seeds {rate.get('seeds')})")
    lines.append(f"{'lane':<6} {'time (0 .. ' + format(span * 1e3, '.1f') + ' ms)':<{bar}}  op")
    for lane in pic["lanes"]:
        for op in lane["ops"]:
            a = int(op["start"] / span * bar)
            b = bar if op["end"] is None else max(a + 1, int(op["end"] / span * bar))
            mark = _mark(pic, op)
            cells = " " * a + (mark * (b - a) if not op["pending"] else "=" * (b - a - 1) + ">")
            note = "  <-- never completed" if op["pending"] else "  <-- cannot be placed" if mark == "X" else ""
            lines.append(f"{safe(lane['caller']):<6} {cells:<{bar}}  {clip(safe(_text(op)), 72)}{note}")
    if pic.get("linearizable_prefix") is not None and "unplaceable" in pic:
        lines.append(f"linearizable prefix (+): ops {pic['linearizable_prefix']}; op {pic['unplaceable']} (X) "
                     "cannot be placed after it")
    for v in (trace.verdict or {}).get("violations", []) if isinstance(trace.verdict, dict) else []:
        if isinstance(v, dict):
            lines.append(f"!! {v.get('property')}: {clip(safe(str(v.get('summary'))), width)}")
    return "\n".join(lines) + "\n"


def history_svg(trace: Trace) -> str:
    """The SVG picture: a band per caller, a row per op in it with a rectangle over the op's interval (red and
    running off the end: never completed; green: in the linearizable prefix; red outline: cannot be placed)
    labelled with its call and what its caller got."""
    pic = history_lanes(trace)
    span = _span(pic) * 1.05
    left, plot, row_h, top = 70, 760, 18, 40
    rows = [(lane, op) for lane in pic["lanes"] for op in lane["ops"]]
    height = top + row_h * max(1, len(rows)) + 40
    out = [f'<text x="10" y="20">{_t(trace.client)}: {_t(trace.property or "no violation")} (concurrent history)</text>']
    previous, right = None, left + plot + 20.0
    for i, (lane, op) in enumerate(rows):
        y = top + i * row_h
        if lane is not previous:  # a new caller's band: its name and a separator
            out.append(f'<line x1="10" y1="{y}" x2="{left + plot}" y2="{y}" stroke="#bbb"/>')
            out.append(f'<text x="10" y="{y + 13}">{_t(lane["caller"])}</text>')
            previous = lane
        x0 = left + op["start"] / span * plot
        x1 = left + plot if op["end"] is None else max(x0 + 2, left + op["end"] / span * plot)
        mark = _mark(pic, op)
        fill = {"!": "#f4cccc", "X": "#fff", "+": "#d9ead3", "=": "#dde"}[mark]
        stroke = "#c00" if mark in ("!", "X") else "#555"
        dash = ' stroke-dasharray="4 2"' if op["pending"] else ""
        text = _text(op)
        out.append(f'<rect class="op{" pending" if op["pending"] else ""}{" unplaceable" if mark == "X" else ""}" '
                   f'x="{x0:.1f}" y="{y + 3}" width="{x1 - x0:.1f}" height="{row_h - 5}" fill="{fill}" '
                   f'stroke="{stroke}"{dash}><title>{_t(text)}</title></rect>')
        out.append(f'<text class="label" x="{x1 + 4:.1f}" y="{y + 13}">{_t(text)}</text>')
        right = max(right, x1 + 4 + 6.6 * len(text) + 10)  # 11 px monospace: about 6.6 px a character
    out.append(f'<text x="{left}" y="{height - 12}">0 .. {span * 1e3:.1f} ms; red dashed: never completed; '
               'green: linearizable prefix; red outline: cannot be placed</text>')
    out.append("</svg>")
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{right:.0f}" height="{height}" font-family="monospace" '
            'font-size="11">')
    return "\n".join([head, *out]) + "\n"
