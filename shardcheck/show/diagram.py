"""The SVG sequence diagram: a lifeline per rank and per store, ops as arrows, violations in red."""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

from model.trace import Trace
from shardcheck.show.picture import Picture, picture
from shardcheck.show.text import clip, wrap

__all__ = ["svg"]

_BAD_CHARS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
RED, INK, GREY, BLUE, ORANGE = "#c62828", "#222", "#999", "#1565c0", "#ef6c00"
_COL, _LEFT, _STORE_DX = 360, 120, 190
_CH = 6.7  # the width of one character of the 11px monospace font


def _t(text: Any) -> str:
    return _BAD_CHARS.sub("?", str(text))


class _Svg:
    def __init__(self) -> None:
        self.root = ET.Element("svg", xmlns="http://www.w3.org/2000/svg", version="1.1")
        defs = ET.SubElement(self.root, "defs")
        for name, colour in (("arrow", INK), ("arrow-red", RED), ("arrow-blue", BLUE)):
            m = ET.SubElement(defs, "marker", id=name, viewBox="0 0 10 10", refX="9", refY="5",
                              markerWidth="7", markerHeight="7", orient="auto-start-reverse")
            ET.SubElement(m, "path", d="M0,0 L10,5 L0,10 z", fill=colour)
        ET.SubElement(self.root, "style").text = (
            "text{font-family:DejaVu Sans Mono,Menlo,Consolas,monospace;font-size:11px}"
            ".title{font-size:15px;font-weight:bold}.head{font-size:11px;fill:#444}"
            "text{paint-order:stroke;stroke:#fff;stroke-width:3px;stroke-linejoin:round}"
            ".violation text,text.bad{fill:#c62828;font-weight:bold}.phase{fill:#777;font-size:10px}")
        self.body = ET.SubElement(self.root, "g")
        self.has_violation_id = False

    def el(self, tag: str, parent: ET.Element | None = None, text: str | None = None, **attrs: Any) -> ET.Element:
        e = ET.SubElement(self.body if parent is None else parent, tag,
                          {k.rstrip("_").replace("__", "-").replace("_", "-"): _t(v) for k, v in attrs.items()})
        if text is not None:
            e.text = _t(text)
        return e

    def text(self, x: float, y: float, s: str, parent: ET.Element | None = None, **attrs: Any) -> ET.Element:
        e = self.el("text", parent, s, x=f"{x:.1f}", y=f"{y:.1f}", **attrs)
        e.set("{http://www.w3.org/XML/1998/namespace}space", "preserve")  # keep the header's column spacing
        return e

    def violation(self, prop: str, rank: int | None, **extra: Any) -> ET.Element:
        """A group marking a violation: class "violation", the first one also id "violation"."""
        attrs = {"class_": "violation", "data_property": prop, **extra}
        if rank is not None:
            attrs["data_rank"] = rank
        if not self.has_violation_id:
            attrs["id"] = "violation"
            self.has_violation_id = True
        return self.el("g", None, **attrs)


def _rank_x(r: int) -> float:
    return _LEFT + r * _COL + 40


def _store_x(r: int) -> float:
    return _rank_x(r) + _STORE_DX


def _rank_row(d: "_Svg", row: Any, i: int, y: float, arrive_y: dict, ends: dict[int, float]) -> float:
    """One row of a rank: an arrival, a report, or a store call and its answer (or its hang); the next row's y."""
    rx, sx = _rank_x(row.rank), _store_x(row.rank)
    parent = d.violation(row.prop, row.rank, data_row=i) if row.bad else d.el("g", class_=row.kind)
    colour = RED if row.bad else INK
    if row.kind == "arrive":
        arrive_y[(row.rank, row.coll)] = y + 10
        d.el("circle", parent, cx=rx, cy=y + 10, r=5, fill=RED if row.bad else "#5e35b1")
        label = f"  <- mismatch {row.bad}" if row.prop == "desync" else f"  <- {row.bad}" if row.bad else ""
        d.text(rx + 10, y + 14, row.text + label, parent,
               fill=colour, class_="bad" if row.bad else "op")
        y += 24
    elif row.kind == "report":
        d.el("rect", parent, x=rx - 4, y=y + 2, width=8, height=16, fill="#2e7d32")
        d.text(rx + 10, y + 14, row.text, parent)
        y += 24
    else:
        d.text(rx + 6, y + 9, row.text, parent, fill=colour, class_="bad" if row.bad else "op")
        d.el("line", parent, x1=rx, y1=y + 13, x2=sx, y2=y + 13, stroke=colour, stroke_width=1.3,
             marker_end="url(#arrow-red)" if row.bad else "url(#arrow)")
        if row.hung:
            ends[row.rank] = y + 32
            d.el("path", parent, d=f"M{rx - 9},{y + 23} L{rx + 9},{y + 41} M{rx + 9},{y + 23} L{rx - 9},{y + 41}",
                 stroke=RED, stroke_width=3.5)
            d.text(rx - 14, y + 36, "HUNG", parent, text_anchor="end", fill=RED, class_="bad")
            d.text(rx + 14, y + 36, row.hung, parent, fill=RED, class_="bad")
            y += 48
        else:
            d.el("line", parent, x1=sx, y1=y + 29, x2=rx, y2=y + 29, stroke=colour, stroke_dasharray="4,3",
                 marker_end="url(#arrow-red)" if row.bad else "url(#arrow)")
            d.text(rx + 6, y + 25, row.result or "-", parent, fill=colour if row.bad else "#555")
            if row.bad:
                d.text(sx + 8, y + 17, f"<- {row.bad}", parent, fill=RED, class_="bad")
            y += 38
    return y


