"""The model of the drawing: a trace read into rows, each lifeline's end state, and the violations located on
the rows. `timeline` and `svg` both draw a `Picture`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import attrs

from model.trace import Trace, TraceError, decode
from shardcheck.show.keys import Keys
from shardcheck.show.rows import Row, ops_rows, protocol_rows
from shardcheck.show.text import as_int, as_ints, brief, clip, plural, safe

__all__ = ["Picture", "Violation", "picture"]


@dataclass
class Violation:
    """One violation of the verdict and where it is drawn."""

    prop: str
    text: str                     # "!! hang: rank 1 waits forever on ..."
    rank: int | None = None       # where it is marked (None: the run as a whole)
    row: int | None = None        # the row it is marked on (None: at the end of the lifelines)
    waits_for: dict[int, list[int]] = field(default_factory=dict)   # deadlock: the wait-for graph
    coll: int | None = None       # desync: the collective whose arrivals disagree


@dataclass
class Picture:
    """Everything both renderings draw: header, rows, lifeline ends, violations."""

    title: str
    summary: str
    header: list[str]
    n: int
    rows: list[Row]
    status: dict[int, str]        # how each lifeline ends: "done", "HUNG on c0", "waits in #1"
    bad_status: dict[int, str]    # lifelines that end in a violation
    violations: list[Violation]
    kind: str


def _mark_store_op(mark: Violation, prop: str, summary: str, detail: dict, rows: list[Row],
                   bad_status: dict[int, str]) -> None:
    """The failed op of a store-ops trace: the one the detail names, else the last one recorded (recording stops
    there)."""
    index = as_int(detail.get("index"))
    at = [i for i, r in enumerate(rows) if index is None or r.step == index][-1:]
    for i in at:
        r = rows[i]
        mark.row, mark.rank = i, r.rank
        if prop == "store-hang" or r.hung:
            r.hung = r.hung or "never returned"
            r.result = "never returns"
            r.bad = "HANG"
            if r.rank is not None:
                bad_status[r.rank] = "HUNG"
        else:
            r.bad = prop
            if r.rank is not None:
                bad_status[r.rank] = prop
        r.prop = prop
        mark.text = f"!! {prop} at op #{r.step} ({r.text} on rank {r.rank}): {summary}"


def _mark_desync(mark: Violation, prop: str, detail: dict, rows: list[Row], bad_status: dict[int, str]) -> None:
    """The arrivals of the collective the ranks disagree on."""
    k = mark.coll = detail["collective"]
    who = detail.get("ranks") if isinstance(detail.get("ranks"), dict) else {}
    for i, r in enumerate(rows):
        if r.kind == "arrive" and r.coll == k and (not who or r.rank in who):
            others = [f"r{q} {sig}" for q, sig in who.items() if q != r.rank]
            r.bad, r.prop = (f"vs {', '.join(others)}" if others else "mismatch"), prop
            if mark.row is None or r.rank == max(who or [r.rank]):
                mark.row, mark.rank = i, r.rank
    if who:
        mark.text = f"!! desync at collective #{k}: " + " vs ".join(
            f"rank {q} {s}" for q, s in sorted(who.items(), key=lambda x: str(x[0])))
    for q in who:
        if isinstance(q, int):
            bad_status[q] = f"desync in #{k}"


def _mark_deadlock(mark: Violation, prop: str, detail: dict, rows: list[Row], bad_status: dict[int, str]) -> None:
    """Each waiting rank's last arrival, who it waits for, who finished, the cycle."""
    wf = detail.get("waits_for") if isinstance(detail.get("waits_for"), dict) else {}
    mark.waits_for = {int(r): [int(q) for q in qs] for r, qs in wf.items()
                      if as_int(r) is not None and isinstance(qs, list)}
    finished = as_ints(detail.get("finished"))
    parts = []
    for r, qs in sorted(mark.waits_for.items()):
        k = max((x.coll for x in rows if x.kind == "arrive" and x.rank == r and x.coll is not None),
                default=None)
        at = [i for i, x in enumerate(rows) if x.kind == "arrive" and x.rank == r and x.coll == k]
        if at:
            rows[at[-1]].bad, rows[at[-1]].prop = "stuck", prop
            if mark.row is None:
                mark.row, mark.rank = at[-1], r
        parts.append(f"rank {r} waits{f' in collective #{k}' if k is not None else ''} for {plural(qs)}")
        bad_status[r] = f"waits in #{k}" if k is not None else "waits"
    if finished:
        parts.append(f"{plural(finished)} finished without entering it")
        for q in finished:
            bad_status.setdefault(q, "finished")
    cycle = as_ints(detail.get("cycle"))
    if cycle:
        parts.append("cycle " + " -> ".join(map(str, list(cycle) + [cycle[0]])))
    if parts:
        mark.text = "!! deadlock: " + "; ".join(parts)


