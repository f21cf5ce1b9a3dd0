"""`shardcheck show TRACE [--svg OUT]`: a stored run as a terminal timeline and as an SVG sequence diagram.

Both renderings are pure functions of a `model.trace.Trace` and share one intermediate form: `_picture`
turns the trace into rows (one per event: a store op, a collective arrival or completion, an eviction, a
lookup step), the end state of every rank's lifeline, and the violations located on those rows.
`timeline` lays the rows out as text columns (one per rank), `svg` as a sequence diagram.
Stdlib only; every value shown comes from the trace, so a hand-edited trace renders too.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import attrs

from model.trace import Trace, TraceError, decode

__all__ = ["timeline", "svg", "show_command"]


# -- values as short text ---------------------------------------------------------------------------------
def _nbytes(v: Any) -> int | None:
    if isinstance(v, dict) and isinstance(v.get("$bytes"), str):
        try:
            return len(base64.b64decode(v["$bytes"], validate=True))
        except (binascii.Error, ValueError):
            return None
    if isinstance(v, (bytes, bytearray)):
        return len(v)
    return None


def _clip(text: str, width: int) -> str:
    text = re.sub(r"[\r\n\t]+", " ", str(text))
    return text if len(text) <= width else text[: max(0, width - 2)] + ".."


def _brief(v: Any, width: int = 40) -> str:
    """A short human form of an encoded value (bytes as sizes, chunk maps as chunk sets)."""
    n = _nbytes(v)
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
            if all(isinstance(k, int) and _nbytes(x) is not None for k, x in pairs):
                return _clip("{" + ",".join(f"c{k}" for k, _ in pairs) + "}", width)
            return _clip("{" + ", ".join(f"{_brief(k, 12)}: {_brief(x, 12)}" for k, x in pairs) + "}", width)
        if "$repr" in v:
            return _clip(str(v["$repr"]), width)
        if not v:
            return "{}"
        return _clip("{" + ", ".join(f"{k}: {_brief(x, 12)}" for k, x in v.items()) + "}", width)
    if isinstance(v, list):
        return _clip("[" + ", ".join(_brief(x, 16) for x in v) + "]", width)
    return _clip(repr(v) if isinstance(v, str) else str(v), width)


def _result(v: Any) -> str:
    """The result of a read: `hit 23B`, `miss`, `TIMED_OUT`, or the value in brief."""
    n = _nbytes(v)
    if n is not None:
        return f"hit {n}B"
    if v is None:
        return "miss"
    return _brief(v, 24)


class _Keys:
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
            return _brief(key, 20)
        m = self.pattern.search(key) if self.pattern else None
        if m is None:
            return key if len(key) <= 18 else key[:8] + ".." + key[-8:]
        c = self.hashes[m.group(0)]
        if rank is not None and key == f"kv:{m.group(0)}:pcp{self.n}:r{rank}":
            return f"c{c}"
        return f"c{c}[{_clip(key.replace(m.group(0), '#'), 16)}]"  # a non-standard key: show its shape

    def chunk(self, key: Any) -> int | None:
        m = self.pattern.search(key) if self.pattern and isinstance(key, str) else None
        return self.hashes[m.group(0)] if m else None


# -- the intermediate form ---------------------------------------------------------------------------------
@dataclass
class _Row:
    kind: str                 # "op" | "arrive" | "collective" | "evict" | "report" | "combine"
    phase: str
    step: int | None = None
    time: float | None = None
    rank: int | None = None   # the rank whose lifeline it is on (None: spans every rank)
    text: str = ""            # what was done: "Get c0", "#0 AllReduceMin(3)"
    result: str = ""          # what came back: "hit 23B", "miss", "-> 1"
    hung: str = ""            # the op never returned: why
    coll: int | None = None   # collective index (arrive / collective rows)
    ranks: tuple[int, ...] = ()  # evict: the stores it hits
    reads: str | None = None  # Get / GetAsync: the key read
    results: dict[int, str] = field(default_factory=dict)  # collective: each rank's result
    bad: str = ""             # a violation is marked on this row: its short text
    prop: str = ""            # ... and the property


@dataclass
class _Violation:
    prop: str
    text: str                     # "!! hang: rank 1 waits forever on ..."
    rank: int | None = None       # where it is marked (None: the run as a whole)
    row: int | None = None        # the row it is marked on (None: at the end of the lifelines)
    waits_for: dict[int, list[int]] = field(default_factory=dict)   # deadlock: the wait-for graph
    coll: int | None = None       # desync: the collective whose arrivals disagree


@dataclass
class _Picture:
    title: str
    summary: str
    header: list[str]
    n: int
    rows: list[_Row]
    status: dict[int, str]        # how each lifeline ends: "done", "HUNG on c0", "waits in #1"
    bad_status: dict[int, str]    # lifelines that end in a violation
    violations: list[_Violation]
    kind: str


def _effect_name(effect: Any) -> str:
    if isinstance(effect, dict):
        if "$effect" in effect:
            return str(effect["$effect"])
        if "$evict" in effect:
            return "Evict"
    if isinstance(effect, list) and effect:
        return str(effect[0])
    return str(effect)


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _ints(v: Any) -> list[int]:
    return [x for x in v if _int(x) is not None] if isinstance(v, (list, tuple)) else []


def _eviction_text(e: dict, when: str = "") -> tuple[str, tuple[int, ...] | None]:
    rank = _int(e.get("rank"))
    where = f"r{rank}" if rank is not None else "all stores"
    return f"evict c{e.get('chunk')} ({where}){' ' + when if when else ''}", (rank,) if rank is not None else None


def _protocol_rows(trace: Trace, keys: _Keys, n: int) -> list[_Row]:
    rows: list[_Row] = []
    handles: dict[tuple[int, int], str] = {}
    arrivals: dict[int, int] = {}
    faults = trace.faults if isinstance(trace.faults, dict) else {}
    all_ranks = tuple(range(n))

    def evictions(name: str, when: str, phase: str) -> None:
        for e in faults.get(name, []) or []:
            if isinstance(e, dict):
                text, ranks = _eviction_text(e, when)
                rows.append(_Row("evict", phase, text=text, ranks=ranks or all_ranks))

    phase_seen: set[str] = set()
    for ev in trace.events:
        if not isinstance(ev, dict):
            continue
        phase = str(ev.get("phase", ""))
        if phase == "lookup" and "lookup" not in phase_seen:
            evictions("evict_before_lookup", "before lookup", "lookup")
        phase_seen.add(phase)
        effect, res, note = ev.get("effect"), ev.get("result"), str(ev.get("note") or "")
        rank = _int(ev.get("rank"))
        row = _Row("op", phase, _int(ev.get("step")), _num(ev.get("time")), rank)
        name = _effect_name(effect)
        if note == "evict" or name == "Evict":
            e = effect.get("$evict", {}) if isinstance(effect, dict) else {}
            text, ranks = _eviction_text(e if isinstance(e, dict) else {})
            row.kind, row.text, row.ranks = "evict", text, ranks or all_ranks
        elif name == "contains" and isinstance(effect, list) and len(effect) == 2:
            row.text, row.result = f"has {keys(effect[1], rank)}?", "yes" if res else "no"
        elif name == "report":
            row.kind, row.text = "report", f"report {_brief(res)}"
        elif name == "combine":
            row.kind, row.text = "combine", f"plan: combine({note or 'reports'}) -> {_brief(res)}"
            rows.append(row)
            evictions("evict_after_lookup", "after lookup", "lookup")
            continue
        elif name in ("AllReduceMin", "AllGather", "Broadcast") and isinstance(effect, dict):
            val = _brief(effect.get("value"), 24)
            root = f", root={effect.get('root')}" if name == "Broadcast" else ""
            if note == "arrive" and rank is not None:
                k = arrivals.get(rank, 0)
                arrivals[rank] = k + 1
                row.kind, row.coll, row.text = "arrive", k, f"enter #{k} {name}({val}{root})"
            else:
                m = re.fullmatch(r"collective #(\d+)", note)
                k = int(m.group(1)) if m else None
                last = rows[-1] if rows else None
                if last is not None and last.kind == "collective" and last.coll == k and k is not None:
                    if rank is not None:  # one completion row for all ranks' results of collective k
                        last.ranks = last.ranks + (rank,)
                        last.results[rank] = _brief(res, 40)
                        last.result = _results_text(last.results, n)
                    continue
                row.kind, row.coll, row.rank = "collective", k, None
                row.text = f"#{k} {name}{root} complete" if k is not None else f"{name}{root} complete"
                row.ranks = (rank,) if rank is not None else ()
                if rank is not None:
                    row.results[rank] = _brief(res, 40)
                row.result = _results_text(row.results, n) if rank is not None else _brief(res, 40)
        elif name in ("Put", "Get", "GetAsync", "Wait") and isinstance(effect, dict):
            if name == "Put":
                size = _nbytes(effect.get("value"))
                row.text = f"Put {keys(effect.get('key'), rank)}" + (f" {size}B" if size is not None else "")
                row.result = "ok" if res is None else _brief(res, 16)
            elif name == "Get":
                row.text, row.result = f"Get {keys(effect.get('key'), rank)}", _result(res)
                row.reads = effect.get("key")
            elif name == "GetAsync":
                row.reads = effect.get("key")
                h = res.get("$handle") if isinstance(res, dict) else None
                row.text = f"GetAsync {keys(effect.get('key'), rank)}"
                if isinstance(h, list) and len(h) == 3:
                    handles[(h[0], h[1])] = keys(h[2], rank)
                    row.result = f"h{h[1]}"
                else:
                    row.result = _brief(res, 16)
            else:
                h = effect.get("handle", {})
                h = h.get("$handle") if isinstance(h, dict) else None
                what = f"h{h[1]} {handles.get((h[0], h[1]), keys(h[2], rank))}" if isinstance(h, list) and len(h) == 3 \
                    else _brief(effect.get("handle"), 16)
                t = effect.get("timeout")
                row.text = f"Wait {what} " + (f"t={t:g}" if _num(t) is not None else "no timeout")
                row.result = _result(res)
            if note == "waits forever":
                row.hung, row.result = "waits forever", "never returns"
            elif note.startswith("client hang"):
                row.hung, row.result = note, "never returns"
        else:
            row.text, row.result = _clip(f"{name} {_brief(effect, 30)}", 40), _brief(res, 20)
            if note:
                row.result += f" ({_clip(note, 30)})"
        rows.append(row)
    if "lookup" not in phase_seen:
        evictions("evict_before_lookup", "before lookup", "lookup")
    return _collapse(rows)


def _collapse(rows: list[_Row]) -> list[_Row]:
    """Runs of the same op with the same result on one rank (a retry loop) as one row: `(x128, to step 129)`."""
    out: list[_Row] = []
    run = 1
    for row in rows + [_Row("end", "")]:
        prev = out[-1] if out else None
        if (prev is not None and row.kind == prev.kind == "op" and row.rank == prev.rank and row.text == prev.text
                and row.phase == prev.phase and not row.hung and not prev.hung
                and row.result.split("  (x")[0] == prev.result.split("  (x")[0]):
            run += 1
            prev.result = f"{prev.result.split('  (x')[0]}  (x{run}, to step {row.step})"
            continue
        run = 1
        if row.kind != "end":
            out.append(row)
    return out


def _results_text(results: dict[int, str], n: int) -> str:
    """`-> 1 (every rank)` when all ranks got the same, else each rank's."""
    if len(results) == n and len(set(results.values())) == 1:
        return f"-> {next(iter(results.values()))}" + (" (every rank)" if n > 1 else "")
    return " ".join(f"r{r}: {v}" for r, v in sorted(results.items()))


