"""An engine trace drawn: the case (deployment, prompts), then one row per engine step with what each rank and the
scheduler saw (the lookup's answer against every rank's prefix, each rank's retrieve), the step that showed the
violation marked; as terminal text and as an SVG with a lane for the scheduler and one per rank.
"""
from __future__ import annotations

from model.trace import Trace
from shardcheck.show.diagram import _t
from shardcheck.show.text import clip, safe

__all__ = ["engine_rows", "engine_timeline", "engine_svg"]


def _case(trace: Trace) -> dict:
    case = trace.config.get("case") if isinstance(trace.config, dict) else None
    return case if isinstance(case, dict) else {}


def _header(trace: Trace) -> list[str]:
    case = _case(trace)
    rate = trace.config.get("rate") or {}
    prompts = ", ".join(_prompt_text(p) for p in case.get("prompts", []) if isinstance(p, dict))
    models = case.get("models", ["m"])
    deps = f"; {len(models)} deployments ({', '.join(map(str, models))}) on one tier" if len(models) > 1 else ""
    how = (f"connector {safe(str(trace.config.get('connector')))}" if trace.kind == "stack" else
           f"{case.get('lookup')} lookup")
    return [f"== shardcheck trace: {trace.kind} {safe(str(trace.config.get('engine')))}: "
            f"{trace.property or 'no violation'}",
            f"   {case.get('n_ranks')} rank(s), {how}{deps}; shown in {rate.get('k')} of "
            f"{rate.get('n')} runs" + (f"; patches {', '.join(trace.config['patches'])}" if trace.config.get("patches")
                                      else ""),
            f"   prompts: {prompts}"]


def _prompt_text(p: dict) -> str:
    extra = [f"{k} {p[k]}" for k in ("tenant", "adapter", "image") if p.get(k)]
    shared = f", first {p['shared']} of {p['stem']}" if p.get("stem") else ""
    dep = f", deployment {p['deployment']}" if p.get("deployment") else ""
    return f"{p.get('name')} ({p.get('chunks')} chunks{shared}{dep}{'; ' + ', '.join(extra) if extra else ''})"


def engine_rows(trace: Trace) -> list[dict]:
    """One row per event: `text` (what ran), `ranks` (per rank: what it showed), `sched` (the scheduler's part),
    `bad` (the row where the trace's property showed)."""
    rows = []
    for e in trace.events if isinstance(trace.events, list) else []:
        if not isinstance(e, dict):
            continue
        step = e.get("step") if isinstance(e.get("step"), dict) else {}
        row = {"text": str(e.get("text", "")), "kind": step.get("kind", ""), "ranks": {}, "sched": "", "bad": False}
        if "answer" in e:
            views = e.get("views") or []
            row["sched"] = f"answer {e['answer']}" + (f" ({e['failed']})" if e.get("failed") else "")
            row["ranks"] = {r: f"holds {v.get('own_lo')}-{v.get('own_hi')}" + ("?" if v.get("unknown") else "")
                            for r, v in enumerate(views) if isinstance(v, dict)}
        if isinstance(e.get("ranks"), list):
            row["ranks"] = {r: (f"{x.get('retrieved')} tok" + (f", {x['freed']} freed" if x.get("freed") else "")
                                + ("" if x.get("ok") else " BAD")) for r, x in enumerate(e["ranks"]) if isinstance(x, dict)}
            row["sched"] = f"planned {e.get('planned')}" + (f" ({e['disturbed']})" if e.get("disturbed") else "")
            row["bad"] = any(isinstance(x, dict) and not x.get("ok") for x in e["ranks"])
        if "reported" in e:  # (a serving stack's request ended: what the connector reported, what vLLM took)
            row["sched"] = (("" if e.get("status") == "finished" else f"{e.get('status')}: ")
                            + f"reported {e['reported']}, took {e.get('external')}"
                            + (f" ({e['failed']})" if e.get("failed") else ""))
            row["ranks"] = {r: f"holds {v.get('own_lo')}-{v.get('any_hi')} chunks" + ("?" if v.get("unknown") else "")
                            for r, v in enumerate(e.get("views") or []) if isinstance(v, dict)}
        if isinstance(e.get("leaks"), dict):
            leaks = e["leaks"]
            row["sched"] = f"pins {leaks.get('pins')}, {leaks.get('free_blocks')}/{leaks.get('total_blocks')} free"
        if e.get("skipped"):
            row["sched"] = f"skipped: {e['skipped']}"
        if e.get("stuck"):
            row["sched"], row["bad"] = "did not return / raised", True
        rows.append(row)
    prop = trace.property
    first = next((v for v in trace.verdict.get("violations", []) if v.get("property") == prop), None)
    if first and not any(r["bad"] for r in rows):
        for r in rows:  # the lookup whose answer was judged, or the end (pins, close)
            if prop in ("engine-soundness", "engine-completeness", "engine-isolation") and r["sched"].startswith("answer"):
                r["bad"] = True
        detail = first.get("detail") if isinstance(first.get("detail"), dict) else {}
        for r, e in zip(rows, [e for e in trace.events if isinstance(e, dict)] if isinstance(trace.events, list) else []):
            if detail.get("request") and e.get("request") == detail.get("request"):
                r["bad"] = True  # (a stack property: the request it names)
        if not any(r["bad"] for r in rows) and rows:
            rows[-1]["bad"] = True
    return rows


