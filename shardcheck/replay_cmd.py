"""`shardcheck replay`: saved traces re-run on the client and protocol each records (unless `--client` /
`--protocol` say otherwise); one row per file naming what ran, bad files included as `error` rows.

Each trace is judged by the rate it records (`checking.replay.judge`): `reproduces` as soon as a run shows its
property, `fixed` only after as many clean runs as that rate asks at 99%. A racy trace replayed on another subject
than the one it records is judged against that subject run alternately beside it (a control), when it can still
run: `reproduces`, `fixed`, or `undecided` (exit 4) when the bound on its runs came first. Against a protocol that
plans other steps than the recorded one (a fix), the recorded schedule is a hint: other schedules of the same case
are tried, and the answer is `reproduces` or `fixed`, never `error`, for a protocol that merely behaves differently.
Each trace's engine, patches and options apply to its own runs only, and its row names the engine with its patches.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from shardcheck.errors import EXIT_HELD, EXIT_UNDECIDED, EXIT_USAGE, EXIT_VIOLATED, UsageError
from shardcheck.output import print_json
from shardcheck.targets import (add_engine_arguments, add_nemesis_arguments, add_target_arguments,
                                build_engine_target, build_target, fresh_runner_of, nemesis_plan_of, parse_options)

__all__ = ["run_replay", "cmd_replay", "trace_paths", "replay_exit"]

#: Seconds between two progress lines of one long replay (a racy trace on a fixed target may ask for many runs).
PROGRESS_EVERY = 10.0


def _progress_of(path: str) -> Any:
    """`judge`'s progress callback for `path`: a line on stderr at most every `PROGRESS_EVERY` seconds."""
    last = [time.monotonic()]

    def report(done: int, need: int, what: str = "") -> None:
        now = time.monotonic()
        if now - last[0] >= PROGRESS_EVERY:
            last[0] = now
            print(f"  ... {path}: {done} of {need} {what or 'clean runs'}", file=sys.stderr, flush=True)
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
               engine_patches: Any = (), connector: str | None = None) -> list[dict]:
    """`shardcheck replay` as a function: one row per trace file (bad files and traces that cannot run as `error`
    rows), each judged by its recorded rate (`checking.replay.judge`), a racy one against its recorded subject run
    alternately beside it when the replay runs on another one that can run (a control: `_client_arms`,
    `_engine_arms`). A trace's real-server faults strike at the same step through the nemesis (`--nemesis`: as for
    `check`). An `engine` trace runs on the serving engine and patches it records unless `engine` or
    `engine_patches` name others (`engine` alone: no patches); `engine_options` override the options it records,
    which hold on any engine (its case's conditions, e.g. `lookup_timeout_ms`). Each trace's engine, patches and
    options apply to its own runs only (an engine with patches runs in a fresh process: `checking.replay_arm`). A
    long replay reports its progress on stderr."""
    from model.calls import DEFAULT_OP_TIMEOUT
    from checking.layers import layer_of
    from model.trace import Trace, TraceError, subject_key
    op_timeout = op_timeout or DEFAULT_OP_TIMEOUT
    rows: list[dict] = []
    loaded: list[tuple[Any, dict]] = []
    for p in trace_paths(paths):
        row = {"path": str(p), "client": client_spec or "-", "protocol": protocol_spec or "-", "property": None,
               "outcome": "error", "expected": None, "matches": False, "why": "", "runs": 0, "seconds": 0.0,
               "candidate": None, "control": None}
        rows.append(row)
        try:
            trace = Trace.load(p)
        except TraceError as exc:
            row["why"] = str(exc)
            continue
        row.update(client=client_spec or trace.client, property=trace.property)
        if layer_of(trace).subject == "engine":
            spec, chosen = _engine_subject(trace, engine, engine_patches)
            row.update(client=subject_key(spec, chosen), engine=spec, patches=list(chosen))
            if trace.kind == "stack":  # (its connector: the one given, else the one it records)
                row["connector"] = connector or trace.config["connector"]
            row["expected"] = trace.expected(spec, chosen)
        else:
            row["expected"] = trace.expected(row["client"])
        loaded.append((trace, row))
    targets: dict[tuple, Any] = {}
    try:
        _replay_each(loaded, targets, protocol_spec, options=options, runner=runner, op_timeout=op_timeout,
                     nemesis=nemesis, engine_options=engine_options)
    finally:  # (a serving stack started once for the traces it replays: closed with the replay)
        for target in targets.values():
            closing = getattr(getattr(target, "engine", None), "close", None)
            if callable(closing):
                closing()
    return rows


