"""`shardcheck replay`: saved traces re-run on the client and protocol each records (unless `--client` /
`--protocol` say otherwise); one row per file naming what ran, bad files included as `error` rows.

Against a protocol that plans other steps than the recorded one (a fix), the recorded schedule is a hint: when it no
longer fits, the trace's configuration and faults are re-run under `HINT_SCHEDULES` other schedules (the lowest
runnable rank first, then seeded random ones), and the answer is `reproduces` if any shows the property, else
`fixed` -- never `error` for a protocol that merely behaves differently.
"""
from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Any

import attrs

from shardcheck.commands import _runner, client_of, protocol_of
from shardcheck.errors import EXIT_HELD, EXIT_USAGE, EXIT_VIOLATED, UsageError
from shardcheck.output import print_json

__all__ = ["run_replay", "cmd_replay", "trace_paths", "HINT_SCHEDULES"]

#: Schedules tried when a recorded schedule no longer fits the protocol replayed.
HINT_SCHEDULES = 32


def trace_paths(paths: list[str]) -> list[Path]:
    """Every trace file named: files as given, directories' `*.json` (not recursive), sorted."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(p.glob("*.json")))
        elif p.exists():
            out.append(p)
        else:
            raise UsageError(f"{p}: no such file or directory")
    if not out:
        raise UsageError(f"no trace files (*.json) in {', '.join(paths)}")
    return out


def _protocol_outcome(trace: Any, protocol: Any, run: Any) -> tuple[str, str]:
    from model.sim import ScheduleError
    case = trace.case()
    try:
        violations, note = run(protocol.obj, case).violations, ""
    except ScheduleError as exc:
        violations, note = [], f"the recorded schedule no longer fits ({exc})"
        for i in range(HINT_SCHEDULES + 1):
            violations = run(protocol.obj, attrs.evolve(case, schedule=(), seed=None if i == 0 else i)).violations
            if trace.property in {v.property for v in violations}:
                note += f"; shown under schedule {i + 1} of {HINT_SCHEDULES + 1} tried"
                break
        else:
            note += f"; not shown under {HINT_SCHEDULES + 1} other schedules"
    props = [v.property for v in violations]
    if trace.property in props:
        why = next(v.summary for v in violations if v.property == trace.property)
        return "reproduces", f"{why} ({note})" if note else why
    why = "no violation" if not props else f"other violations only: {', '.join(sorted(set(props)))}"
    return "fixed", f"{why} ({note})" if note else why


def _store_ops_outcome(trace: Any, client: Any) -> tuple[str, str]:
    """A store-ops trace on fresh, bounded stores of the client (`engines.storeops.bounded_factory`)."""
    from engines.storeops import bounded_factory, run
    try:
        _, violations = run(trace, bounded_factory(trace, client))
    except (ValueError, KeyError, TypeError) as exc:
        return "error", f"ops: {exc}"
    if violations and violations[0]["detail"].get("index") == -1 and trace.property != "store-error":
        return "error", violations[0]["summary"]
    if any(v["property"] == trace.property for v in violations):
        return "reproduces", violations[0]["summary"]
    return "fixed", "no violation" if not violations else f"other violation: {violations[0]['summary']}"


def run_replay(paths: list[str], client_spec: str | None = None, protocol_spec: str | None = None, *,
               op_timeout: float | None = None, runner: str = "sim") -> list[dict]:
    """`shardcheck replay` as a function: one row per trace file (bad files as `error` rows)."""
    from model.calls import DEFAULT_OP_TIMEOUT
    from model.trace import Trace, TraceError
    rows: list[dict] = []
    loaded: list[tuple[Path, Any, dict]] = []
    for p in trace_paths(paths):
        row = {"path": str(p), "client": client_spec or "-", "protocol": protocol_spec or "-", "property": None,
               "outcome": "error", "expected": None, "matches": False, "why": "", "seconds": 0.0}
        rows.append(row)
        try:
            trace = Trace.load(p)
        except TraceError as exc:
            row["why"] = str(exc)
            continue
        row.update(client=client_spec or trace.client, property=trace.property)
        row["expected"] = trace.expect.get(row["client"])
        loaded.append((p, trace, row))
    runners: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        for p, trace, row in loaded:
            t0 = time.monotonic()
            try:
                client = client_of(row["client"])
                if trace.kind == "store-ops":
                    row["outcome"], row["why"] = _store_ops_outcome(trace, client)
                elif trace.kind == "concurrent":  # a racy finding, judged by its recorded rate (engines.racy)
                    from engines.racy import needs_shared, replay, targets
                    options = client.accepted({k: trace.config[k] for k in ("op_timeout",) if k in trace.config})
                    fresh, not_shared = targets(client, **options)
                    if not_shared and needs_shared(trace):
                        raise UsageError(f"the trace runs several clients of the same server, and {not_shared}")
                    row["outcome"], row["why"] = replay(trace, lambda n, **o: client.stores(n, **o), options=options,
                                                        shared=None if not_shared else fresh)
                else:
                    protocol = protocol_of(protocol_spec or trace.protocol.get("ref") or trace.protocol["name"])
                    row["protocol"] = protocol_spec or protocol.ref
                    if client.name not in runners:
                        runners[client.name] = stack.enter_context(
                            _runner(client, op_timeout or DEFAULT_OP_TIMEOUT, runner))
                    row["outcome"], row["why"] = _protocol_outcome(trace, protocol, runners[client.name])
            except UsageError as exc:
                row["outcome"], row["why"] = "error", str(exc)
            except Exception as exc:  # noqa: BLE001 - whatever stops this trace from running is its row's error
                row["outcome"], row["why"] = "error", f"{type(exc).__name__}: {exc}"
            row["matches"] = row["outcome"] == row["expected"]
            row["seconds"] = round(time.monotonic() - t0, 3)
    return rows


def add_arguments(r: Any) -> None:
    r.add_argument("paths", nargs="+", metavar="PATH", help="trace files or directories of them")
    r.add_argument("--client", default=None,
                   help="run every trace on this client (default: the client each trace records)")
    r.add_argument("--protocol", default=None,
                   help="run every protocol trace under this protocol (default: the one each trace records)")
    r.add_argument("--op-timeout", type=float, default=None, metavar="SECONDS",
                   help="seconds one store call may take before it is a hang (default: 2; store-ops traces use "
                        "the timeout they record)")
    r.add_argument("--expect", action="store_true",
                   help="exit 0 iff every outcome equals the trace's expectation for the client that ran it "
                        "(default: off: exit 1 when any reproduces)")
    r.add_argument("--runner", choices=("sim", "processes"), default="sim",
                   help="sim: every rank in one simulator; processes: one OS process per rank with real collectives "
                        "(default: sim)")
    r.add_argument("--json", action="store_true", help="print the rows as JSON (default: a table)")


def cmd_replay(args: Any) -> int:
    rows = run_replay(args.paths, args.client, args.protocol, op_timeout=args.op_timeout, runner=args.runner)
    if args.json:
        print_json({"results": rows})
    else:
        w = max(len(r["path"]) for r in rows)
        cw = max(len("client"), *(len(r["client"]) for r in rows))
        print(f"{'trace':<{w}}  {'client':<{cw}}  {'property':<16} {'outcome':<10} {'expected':<10} why")
        for r in rows:
            if not args.expect or r["matches"] or r["outcome"] == "error":
                flag = ""
            elif r["expected"] is None:
                flag = f"  <-- no expectation recorded for client {r['client']}"
            else:
                flag = f"  <-- expected {r['expected']}"
            print(f"{r['path']:<{w}}  {r['client']:<{cw}}  {r['property'] or '-':<16} {r['outcome']:<10} "
                  f"{r['expected'] or '-':<10} {r['why']}{flag}")
    errors = [r for r in rows if r["outcome"] == "error"]
    for r in errors:
        print(f"shardcheck replay: error: {r['why']}", file=sys.stderr)
    if errors:
        return EXIT_USAGE
    if args.expect:
        return EXIT_HELD if all(r["matches"] for r in rows) else EXIT_VIOLATED
    return EXIT_VIOLATED if any(r["outcome"] == "reproduces" for r in rows) else EXIT_HELD
