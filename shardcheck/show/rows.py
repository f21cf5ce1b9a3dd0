"""A trace's events (or store-client ops) as rows: one per op, arrival, collective, eviction or lookup step."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from model.faults import FAULT_KINDS
from model.trace import Trace
from shardcheck.show.keys import Keys
from shardcheck.show.text import as_int, as_num, brief, clip, nbytes, read_result

__all__ = ["Row", "protocol_rows", "ops_rows"]


@dataclass
class Row:
    """One event drawn on a lifeline, or across several."""

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


def _effect_name(effect: Any) -> str:
    if isinstance(effect, dict):
        if "$effect" in effect:
            return str(effect["$effect"])
        if "$evict" in effect:
            return "Evict"
    if isinstance(effect, list) and effect:
        return str(effect[0])
    return str(effect)


def _eviction_text(e: dict, when: str = "") -> tuple[str, tuple[int, ...] | None]:
    rank = as_int(e.get("rank"))
    where = f"r{rank}" if rank is not None else "all stores"
    return f"evict c{e.get('chunk')} ({where}){' ' + when if when else ''}", (rank,) if rank is not None else None


def protocol_rows(trace: Trace, keys: Keys, n: int) -> list[Row]:
    rows: list[Row] = []
    handles: dict[tuple[int, int], str] = {}
    arrivals: dict[int, int] = {}
    faults = trace.faults if isinstance(trace.faults, dict) else {}
    all_ranks = tuple(range(n))

    def evictions(when: str, words: str) -> None:
        """The trace's evictions at `when` (`model.faults.FaultKind.when`), as rows of the lookup."""
        kinds = [k for k in FAULT_KINDS if k.family == "harness" and k.when == when]
        for e in (e for k in kinds for e in faults.get(k.field, []) or []):
            if isinstance(e, dict):
                text, ranks = _eviction_text(e, words)
                rows.append(Row("evict", "lookup", text=text, ranks=ranks or all_ranks))

    phase_seen: set[str] = set()
    for ev in trace.events:
        if not isinstance(ev, dict):
            continue
        phase = str(ev.get("phase", ""))
        if phase == "lookup" and "lookup" not in phase_seen:
            evictions("before-lookup", "before lookup")
        phase_seen.add(phase)
        effect, res, note = ev.get("effect"), ev.get("result"), str(ev.get("note") or "")
        rank = as_int(ev.get("rank"))
        row = Row("op", phase, as_int(ev.get("step")), as_num(ev.get("time")), rank)
        name = _effect_name(effect)
        if note == "evict" or name == "Evict":
            e = effect.get("$evict", {}) if isinstance(effect, dict) else {}
            text, ranks = _eviction_text(e if isinstance(e, dict) else {})
            row.kind, row.text, row.ranks = "evict", text, ranks or all_ranks
        elif name == "contains" and isinstance(effect, list) and len(effect) == 2:
            row.text, row.result = f"has {keys(effect[1], rank)}?", "yes" if res else "no"
        elif name == "report":
            row.kind, row.text = "report", f"report {brief(res)}"
        elif name == "combine":
            row.kind, row.text = "combine", f"plan: combine({note or 'reports'}) -> {brief(res)}"
            rows.append(row)
            evictions("after-lookup", "after lookup")
            continue
        elif name in ("AllReduceMin", "AllGather", "Broadcast") and isinstance(effect, dict):
            val = brief(effect.get("value"), 24)
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
                        last.results[rank] = brief(res, 40)
                        last.result = _results_text(last.results, n)
                    continue
                row.kind, row.coll, row.rank = "collective", k, None
                row.text = f"#{k} {name}{root} complete" if k is not None else f"{name}{root} complete"
                row.ranks = (rank,) if rank is not None else ()
                if rank is not None:
                    row.results[rank] = brief(res, 40)
                row.result = _results_text(row.results, n) if rank is not None else brief(res, 40)
        elif name in ("Put", "Get", "GetAsync", "Wait") and isinstance(effect, dict):
            if name == "Put":
                size = nbytes(effect.get("value"))
                row.text = f"Put {keys(effect.get('key'), rank)}" + (f" {size}B" if size is not None else "")
                row.result = "ok" if res is None else brief(res, 16)
            elif name == "Get":
                row.text, row.result = f"Get {keys(effect.get('key'), rank)}", read_result(res)
                row.reads = effect.get("key")
            elif name == "GetAsync":
                row.reads = effect.get("key")
                h = res.get("$handle") if isinstance(res, dict) else None
                row.text = f"GetAsync {keys(effect.get('key'), rank)}"
                if isinstance(h, list) and len(h) == 3:
                    handles[(h[0], h[1])] = keys(h[2], rank)
                    row.result = f"h{h[1]}"
                else:
                    row.result = brief(res, 16)
            else:
                h = effect.get("handle", {})
                h = h.get("$handle") if isinstance(h, dict) else None
                what = f"h{h[1]} {handles.get((h[0], h[1]), keys(h[2], rank))}" if isinstance(h, list) and len(h) == 3 \
                    else brief(effect.get("handle"), 16)
                t = effect.get("timeout")
                row.text = f"Wait {what} " + (f"t={t:g}" if as_num(t) is not None else "no timeout")
                row.result = read_result(res)
            if note == "waits forever":
                row.hung, row.result = "waits forever", "never returns"
            elif note.startswith("client hang"):
                row.hung, row.result = note, "never returns"
        else:
            row.text, row.result = clip(f"{name} {brief(effect, 30)}", 40), brief(res, 20)
            if note:
                row.result += f" ({clip(note, 30)})"
        rows.append(row)
    if "lookup" not in phase_seen:
        evictions("before-lookup", "before lookup")
    return _collapse(rows)