def _locate(trace: Trace, rows: list[Row], n: int) -> tuple[list[Violation], dict[int, str]]:
    """Every violation of the verdict, with the row and rank where it is marked."""
    out: list[Violation] = []
    bad_status: dict[int, str] = {}
    violations = trace.verdict.get("violations", []) if isinstance(trace.verdict, dict) else []
    for v in violations if isinstance(violations, list) else []:
        if not isinstance(v, dict):
            continue
        prop, summary = str(v.get("property", "?")), str(v.get("summary", ""))
        try:
            detail = decode(v.get("detail", {}))
        except TraceError:
            detail = {}
        detail = detail if isinstance(detail, dict) else {}
        rank = as_int(detail.get("rank"))
        mark = Violation(prop, f"!! {prop}: {summary}", rank)
        if trace.kind == "store-ops" and prop != "hang":
            _mark_store_op(mark, prop, summary, detail, rows, bad_status)
        elif prop == "hang":
            at = [i for i, r in enumerate(rows) if r.hung and (rank is None or r.rank == rank)]
            index = as_int(detail.get("index", detail.get("op")))
            if not at and trace.kind == "store-ops" and rank is not None:  # the op the verdict names, else the last
                at = [i for i, r in enumerate(rows) if r.rank == rank and (index is None or r.step == index)][-1:]
                for i in at:
                    rows[i].hung = rows[i].hung or "never returned"
            if at:
                r = rows[at[-1]]
                mark.row, mark.rank = at[-1], r.rank
                r.bad, r.prop = "HANG", prop
                why = "waits forever on" if r.hung == "waits forever" else "never returns from"
                mark.text = f"!! hang: rank {r.rank} {why} {r.text}"
                if detail.get("key"):
                    mark.text += f" (key {detail['key']})"
                if r.rank is not None:
                    bad_status[r.rank] = "HUNG"
            elif rank is not None:
                bad_status[rank] = "HUNG"
        elif prop == "desync" and as_int(detail.get("collective")) is not None:
            _mark_desync(mark, prop, detail, rows, bad_status)
        elif prop == "deadlock":
            _mark_deadlock(mark, prop, detail, rows, bad_status)
        elif prop in ("soundness", "completeness"):
            at = [i for i, r in enumerate(rows) if r.kind == "combine"]
            if at:
                mark.row = at[-1]
                rows[at[-1]].bad, rows[at[-1]].prop = prop, prop
        elif prop == "key-consistency" and rank is not None:
            key = detail.get("key")
            at = [i for i, r in enumerate(rows) if r.rank == rank and r.kind == "op" and r.phase != "store"
                  and isinstance(key, str) and r.reads == key]
            if at:
                mark.row = at[0]
                rows[at[0]].bad, rows[at[0]].prop = "unwritten key", prop
            bad_status.setdefault(rank, prop)
        elif prop == "termination":
            stuck = as_ints(detail.get("ranks"))
            for q in stuck:
                bad_status[q] = "still running"
            if rank is not None:
                bad_status[rank] = f"raised {detail.get('exception', '')}".strip()
            if stuck and mark.rank is None:
                mark.rank = stuck[0]
                at = [i for i, r in enumerate(rows) if r.rank == stuck[0]]
                if at:
                    mark.row = at[-1]
                    rows[at[-1]].bad, rows[at[-1]].prop = "still running", prop
        elif prop == "agreement" and isinstance(detail.get("u"), dict):
            for q, u in detail["u"].items():
                if str(q).isdigit():
                    bad_status[int(q)] = f"u={u}"
            mark.rank = None
        elif rank is not None:
            bad_status.setdefault(rank, prop)
        out.append(mark)
    return out, bad_status


def _header(trace: Trace, n: int, keys: Keys) -> tuple[str, list[str]]:
    proto = trace.protocol if isinstance(trace.protocol, dict) else {}
    name, ref = proto.get("name", "?"), proto.get("ref")
    violations = trace.verdict.get("violations", []) if isinstance(trace.verdict, dict) else []
    props = sorted({str(v.get("property")) for v in violations if isinstance(v, dict)})
    verdict = f"VIOLATED {', '.join(props)}" if props else "every property held"
    title = f"{name}: {trace.property or ('every property held' if not props else props[0])}"
    cfg = trace.config if isinstance(trace.config, dict) else {}
    lines = [f"protocol {name}" + (f" ({ref})" if ref else "") + f"   client {trace.client}   kind {trace.kind}"
             + (f"   origin {trace.origin}" if trace.origin else "")]
    if trace.kind == "protocol":
        lines.append(f"config   N={cfg.get('n_ranks')} ranks, K={cfg.get('n_chunks')} chunks, salt {cfg.get('salt')}, "
                     f"step bound {cfg.get('step_bound')}, seed {cfg.get('seed')}")
        lines.append("faults   " + _faults_text(trace.faults))
        lk = trace.lookup if isinstance(trace.lookup, dict) else {}
        if lk:
            lines.append(f"lookup   reports {lk.get('reports')} -> planned {lk.get('planned')}, LCP {lk.get('lcp')}, "
                         f"cached {lk.get('cached')}")
        if trace.schedule:
            lines.append("schedule " + clip(" ".join(map(str, trace.schedule)), 100))
    else:
        lines.append(f"config   {brief(cfg, 100)}" if cfg else "config   -")
        lines.append(f"ops      {len(trace.ops)} store-client operations over {n} rank(s)")
    legend = keys.legend(("hI = GetAsync handle I",) if trace.kind == "protocol" else ())
    lines += [("keys     " if i == 0 else " " * 9) + line for i, line in enumerate(legend)]
    lines.append(f"verdict  {verdict}" + (f"   expect {trace.expect}" if trace.expect else ""))
    for v in violations:
        if isinstance(v, dict):
            lines.append(f"         {v.get('property')}: {v.get('summary')}")
    if trace.notes:
        lines.append(f"notes    {clip(trace.notes, 100)}")
    return title, lines