def _ops_rows(trace: Trace, keys: _Keys) -> list[_Row]:
    """One row per recorded op: `engines.storeops.run_ops` records (result, oracle, outcome, seconds) or the
    bare ops of a property-test counterexample (op, rank, key/keys/value/handle)."""
    rows = []
    skip = {"rank", "op", "key", "keys", "handle", "result", "value", "oracle", "outcome", "expected", "hung",
            "error", "status", "elapsed", "seconds", "duration", "time", "start", "end", "timeout", "args", "index"}
    for i, op in enumerate(trace.ops):
        if not isinstance(op, dict):
            continue
        rank = _int(op.get("rank"))
        name = str(op.get("op"))
        text = name + (f" h{op['handle']}" if _int(op.get("handle")) is not None else "")
        text += f" {keys(op['key'])}" if "key" in op else ""
        if isinstance(op.get("keys"), list):
            text += " [" + ",".join(keys(k) for k in op["keys"][:4]) + (",.." if len(op["keys"]) > 4 else "") + "]"
        size = _nbytes(op.get("value"))
        if size is not None:
            text += f" {size}B"
        if _num(op.get("timeout")) is not None:
            text += f" t={op['timeout']:g}"
        extra = [f"{k}={_brief(v, 12)}" for k, v in op.items() if k not in skip]
        if extra:
            text += " " + " ".join(extra)
        t = next((_num(op[k]) for k in ("time", "start") if _num(op.get(k)) is not None), None)
        if "result" in op and (name in ("put", "delete") and op["result"] is None):
            res = "ok"
        elif "result" in op and isinstance(op["result"], bool):
            res = "yes" if op["result"] else "no"
        elif "result" in op:
            res = _result(op["result"])
        elif "status" in op:
            res = _brief(op["status"], 20)
        else:
            res = "ok" if name.lower() in ("put", "delete", "close") else ""
        dur = next((_num(op[k]) for k in ("elapsed", "seconds", "duration") if _num(op.get(k)) is not None), None)
        if dur is not None:
            res += f" in {dur:g}s"
        if op.get("error"):
            res += f" error {_clip(str(op['error']), 30)}"
        outcome = op.get("outcome")
        if "oracle" in op and outcome not in (None, "ok", "hang") and name not in ("put", "delete"):
            res += f" (oracle: {_result(op['oracle'])})"
        if isinstance(outcome, str) and outcome not in ("ok", "hang", "mismatch"):
            res += f" raised {_clip(outcome, 40)}"
        row = _Row("op", "ops", _int(op.get("index")) if _int(op.get("index")) is not None else i, t, rank,
                   text.strip(), res.strip())
        status = str(op.get("status", outcome or "")).lower()
        if op.get("hung") or status in ("hung", "hang", "never returned") or (
                isinstance(op.get("error"), str) and re.search(r"hang|did not return|never", op["error"], re.I)):
            row.hung, row.result = "never returned", "never returns" + (f" ({res})" if res else "")
        rows.append(row)
    return rows