def _ends(d: "_Svg", p: Picture, width: float, y: float, top: float, lifelines: Any, ends: dict[int, float],
          arrive_y: dict) -> str:
    """The end of every lifeline, the desync boxes, the wait-for graph, the violations in words; the SVG text."""
    # the end of every lifeline, the wait-for graph, the violations in words
    y += 8
    end_y = y
    for r in range(p.n):
        rx, sx = _rank_x(r), _store_x(r)
        stop = ends.get(r, end_y)
        lifelines.insert(0, ET.Element("line", {"class": "lifeline", "data-rank": str(r), "x1": f"{rx}",
                                                "x2": f"{rx}", "y1": f"{top}", "y2": f"{stop}", "stroke": BLUE,
                                                "stroke-width": "2"}))
        lifelines.insert(0, ET.Element("line", {"class": "store-lifeline", "data-rank": str(r), "x1": f"{sx}",
                                                "x2": f"{sx}", "y1": f"{top}", "y2": f"{end_y}", "stroke": GREY,
                                                "stroke-dasharray": "3,3"}))
        if r in ends:
            d.el("line", x1=rx, x2=rx, y1=stop, y2=end_y, stroke=RED, stroke_dasharray="2,5", stroke_width=1.5)
        status = p.status.get(r, "")
        bad = r in p.bad_status
        parent = d.violation(_bad_prop(p, r), r, data_end="1") if bad else d.el("g", class_="end")
        d.el("rect", parent, x=rx - 55, y=end_y, width=110, height=20, rx=4,
             fill="#fdecea" if bad else "#f5f5f5", stroke=RED if bad else GREY)
        d.text(rx, end_y + 14, status, parent, text_anchor="middle", fill=RED if bad else INK)
    y = end_y + 34
    for v in p.violations:
        if v.coll is not None:  # desync: box the disagreeing arrivals of that collective
            ys = [yy for (q, c), yy in arrive_y.items() if c == v.coll]
            if ys:
                g = d.violation(v.prop, v.rank, data_collective=v.coll)
                x0, x1 = _rank_x(0) - 50, width - 12
                d.el("rect", g, x=x0, y=min(ys) - 12, width=x1 - x0, height=max(ys) - min(ys) + 24, rx=6,
                     fill="none", stroke=RED, stroke_width=1.5, stroke_dasharray="6,3")
                d.text(x1 - 4, max(ys) + 26, f"collective #{v.coll} never completes", g, fill=RED, text_anchor="end")
        if not v.waits_for:
            continue
        g = d.violation("deadlock", min(v.waits_for), data_graph="waits-for")
        d.text(12, y + 4, "wait-for graph", g, fill=RED)
        lane = 0
        for r, qs in sorted(v.waits_for.items()):
            for q in qs:
                if not 0 <= q < p.n or q == r:
                    continue
                lane += 1
                x0, x1 = _rank_x(r), _rank_x(q)
                low = end_y + 20 + 64 * lane  # the curve's lowest point is 3/4 of the way down: 48 px per lane
                d.el("path", g, d=f"M{x0},{end_y + 20} C{x0},{low} {x1},{low} {x1},{end_y + 22}", fill="none",
                     stroke=RED, stroke_width=2, marker_end="url(#arrow-red)")
                d.text((x0 + x1) / 2, end_y + 20 + 48 * lane + 15,
                       f"rank {r} waits for rank {q} ({p.status.get(q, '?')})", g, text_anchor="middle", fill=RED)
        y = end_y + 50 + 64 * lane
    for v in p.violations:
        g = d.violation(v.prop, v.rank, data_summary="1")
        for line in wrap(v.text, int((width - 24) / 6.7)):
            d.text(12, y, line, g, fill=RED)
            y += 15
    if not p.violations:
        d.text(12, y, "every property held", fill="#2e7d32", font_weight="bold")
        y += 15
    height = y + 16
    d.root.set("width", str(int(width)))
    d.root.set("height", str(int(height)))
    d.root.set("viewBox", f"0 0 {int(width)} {int(height)}")
    d.root.insert(2, ET.Element("rect", {"x": "0", "y": "0", "width": str(int(width)), "height": str(int(height)),
                                         "fill": "white"}))
    title = ET.Element("title")
    title.text = _t(f"shardcheck: {p.title} - {p.summary}")
    d.root.insert(0, title)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(d.root, encoding="unicode") + "\n"