def _faults_text(faults: Any) -> str:
    """Every fault of a trace's `faults` object in its kind's words (`FaultKind.text`), a malformed one as it is."""
    if not isinstance(faults, dict):
        return "-"
    from model.faults import FAULT_KINDS
    parts = []
    for kind in FAULT_KINDS:
        for raw in faults.get(kind.field, []) or []:
            try:
                parts.append(kind.text(kind.from_json(raw)))
            except (TypeError, ValueError, KeyError):
                parts.append(f"{kind.field} {raw!r}")
    return "; ".join(parts) if parts else "none"


def _normalized(t: Trace) -> Trace:
    """The trace with every field of the type the renderers expect (`Trace.load` checks only some of them)."""
    def typed(v: Any, typ: type, default: Any) -> Any:
        return v if isinstance(v, typ) else default

    violations = typed(typed(t.verdict, dict, {}).get("violations"), list, [])
    return attrs.evolve(
        t, kind=str(t.kind), property=t.property if isinstance(t.property, str) else None, summary=str(t.summary),
        protocol=typed(t.protocol, dict, {}), client=str(t.client), config=typed(t.config, dict, {}),
        faults=typed(t.faults, dict, {}), schedule=typed(t.schedule, list, []), events=typed(t.events, list, []),
        lookup=typed(t.lookup, dict, {}), ops=typed(t.ops, list, []),
        verdict={"violations": [v for v in violations if isinstance(v, dict)]}, expect=typed(t.expect, dict, {}),
        origin=str(t.origin or ""), notes=str(t.notes or ""))


_MAX_RANKS = 256  # lifelines drawn at most (a hand-edited trace may name any rank)


def picture(trace: Trace) -> Picture:
    trace = _normalized(trace)
    keys = Keys(trace)
    items = trace.ops if trace.kind == "store-ops" else trace.events
    seen = [r for e in items if isinstance(e, dict) and (r := as_int(e.get("rank"))) is not None]
    n = min(max(as_int(trace.config.get("n_ranks")) or 1, max(seen, default=0) + 1), _MAX_RANKS)
    rows = ops_rows(trace, keys) if trace.kind == "store-ops" else protocol_rows(trace, keys, n)
    rows = [r for r in rows if r.rank is None or 0 <= r.rank < n]
    for row in rows:  # an eviction or collective naming a rank the run does not have is drawn on the others
        row.ranks = tuple(r for r in row.ranks if 0 <= r < n)
    violations, bad_status = _locate(trace, rows, n)
    status: dict[int, str] = {}
    done = {r.coll for r in rows if r.kind == "collective"}
    for r in range(n):
        mine = [x for x in rows if x.rank == r]
        open_ = [x.coll for x in mine if x.kind == "arrive" and x.coll not in done]
        if any(x.hung for x in mine):
            status[r] = "HUNG"
        elif open_:
            status[r] = f"waits in #{open_[-1]}"
        else:
            status[r] = "done"
    status.update(bad_status)
    if trace.kind == "store-ops":  # an op that never returned is a hang even without a verdict naming it
        for i, row in enumerate(rows):
            if row.hung and not row.bad and row.rank is not None:
                row.bad, row.prop = "HANG", "hang"
                bad_status[row.rank] = status[row.rank] = "HUNG"
                if not any(v.prop == "hang" and v.row == i for v in violations):
                    violations.append(Violation("hang", f"!! hang: rank {row.rank} never returns from {row.text}",
                                                 row.rank, i))
    title, header = _header(trace, n, keys)
    for row in rows:  # nothing from the trace reaches a terminal or the SVG with control characters
        row.text, row.result, row.hung, row.bad = map(safe, (row.text, row.result, row.hung, row.bad))
    for v in violations:
        v.text = safe(v.text)
    return Picture(safe(title), safe(str(trace.summary)), [safe(h) for h in header], n, rows,
                    {r: safe(s) for r, s in status.items()}, bad_status, violations, trace.kind)
