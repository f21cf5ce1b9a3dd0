"""`shardcheck replay`: saved traces re-run on the client and protocol each records (unless `--client` /
`--protocol` say otherwise); one row per file naming what ran, bad files included as `error` rows.

Each trace is judged by the rate it records (`engines.replay.judge`): `reproduces` as soon as a run shows its
property, `fixed` only after as many clean runs as that rate asks at 99%. Against a protocol that plans other steps
than the recorded one (a fix), the recorded schedule is a hint: other schedules of the same case are tried, and the
answer is `reproduces` or `fixed`, never `error`, for a protocol that merely behaves differently.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from shardcheck.errors import EXIT_HELD, EXIT_USAGE, EXIT_VIOLATED, UsageError
from shardcheck.output import print_json
from shardcheck.targets import (add_engine_arguments, add_nemesis_arguments, add_target_arguments, build_engine_target,
                                build_target, fresh_runner_of, nemesis_plan_of, parse_options)

__all__ = ["run_replay", "cmd_replay", "trace_paths"]

#: Seconds between two progress lines of one long replay (a racy trace on a fixed target may ask for many runs).
PROGRESS_EVERY = 10.0


def _progress_of(path: str) -> Any:
    """`judge`'s progress callback for `path`: a line on stderr at most every `PROGRESS_EVERY` seconds."""
    last = [time.monotonic()]

    def report(done: int, need: int) -> None:
        now = time.monotonic()
        if now - last[0] >= PROGRESS_EVERY:
            last[0] = now
            print(f"  ... {path}: {done} of {need} clean runs", file=sys.stderr, flush=True)
    return report


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


def run_replay(paths: list[str], client_spec: str | None = None, protocol_spec: str | None = None, *,
               op_timeout: float | None = None, runner: str = "sim", options: list[str] | dict | None = None,
               nemesis: str | None = None, engine: str | None = None, engine_options: list[str] | dict | None = None,
               engine_patches: Any = ()) -> list[dict]:
    """`shardcheck replay` as a function: one row per trace file (bad files and traces that cannot run as `error`
    rows), each judged by its recorded rate (`engines.replay.judge`). A trace's real-server faults strike at the same
    step through the nemesis (`--nemesis`: as for `check`). An `engine` trace runs on the serving engine it records
    (its options and patches) unless `engine` names another (with `engine_patches`); `engine_options` override the
    options it records, which hold on any engine (its case's conditions, e.g. `lookup_timeout_ms`). A long replay
    reports its clean runs on stderr."""
    from engines.replay import ReplayError, ReplayOn, judge
    from model.calls import DEFAULT_OP_TIMEOUT
    from model.trace import Trace, TraceError
    op_timeout = op_timeout or DEFAULT_OP_TIMEOUT
    rows: list[dict] = []
    loaded: list[tuple[Any, dict]] = []
    for p in trace_paths(paths):
        row = {"path": str(p), "client": client_spec or "-", "protocol": protocol_spec or "-", "property": None,
               "outcome": "error", "expected": None, "matches": False, "why": "", "runs": 0, "seconds": 0.0}
        rows.append(row)
        try:
            trace = Trace.load(p)
        except TraceError as exc:
            row["why"] = str(exc)
            continue
        row.update(client=client_spec or trace.client, property=trace.property)
        if trace.kind == "engine":
            row.update(client=engine or trace.config["engine"], engine=engine or trace.config["engine"])
        row["expected"] = trace.expect.get(row["client"])
        loaded.append((trace, row))
    targets: dict[tuple[str, str], Any] = {}
    for trace, row in loaded:
        t0 = time.monotonic()
        if trace.kind == "engine":
            _engine_row(trace, row, engine, engine_options, engine_patches, targets, _progress_of(row["path"]))
            row["matches"] = row["outcome"] == row["expected"]
            row["seconds"] = round(time.monotonic() - t0, 3)
            continue
        try:
            spec = (protocol_spec or trace.protocol.get("ref") or trace.protocol["name"]) \
                if trace.kind == "protocol" else None
            key = (row["client"], spec or "")
            if key not in targets:  # (each client's tier is checked once: unreachable is an error row, not a verdict)
                targets[key] = build_target(spec, row["client"], options=options, runner=runner, op_timeout=op_timeout)
            target = targets[key]
            if spec is not None:
                row["protocol"] = protocol_spec or target.protocol.ref
            plan = nemesis_plan_of(target, nemesis)
            on = ReplayOn(client=target.client, protocol=target.protocol,
                          runner=fresh_runner_of(target, op_timeout, plan), runner_name=runner,
                          options=dict(target.client_options), op_timeout=op_timeout, nemesis=plan)
            verdict = judge(trace, on, _progress_of(row["path"]))
            row["outcome"], row["why"], row["runs"] = verdict.outcome, verdict.why, verdict.runs
        except (UsageError, ReplayError) as exc:
            row["outcome"], row["why"] = "error", str(exc)
        except Exception as exc:  # noqa: BLE001 - whatever stops this trace from running is its row's error
            row["outcome"], row["why"] = "error", f"{type(exc).__name__}: {exc}"
        row["matches"] = row["outcome"] == row["expected"]
        row["seconds"] = round(time.monotonic() - t0, 3)
    return rows