def engine_timeline(trace: Trace, *, width: int = 120) -> str:
    """The terminal picture: the header, a row per step, the violations."""
    case = _case(trace)
    n = int(case.get("n_ranks") or 1)
    col = 18
    lines = _header(trace)
    lines.append(f"   {'step':<40} {'scheduler':<28}" + "".join(f"{'rank ' + str(r):<{col}}" for r in range(n)))
    for i, row in enumerate(engine_rows(trace)):
        mark = ">>" if row["bad"] else "  "
        cells = "".join(f"{clip(row['ranks'].get(r, ''), col - 1):<{col}}" for r in range(n))
        lines.append(clip(f"{mark} {i:>2} {clip(row['text'], 36):<37} {clip(row['sched'], 27):<28}{cells}", width))
    lines.append("   violations:")
    for v in trace.verdict.get("violations", []):
        lines.append(f"   - {v.get('property')}: {clip(safe(str(v.get('summary', ''))), width - 8)}")
    return "\n".join(lines) + "\n"


def engine_svg(trace: Trace) -> str:
    """The SVG picture: a lane for the scheduler and one per rank, a row per step; the bad step in red."""
    case = _case(trace)
    n = int(case.get("n_ranks") or 1)
    rows = engine_rows(trace)
    left, lane_w, row_h = 300, 170, 22
    width = left + lane_w * (n + 1) + 20
    height = 100 + row_h * len(rows) + 20 * len(trace.verdict.get("violations", []))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="monospace" '
           'font-size="11">']
    for j, text in enumerate(_header(trace)):
        out.append(f'<text x="10" y="{16 + 14 * j}">{_t(text.strip("= "))}</text>')
    top = 70
    for k, name in enumerate(["scheduler", *(f"rank {r}" for r in range(n))]):
        x = left + k * lane_w
        out.append(f'<text x="{x + 4}" y="{top}">{_t(name)}</text>')
        out.append(f'<line x1="{x}" y1="{top + 4}" x2="{x}" y2="{top + 10 + row_h * len(rows)}" stroke="#ccc"/>')
    for i, row in enumerate(rows):
        y = top + 10 + i * row_h
        color = "#c00" if row["bad"] else "#000"
        if row["bad"]:
            out.append(f'<rect class="bad" x="4" y="{y}" width="{width - 8}" height="{row_h - 2}" fill="#f4cccc"/>')
        out.append(f'<text x="8" y="{y + 15}" fill="{color}">{_t(f"{i:>2} " + clip(row["text"], 40))}</text>')
        out.append(f'<text x="{left + 4}" y="{y + 15}" fill="{color}">{_t(clip(row["sched"], 26))}</text>')
        for r, cell in row["ranks"].items():
            out.append(f'<text x="{left + (r + 1) * lane_w + 4}" y="{y + 15}" fill="{color}">{_t(clip(cell, 24))}</text>')
    y = top + 20 + row_h * len(rows)
    for v in trace.verdict.get("violations", []):
        out.append(f'<text x="10" y="{y}">{_t(clip(str(v.get("property")) + ": " + str(v.get("summary", "")), 170))}</text>')
        y += 20
    out.append("</svg>")
    return "\n".join(out) + "\n"