def _plural(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _locate(trace: Trace, rows: list[_Row], n: int) -> tuple[list[_Violation], dict[int, str]]:
    """Every violation of the verdict, with the row and rank where it is marked."""
    out: list[_Violation] = []
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
        rank = _int(detail.get("rank"))
        mark = _Violation(prop, f"!! {prop}: {summary}", rank)
        if trace.kind == "store-ops" and prop != "hang":
            # the op that failed: the one the detail names, else the last one recorded (recording stops there)
            index = _int(detail.get("index"))
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
        elif prop == "hang":
            at = [i for i, r in enumerate(rows) if r.hung and (rank is None or r.rank == rank)]
            index = _int(detail.get("index", detail.get("op")))
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
        elif prop == "desync" and _int(detail.get("collective")) is not None:
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
        elif prop == "deadlock":
            wf = detail.get("waits_for") if isinstance(detail.get("waits_for"), dict) else {}
            mark.waits_for = {int(r): [int(q) for q in qs] for r, qs in wf.items()
                              if _int(r) is not None and isinstance(qs, list)}
            finished = _ints(detail.get("finished"))
            parts = []
            for r, qs in sorted(mark.waits_for.items()):
                k = max((x.coll for x in rows if x.kind == "arrive" and x.rank == r and x.coll is not None),
                        default=None)
                at = [i for i, x in enumerate(rows) if x.kind == "arrive" and x.rank == r and x.coll == k]
                if at:
                    rows[at[-1]].bad, rows[at[-1]].prop = "stuck", prop
                    if mark.row is None:
                        mark.row, mark.rank = at[-1], r
                parts.append(f"rank {r} waits{f' in collective #{k}' if k is not None else ''} for {_plural(qs)}")
                bad_status[r] = f"waits in #{k}" if k is not None else "waits"
            if finished:
                parts.append(f"{_plural(finished)} finished without entering it")
                for q in finished:
                    bad_status.setdefault(q, "finished")
            cycle = _ints(detail.get("cycle"))
            if cycle:
                parts.append("cycle " + " -> ".join(map(str, list(cycle) + [cycle[0]])))
            if parts:
                mark.text = "!! deadlock: " + "; ".join(parts)
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
            stuck = _ints(detail.get("ranks"))
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


def _header(trace: Trace, n: int) -> tuple[str, list[str]]:
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
            lines.append("schedule " + _clip(" ".join(map(str, trace.schedule)), 100))
        lines.append(f"keys     cI = kv:<hash of chunk I>:pcp{cfg.get('n_ranks')}:r<rank>; hI = GetAsync handle I")
    else:
        lines.append(f"config   {_brief(cfg, 100)}" if cfg else "config   -")
        lines.append(f"ops      {len(trace.ops)} store-client operations over {n} rank(s)")
    lines.append(f"verdict  {verdict}" + (f"   expect {trace.expect}" if trace.expect else ""))
    for v in violations:
        if isinstance(v, dict):
            lines.append(f"         {v.get('property')}: {v.get('summary')}")
    if trace.notes:
        lines.append(f"notes    {_clip(trace.notes, 100)}")
    return title, lines


def _faults_text(faults: Any) -> str:
    if not isinstance(faults, dict):
        return "-"
    parts = []
    for name in ("evict_before_lookup", "evict_after_lookup", "evict_during_load"):
        for e in faults.get(name, []) or []:
            if isinstance(e, dict):
                where = f"r{e['rank']}" if e.get("rank") is not None else "all"
                at = f" @step {e['step']}" if e.get("step") is not None else ""
                parts.append(f"{name} c{e.get('chunk')} ({where}){at}")
    for x in faults.get("lost", []) or []:
        if isinstance(x, list) and len(x) == 2:
            parts.append(f"lost: rank {x[0]}'s GetAsync #{x[1]} never completes")
    for x in faults.get("delayed", []) or []:
        if isinstance(x, list) and len(x) == 3:
            parts.append(f"delayed: rank {x[0]}'s GetAsync #{x[1]} by {x[2]}s")
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


def _picture(trace: Trace) -> _Picture:
    trace = _normalized(trace)
    keys = _Keys(trace)
    items = trace.ops if trace.kind == "store-ops" else trace.events
    seen = [r for e in items if isinstance(e, dict) and (r := _int(e.get("rank"))) is not None]
    n = min(max(_int(trace.config.get("n_ranks")) or 1, max(seen, default=0) + 1), _MAX_RANKS)
    rows = _ops_rows(trace, keys) if trace.kind == "store-ops" else _protocol_rows(trace, keys, n)
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
                    violations.append(_Violation("hang", f"!! hang: rank {row.rank} never returns from {row.text}",
                                                 row.rank, i))
    title, header = _header(trace, n)
    for row in rows:  # nothing from the trace reaches a terminal or the SVG with control characters
        row.text, row.result, row.hung, row.bad = map(_safe, (row.text, row.result, row.hung, row.bad))
    for v in violations:
        v.text = _safe(v.text)
    return _Picture(_safe(title), _safe(str(trace.summary)), [_safe(h) for h in header], n, rows,
                    {r: _safe(s) for r, s in status.items()}, bad_status, violations, trace.kind)


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def _safe(text: str) -> str:
    return _CONTROL.sub("?", text)


# -- the terminal timeline ---------------------------------------------------------------------------------
_RED, _RESET = "\x1b[31m", "\x1b[0m"


def timeline(trace: Trace, *, width: int = 120, color: bool = False) -> str:
    """The trace as plain text: a header, then one row per event and one column (lifeline) per rank."""
    p = _picture(trace)
    prefix = 18
    col = max(14, min(52, (width - prefix) // max(1, p.n)))
    red = (lambda s: f"{_RED}{s}{_RESET}") if color else (lambda s: s)
    out = [_clip(f"== shardcheck trace: {p.title}", width)] + _wrap(f"summary  {p.summary}", width)[:6]
    out += [_clip(h, width) for h in p.header] + [""]
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
                parts.append(_clip(cell, col - 1).ljust(col))
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
            out.extend(red(" " * prefix + line) for line in _wrap(v.text, width - prefix))
    out.append("-- end " + "-" * max(0, min(width, prefix + col * p.n) - 7))
    cells = {r: ("X " if p.status[r] == "HUNG" else "# " if r in p.bad_status else "o ") + p.status[r]
             for r in range(p.n)}
    end = f"{'end':<6}{'':>5}{'':>6} " + lifelines(cells)
    out.append(red(end) if p.bad_status else end)
    for v in p.violations:
        if v.waits_for:
            for r, qs in sorted(v.waits_for.items()):
                out.append(red(" " * prefix + f"wait-for: rank {r} --waits for--> {_plural(qs)} "
                               f"({', '.join(p.status.get(q, '?') for q in qs)})"))
    if p.violations:
        out.append("")
        out.extend(red(line) for v in p.violations for line in _wrap(v.text, width))
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
        inner = " " + _clip(text, max(1, width - 4)) + " "
    left = (width - 2 - len(inner)) // 2
    band = "+" + fill * left + inner + fill * (width - 2 - len(inner) - left) + "+"
    before = "".join((" " if r in gone else "|").ljust(col) for r in range(lo))
    after = "".join((" " if r in gone else "|").ljust(col) for r in range(hi + 1, n))
    return (before + band + " " + after).rstrip()


# -- the SVG sequence diagram --------------------------------------------------------------------------
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


def svg(trace: Trace) -> str:
    """The trace as an SVG sequence diagram (well-formed XML; the violation in red, `class="violation"`)."""
    p = _picture(trace)
    d = _Svg()
    width = max(_LEFT + p.n * _COL + 120, 800)
    d.text(12, 22, _clip(f"shardcheck: {p.title}", int((width - 24) / 9.2)), class_="title")
    y = 42
    for line in _wrap(p.summary, int((width - 24) / _CH))[:6]:
        d.text(12, y, line, class_="head", font_style="italic")
        y += 14
    y += 4
    for line in p.header:
        d.text(12, y, _clip(line, int((width - 24) / _CH)), class_="head")
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
                d.text((x0 + x1) / 2, y + 25, _clip(row.result, int((x1 - x0) / _CH)), parent, text_anchor="middle")
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
        y += 8 if marks else 0
        for v in marks:
            g = d.violation(v.prop, v.rank, data_note=i)
            for line in _wrap(v.text, int((width - _LEFT - 20) / _CH)):
                d.text(_LEFT, y + 4, line, g, fill=RED)
                y += 15
            y += 4
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
        for line in _wrap(v.text, int((width - 24) / 6.7)):
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


def _bad_prop(p: _Picture, rank: int) -> str:
    return next((v.prop for v in p.violations if v.rank == rank), p.violations[0].prop if p.violations else "")


def _wrap(text: str, width: int) -> list[str]:
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


# -- the command -------------------------------------------------------------------------------------------
def show_command(path: str, svg_out: str | None) -> int:
    """`shardcheck show PATH [--svg OUT]`: print the timeline, write the SVG; 2 on a bad trace or OUT."""
    try:
        trace = Trace.load(path)
    except TraceError as exc:
        print(f"shardcheck show: {exc}", file=sys.stderr)
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
    sys.stdout.write(timeline(trace))
    if svg_out is not None:
        try:
            Path(svg_out).write_text(svg(trace), encoding="utf-8")
        except OSError as exc:
            print(f"shardcheck show: cannot write the SVG to {svg_out}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        print(f"wrote {svg_out}")
    return 0