def _engine_row(trace: Any, row: dict, engine: str | None, options: list[str] | dict | None, patches: Any,
                targets: dict, progress: Any) -> None:
    """Judge one engine trace on fresh deployments of the serving engine it records (or `engine`)."""
    from engines.replay import ReplayError, ReplayOn, judge
    from shardcheck.targets import NotUnderTest
    spec = engine or trace.config["engine"]
    chosen = tuple(patches or ()) if engine else tuple(trace.config.get("patches", []))
    try:
        # the options a trace records are its case's conditions (e.g. the scheduler's lookup timeout): they hold on
        # whichever engine replays it; an --engine-option given overrides one of them
        given = dict(options) if isinstance(options, dict) else parse_options(list(options or []), "--engine-option")
        opts = {**dict(trace.config.get("options", {})), **given}
        key = ("engine", spec, repr(opts), chosen)
        if key not in targets:
            targets[key] = build_engine_target(spec, lookup=trace.config["case"].get("lookup", "sync"),
                                               options=opts, patches=chosen)
        on = ReplayOn(client=NotUnderTest(), engine=targets[key].engine)
        verdict = judge(trace, on, progress)
        row["outcome"], row["why"], row["runs"] = verdict.outcome, verdict.why, verdict.runs
    except (UsageError, ReplayError) as exc:
        row["outcome"], row["why"] = "error", str(exc)
    except (RuntimeError, ValueError) as exc:
        row["outcome"], row["why"] = "error", f"{type(exc).__name__}: {exc}"


def add_arguments(r: Any) -> None:
    r.add_argument("paths", nargs="+", metavar="PATH", help="trace files or directories of them")
    add_target_arguments(r)
    add_engine_arguments(r)
    r.add_argument("--op-timeout", type=float, default=None, metavar="SECONDS",
                   help="seconds one store call may take before it is a hang (default: 2; store-ops traces use "
                        "the timeout they record)")
    r.add_argument("--expect", action="store_true",
                   help="exit 0 iff every outcome equals the trace's expectation for the client that ran it "
                        "(default: off: exit 1 when any reproduces)")
    r.add_argument("--json", action="store_true", help="print the rows as JSON (default: a table)")
    add_nemesis_arguments(r)


def cmd_replay(args: Any) -> int:
    rows = run_replay(args.paths, args.client, args.protocol, op_timeout=args.op_timeout, runner=args.runner,
                      options=args.client_option, nemesis=args.nemesis, engine=args.engine,
                      engine_options=args.engine_option, engine_patches=args.engine_patch)
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