def _collapse(rows: list[Row]) -> list[Row]:
    """Runs of the same op with the same result on one rank (a retry loop) as one row: `(x128, to step 129)`."""
    out: list[Row] = []
    run = 1
    for row in rows + [Row("end", "")]:
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


def _fault_row(op: dict, i: int, rank: int | None) -> Row:
    """A store-ops trace's fault op (`{"op": "fault", "fault", "rank", "seconds"}`) or its recovery."""
    index = as_int(op.get("index")) if as_int(op.get("index")) is not None else i
    if op.get("op") == "fault":
        secs = as_num(op.get("seconds"))
        text = f"STRIKE {str(op.get('fault', '?')).removeprefix('server_')}" + (f" for {secs:g}s" if secs else "")
        return Row("op", "ops", index, None, rank, text, "struck" if op.get("outcome") == "struck" else "")
    back = op.get("recovered") if isinstance(op.get("recovered"), dict) else {}
    res = ", ".join(f"rank {r} recovered in {brief(v, 8)}s" for r, v in back.items()) or brief(op.get("outcome"), 40)
    return Row("op", "ops", index, None, rank, "RECOVER (servers back, probe)", res)


def ops_rows(trace: Trace, keys: Keys) -> list[Row]:
    """One row per recorded op: `checking.storeops.run_ops` records (result, oracle, outcome, seconds) or the
    bare ops of a property-test counterexample (op, rank, key/keys/value/handle)."""
    rows = []
    skip = {"rank", "op", "key", "keys", "handle", "result", "value", "oracle", "outcome", "expected", "hung",
            "error", "status", "elapsed", "seconds", "duration", "time", "start", "end", "timeout", "args", "index"}
    for i, op in enumerate(trace.ops):
        if not isinstance(op, dict):
            continue
        rank = as_int(op.get("rank"))
        name = str(op.get("op"))
        if name in ("fault", "recover"):  # a real fault on the servers, and the recovery after it (the nemesis)
            rows.append(_fault_row(op, i, rank))
            continue
        text = name + (f" h{op['handle']}" if as_int(op.get("handle")) is not None else "")
        text += f" {keys(op['key'], rank)}" if "key" in op else ""
        if isinstance(op.get("keys"), list):
            text += " [" + ",".join(keys(k, rank) for k in op["keys"][:4]) + (",.." if len(op["keys"]) > 4 else "") + "]"
        size = nbytes(op.get("value"))
        if size is not None:
            text += f" {size}B"
        if as_num(op.get("timeout")) is not None:
            text += f" t={op['timeout']:g}"
        extra = [f"{k}={brief(v, 12)}" for k, v in op.items() if k not in skip]
        if extra:
            text += " " + " ".join(extra)
        t = next((as_num(op[k]) for k in ("time", "start") if as_num(op.get(k)) is not None), None)
        if "result" in op and (name in ("put", "delete") and op["result"] is None):
            res = "ok"
        elif "result" in op and isinstance(op["result"], bool):
            res = "yes" if op["result"] else "no"
        elif "result" in op:
            res = read_result(op["result"])
        elif "status" in op:
            res = brief(op["status"], 20)
        else:
            res = "ok" if name.lower() in ("put", "delete", "close") else ""
        dur = next((as_num(op[k]) for k in ("elapsed", "seconds", "duration") if as_num(op.get(k)) is not None), None)
        if dur is not None:
            res += f" in {dur:g}s"
        if op.get("error"):
            res += f" error {clip(str(op['error']), 30)}"
        outcome = op.get("outcome")
        if "oracle" in op and outcome not in (None, "ok", "hang") and name not in ("put", "delete"):
            res += f" (oracle: {read_result(op['oracle'])})"
        if isinstance(outcome, str) and outcome not in ("ok", "hang", "mismatch"):
            res += f" raised {clip(outcome, 40)}"
        row = Row("op", "ops", as_int(op.get("index")) if as_int(op.get("index")) is not None else i, t, rank,
                   text.strip(), res.strip())
        status = str(op.get("status", outcome or "")).lower()
        if op.get("hung") or status in ("hung", "hang", "never returned") or (
                isinstance(op.get("error"), str) and re.search(r"hang|did not return|never", op["error"], re.I)):
            row.hung, row.result = "never returned", "never returns" + (f" ({res})" if res else "")
        rows.append(row)
    return rows