def _replay_each(loaded: list[tuple[Any, dict]], targets: dict, protocol_spec: str | None, *, options: Any,
                 runner: str, op_timeout: float, nemesis: str | None, engine_options: Any) -> None:
    """Judge each loaded trace into its row (see `run_replay`)."""
    from checking.layers import ReplayError, layer_of
    from checking.replay import judge
    for trace, row in loaded:
        t0 = time.monotonic()
        try:
            if layer_of(trace).subject == "engine":
                on, control = _engine_arms(trace, row, engine_options, targets)
            else:
                on, control = _client_arms(trace, row, protocol_spec, options=options, runner=runner,
                                           op_timeout=op_timeout, nemesis=nemesis, targets=targets)
            _judged(row, judge(trace, on, _progress_of(row["path"]), control=control), control)
        except (UsageError, ReplayError) as exc:
            row["outcome"], row["why"] = "error", str(exc)
        except Exception as exc:  # noqa: BLE001 - whatever stops this trace from running is its row's error
            row["outcome"], row["why"] = "error", f"{type(exc).__name__}: {exc}"
        row["matches"] = row["outcome"] == row["expected"]
        row["seconds"] = round(time.monotonic() - t0, 3)


def _judged(row: dict, verdict: Any, control: Any) -> None:
    """The row of a verdict: its outcome, why and runs, and a controlled replay's counts of both arms."""
    row["outcome"], row["why"], row["runs"] = verdict.outcome, verdict.why, verdict.runs
    if verdict.control is not None:
        row["candidate"] = {"k": verdict.candidate[0], "n": verdict.candidate[1]}
        row["control"] = {"subject": control.subject, "k": verdict.control[0], "n": verdict.control[1]}


def _racy(trace: Any) -> bool:
    """Whether the trace records a racy rate (only such a trace is judged against a control)."""
    from checking.replay import recorded_rate
    rate = recorded_rate(trace)
    return rate is not None and rate.racy


def _client_arms(trace: Any, row: dict, protocol_spec: str | None, *, options: Any, runner: str, op_timeout: float,
                 nemesis: str | None, targets: dict) -> tuple[Any, Any]:
    """What a store-ops, concurrent or protocol trace runs on (the client and protocol the row names), and its
    control: the client and protocol the trace records, with the options it records, when the row names others."""
    from checking.layers import layer_of
    from checking.replay import Control
    of_protocol = layer_of(trace).subject == "protocol"
    spec = (protocol_spec or trace.protocol.get("ref") or trace.protocol["name"]) if of_protocol else None
    on = _client_on(spec, row["client"], options, runner=runner, op_timeout=op_timeout, nemesis=nemesis,
                    targets=targets)
    if spec is not None:
        row["protocol"] = protocol_spec or on.protocol.ref
    if not _racy(trace):
        return on, None
    recorded = (trace.protocol.get("ref") or trace.protocol["name"]) if of_protocol else None
    subject = trace.client + (f" ({recorded})" if recorded else "")
    if row["client"] == trace.client and (spec is None or protocol_spec is None
                                          or protocol_spec in (trace.protocol.get("ref"), trace.protocol["name"])):
        return on, _itself(trace, subject, on)
    try:
        control = _client_on(recorded, trace.client, None, runner=runner, op_timeout=op_timeout, nemesis=nemesis,
                             targets=targets)
    except Exception as exc:  # noqa: BLE001 - a recorded subject that cannot run now: judged without a control
        return on, Control(subject, why=f"the recorded subject {subject} cannot run: {exc}")
    return on, Control(subject, on=control)


def _itself(trace: Any, subject: str, on: Any) -> Any:
    """The `Control` of a racy trace replayed on its recorded subject: none, and whether that subject's source is the
    one the trace records (`runtime.source`): unchanged, a race it does not show is the machine's, not a fix."""
    from checking.layers import layer_of
    from checking.replay import Control
    recorded = trace.config.get("source")
    now = layer_of(trace).source(client=on.client, protocol=on.protocol, engine=on.engine)
    if recorded is None or now is None:
        told = "the trace records no source" if recorded is None else "its source cannot be told now"
        return Control(subject, why=f"the candidate is the recorded subject; {told}")
    if recorded == now:
        return Control(subject, why=f"the candidate is the recorded subject, its source unchanged ({now})",
                       unchanged=True)
    return Control(subject, why=f"the candidate is the recorded subject, its source changed ({recorded} then, {now} "
                                f"now)")


def _client_on(protocol: str | None, client: str, options: Any, *, runner: str, op_timeout: float,
               nemesis: str | None, targets: dict) -> Any:
    """The `ReplayOn` of a client (and protocol), its target built once per replay (each client's tier is checked
    once: unreachable is an error row, not a verdict)."""
    from checking.layers import ReplayOn
    key = (client, protocol or "", repr(options))
    if key not in targets:
        targets[key] = build_target(protocol, client, options=options, runner=runner, op_timeout=op_timeout)
    target = targets[key]
    plan = nemesis_plan_of(target, nemesis)
    return ReplayOn.of(target, runner=fresh_runner_of(target, op_timeout, plan), op_timeout=op_timeout, nemesis=plan)


