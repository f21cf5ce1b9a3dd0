"""`shardcheck show TRACE [--svg OUT]`: a stored run as a terminal timeline and as an SVG sequence diagram.

Both renderings are pure functions of a `model.trace.Trace` and share one intermediate form, `picture.Picture`: the
trace read into rows (one per event: a store op, a collective arrival or completion, an eviction, a lookup step), the
end state of every rank's lifeline, and the violations located on those rows. `timeline_view.timeline` lays the rows out
as text columns (one per rank), `diagram.svg` as a sequence diagram. A `concurrent` trace is drawn as its history
instead (`history_view`: a lane per caller, op intervals, the op that never completed, the linearizable prefix and the
op that cannot be placed). Stdlib only; every value shown comes from the trace, so a hand-edited trace renders too.
"""
from __future__ import annotations

import sys
from pathlib import Path

from model.trace import Trace, TraceError
from shardcheck.show.diagram import svg
from shardcheck.show.history_view import history_svg, history_timeline
from shardcheck.show.timeline_view import timeline

__all__ = ["timeline", "svg", "show_command"]


def show_command(path: str, svg_out: str | None, engine: str | None = None) -> int:
    """`shardcheck show PATH [--svg OUT] [--engine NAME]`: print the timeline, write the SVG; 2 on a bad trace or OUT.
    `--engine` says which serving engine the reader replays an engine trace on (noted when it is not the one the
    trace was recorded on)."""
    try:
        trace = Trace.load(path)
    except TraceError as exc:
        print(f"shardcheck show: {exc}", file=sys.stderr)
        return 2
    if engine is not None and trace.kind not in ("engine", "stack"):
        print(f"shardcheck show: --engine {engine}: {path} is a {trace.kind} trace, not an engine or stack trace",
              file=sys.stderr)
        return 2
    if svg_out is not None:
        parent = Path(svg_out).parent
        if not parent.is_dir():
            print(f"shardcheck show: cannot write the SVG to {svg_out}: directory {str(parent)!r} does not exist",
                  file=sys.stderr)
            return 2
        if Path(svg_out).resolve() == Path(path).resolve():
            print(f"shardcheck show: refusing to write the SVG over the trace itself ({svg_out})", file=sys.stderr)
            return 2
        if Path(svg_out).is_dir():
            print(f"shardcheck show: cannot write the SVG to {svg_out}: it is a directory", file=sys.stderr)
            return 2
    concurrent = trace.kind == "concurrent"
    if trace.kind in ("engine", "stack"):
        from shardcheck.show.engine_view import engine_svg, engine_timeline
        text, draw = engine_timeline, engine_svg
        if engine is not None and engine != trace.config.get("engine"):
            print(f"(recorded on engine {trace.config.get('engine')}; expected on {engine}: "
                  f"{trace.expected(engine) or 'no expectation recorded'})")
    else:
        text, draw = (history_timeline, history_svg) if concurrent else (timeline, svg)
    head, _, rest = text(trace).partition("\n")
    sys.stdout.write(f"{head}\n{_layer_line(trace)}\n{rest}")
    if svg_out is not None:
        existed = Path(svg_out).exists()  # (said below: an SVG is a picture of the trace, replaced on purpose)
        try:
            Path(svg_out).write_text(draw(trace), encoding="utf-8")
        except OSError as exc:
            print(f"shardcheck show: cannot write the SVG to {svg_out}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        print(f"{'overwrote' if existed else 'wrote'} {svg_out}")
    return 0


def _layer_line(trace: Trace) -> str:
    """What the trace is of, in words: its layer (`checking.layers.Layer.what`)."""
    from checking.layers import LAYERS
    layer = LAYERS.get(trace.kind)
    return f"layer    {trace.kind}: {layer.what if layer is not None else 'no layer of this shardcheck'}"