def svg(trace: Trace) -> str:
    """The trace as an SVG sequence diagram (well-formed XML; the violation in red, `class="violation"`)."""
    p = picture(trace)
    d = _Svg()
    width = max(_LEFT + p.n * _COL + 120, 800)
    d.text(12, 22, clip(f"shardcheck: {p.title}", int((width - 24) / 9.2)), class_="title")
    y = 42
    for line in wrap(p.summary, int((width - 24) / _CH))[:6]:
        d.text(12, y, line, class_="head", font_style="italic")
        y += 14
    y += 4
    for line in p.header:
        d.text(12, y, clip(line, int((width - 24) / _CH)), class_="head")
        y += 14
    head_y = y + 10
    for r in range(p.n):
        d.el("rect", x=_rank_x(r) - 40, y=head_y, width=80, height=22, rx=4, fill="#e3f2fd", stroke=BLUE)
        d.text(_rank_x(r), head_y + 15, f"rank {r}", text_anchor="middle", font_weight="bold")
        d.el("rect", x=_store_x(r) - 40, y=head_y, width=80, height=22, rx=4, fill="#f5f5f5", stroke=GREY)
        d.text(_store_x(r), head_y + 15, f"store {r}", text_anchor="middle")
    top = head_y + 22
    y = top + 16
    lifelines = d.el("g", class_="lifelines")  # drawn first: everything else lies on top of the lifelines
    ends: dict[int, float] = {}   # lifelines that end early (hung ranks): their y
    arrive_y: dict[tuple[int, int | None], float] = {}
    last_phase = None
    bands = d.el("g", class_="collectives")
    for i, row in enumerate(p.rows):
        if row.phase != last_phase:
            d.el("line", x1=8, x2=width - 8, y1=y, y2=y, stroke="#bbb", stroke_dasharray="6,4")
            d.text(10, y + 12, f"{row.phase} phase", class_="phase")
            last_phase = row.phase
            y += 18
        if row.phase != "lookup" and (row.step is not None or row.time is not None):
            d.text(10, y + 14, ("" if row.step is None else f"step {row.step}")
                   + ("" if not row.time else f" t={row.time:g}"), class_="phase")
        marks = [v for v in p.violations if v.row == i]
        if row.kind == "collective" or row.kind == "combine":
            x0, x1 = _rank_x(0) - 50, _rank_x(p.n - 1) + 50 if row.kind == "collective" else _store_x(p.n - 1) + 50
            x1 = max(x1, x0 + 260)
            parent = d.violation(row.prop, None) if row.bad else bands
            h = 30 if row.result else 20
            d.el("rect", parent, x=x0, y=y, width=x1 - x0, height=h, rx=6,
                 fill="#fdecea" if row.bad else ("#ede7f6" if row.kind == "collective" else "#e8f5e9"),
                 stroke=RED if row.bad else ("#5e35b1" if row.kind == "collective" else "#2e7d32"),
                 class_="collective" if row.kind == "collective" else "combine",
                 data_collective="" if row.coll is None else row.coll)
            d.text((x0 + x1) / 2, y + 13, row.text, parent, text_anchor="middle", font_weight="bold")
            if row.result:
                d.text((x0 + x1) / 2, y + 25, clip(row.result, int((x1 - x0) / _CH)), parent, text_anchor="middle")
            y += h + 10
        elif row.kind == "evict":
            g = d.el("g", class_="evict")
            hit = [r for r in row.ranks if 0 <= r < p.n]
            for r in hit:
                sx = _store_x(r)
                d.el("path", g, d=f"M{sx - 6},{y + 4} L{sx + 6},{y + 16} M{sx + 6},{y + 4} L{sx - 6},{y + 16}",
                     stroke=ORANGE, stroke_width=3)
            if hit:  # one label, beside the first store it hits (left of it when that is the last store)
                sx = _store_x(hit[0])
                left = hit[0] == p.n - 1 and p.n > 1
                d.text(sx - 10 if left else sx + 10, y + 14, row.text, g, fill=ORANGE,
                       text_anchor="end" if left else "start")
            y += 24
        elif row.rank is not None:
            y = _rank_row(d, row, i, y, arrive_y, ends)
        y += 8 if marks else 0
        for v in marks:
            g = d.violation(v.prop, v.rank, data_note=i)
            for line in wrap(v.text, int((width - _LEFT - 20) / _CH)):
                d.text(_LEFT, y + 4, line, g, fill=RED)
                y += 15
            y += 4
    return _ends(d, p, width, y, top, lifelines, ends, arrive_y)


def _bad_prop(p: Picture, rank: int) -> str:
    return next((v.prop for v in p.violations if v.rank == rank), p.violations[0].prop if p.violations else "")