def _engine_subject(trace: Any, engine: str | None, patches: Any) -> tuple[str, tuple[str, ...]]:
    """The engine and patches an engine trace is replayed on: those given (`--engine` alone: no patches), else those
    it records."""
    recorded = tuple(trace.config.get("patches", []))
    chosen = tuple(patches) if patches else (() if engine else recorded)
    return engine or trace.config["engine"], chosen


def _engine_arms(trace: Any, row: dict, options: list[str] | dict | None, targets: dict) -> tuple[Any, Any]:
    """What an engine trace runs on (the engine and patches the row names, with the trace's options and the ones
    given), and its control: the engine and patches it records, under the same options, when the row names others."""
    from checking.layers import ReplayOn
    from checking.replay import Control
    from model.trace import subject_key
    given = dict(options) if isinstance(options, dict) else parse_options(list(options or []), "--engine-option")
    # the options a trace records are its case's conditions (e.g. the scheduler's lookup timeout): they hold on
    # whichever engine replays it (the control too); an --engine-option given overrides one of them
    opts = {**dict(trace.config.get("options", {})), **given}
    lookup = trace.config["case"].get("lookup", "sync")
    connector = row.get("connector")

    def on_engine(spec: str, patches: tuple[str, ...], conn: str | None = connector) -> Any:
        key = ("engine", spec, repr(opts), patches, conn)
        if key not in targets:
            targets[key] = build_engine_target(spec, lookup=lookup, options=opts, patches=patches, connector=conn)
        return ReplayOn.of(targets[key])

    on = on_engine(row["engine"], tuple(row["patches"]))
    if not _racy(trace):
        return on, None
    recorded = (trace.config["engine"], tuple(trace.config.get("patches", [])))
    if trace.kind == "stack" and connector != trace.config["connector"]:  # (the recorded connector is the control)
        recorded_on = on_engine(*recorded, trace.config["connector"])
        return on, Control(f"{subject_key(*recorded)} ({trace.config['connector']})", on=recorded_on)
    subject = subject_key(*recorded)
    if recorded == (row["engine"], tuple(row["patches"])):
        return on, _itself(trace, subject, on)
    try:
        return on, Control(subject, on=on_engine(*recorded))
    except Exception as exc:  # noqa: BLE001 - a recorded subject that cannot run now: judged without a control
        return on, Control(subject, why=f"the recorded subject {subject} cannot run: {exc}")


def add_arguments(r: Any) -> None:
    r.add_argument("paths", nargs="+", metavar="PATH", help="trace files or directories of them")
    add_target_arguments(r)
    add_engine_arguments(r)
    r.add_argument("--op-timeout", type=float, default=None, metavar="SECONDS",
                   help="seconds one store call may take before it is a hang (default: 2; store-ops traces use "
                        "the timeout they record)")
    r.add_argument("--expect", action="store_true",
                   help="exit 0 iff every outcome equals the trace's expectation for what ran it (an engine with "
                        "its patches: engine+MOD:ATTR); 4 when the only others are undecided (default: off: exit 1 "
                        "when any reproduces, 4 when any is undecided)")
    r.add_argument("--json", action="store_true", help="print the rows as JSON (default: a table)")
    add_nemesis_arguments(r)


def cmd_replay(args: Any) -> int:
    rows = run_replay(args.paths, args.client, args.protocol, op_timeout=args.op_timeout, runner=args.runner,
                      options=args.client_option, nemesis=args.nemesis, engine=args.engine,
                      engine_options=args.engine_option, engine_patches=args.engine_patch,
                      connector=args.connector)
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
    return replay_exit(rows, args.expect)


def replay_exit(rows: list[dict], expect: bool) -> int:
    """The exit code of a replay's rows: 2 when any is an error; with `expect`, 0 when every outcome is the one
    expected, 4 when the only ones that are not are `undecided`, else 1; without, 1 when any reproduces, else 4
    when any is `undecided`, else 0."""
    if any(r["outcome"] == "error" for r in rows):
        return EXIT_USAGE
    if expect:
        off = [r for r in rows if not r["matches"]]
        if not off:
            return EXIT_HELD
        return EXIT_UNDECIDED if all(r["outcome"] == "undecided" for r in off) else EXIT_VIOLATED
    if any(r["outcome"] == "reproduces" for r in rows):
        return EXIT_VIOLATED
    return EXIT_UNDECIDED if any(r["outcome"] == "undecided" for r in rows) else EXIT_HELD
