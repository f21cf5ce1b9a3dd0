"""The subcommands behind `shardcheck.cli`."""
from __future__ import annotations

import contextlib
import math
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from shardcheck.errors import EXIT_HELD, EXIT_USAGE, EXIT_VIOLATED, UsageError


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def protocol_of(spec: str | None) -> tuple[Any, str]:
    """The protocol instance `spec` names and the `MOD:ATTR` reference a trace records."""
    from runtime.registry import DEFAULT_PROTOCOL, PROTOCOLS, ResolveError, resolve_protocol
    spec = spec or DEFAULT_PROTOCOL
    try:
        protocol = resolve_protocol(spec)
        if isinstance(protocol, type):
            protocol = protocol()
    except ResolveError as exc:
        raise UsageError(str(exc)) from None
    except Exception as exc:  # a user class that cannot be built with no arguments
        raise UsageError(f"protocol {spec!r}: cannot instantiate: {type(exc).__name__}: {exc}") from None
    if not isinstance(getattr(protocol, "name", None), str):
        raise UsageError(f"protocol {spec!r}: has no string attribute 'name' (see CONTRACT.md)")
    return protocol, PROTOCOLS.get(spec, spec)


def _resolve(protocol_spec: str | None, client_spec: str | None) -> tuple[Any, str, Any, str]:
    from runtime.registry import DEFAULT_CLIENT, ResolveError, resolve_client
    protocol, ref = protocol_of(protocol_spec)
    try:
        factory = resolve_client(client_spec)
    except ResolveError as exc:
        raise UsageError(str(exc)) from None
    return protocol, ref, factory, client_spec or DEFAULT_CLIENT


@contextlib.contextmanager
def _runner(factory: Any, client: str) -> Iterator[Any]:
    """`run(protocol, case)` over the client: fresh in-memory stores for `model`, a `ClientPool` otherwise."""
    from model.harness import run_case
    if client == "model":
        yield run_case
        return
    from runtime.pool import ClientPool
    pool = ClientPool(factory)
    try:
        yield pool.run
    except (OSError, RuntimeError, ValueError) as exc:  # a dead server, a broken factory
        raise UsageError(f"client {client!r}: {type(exc).__name__}: {exc}") from None
    finally:
        pool.close()


def _save_unique(trace: Any, out_dir: Path, stem: str) -> Path:
    """Save under `out_dir`, named by content; an existing identical file is reused, never overwritten."""
    text = trace.dumps()
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {out_dir} is a file, not a directory")
    path = out_dir / f"{stem}-{digest}.json"
    if path.exists() and path.read_text() == text:
        return path
    try:
        return trace.save(path)
    except FileExistsError:
        raise UsageError(f"{path} exists with other content; not overwriting it") from None
    except OSError as exc:
        raise UsageError(f"cannot write the counterexample under --out {out_dir}: {exc}") from None


# -- check ------------------------------------------------------------------------------------------
#: Seconds past --budget that shrinking a found protocol case may take (plus, for a stall, one confirming run at
#: the full stall limit; a store-ops counterexample gets STORE_MINIMISE_SHARE of the budget instead).
MINIMISE_GRACE = 3.0
#: Share of --budget that shrinking a store-ops counterexample may take past it: every replay of a real client
#: starts fresh servers and a hanging op costs its timeout, so it gets more than MINIMISE_GRACE.
STORE_MINIMISE_SHARE = 0.5


def run_check(protocol_spec: str | None, client_spec: str | None, *, budget: float, seed: int = 0,
              out_dir: str = "counterexamples/found", progress: bool = False) -> dict:
    """`shardcheck check` as a function: the contract's JSON result (a dict)."""
    from engines.storeops import minimise_store_ops
    from engines.search import Found, SearchStats, minimise
    from model.trace import Trace, violations_of
    from runtime.watchdog import forget
    from shardcheck.campaign import run_engines
    if not math.isfinite(budget) or budget <= 0:
        raise UsageError(f"--budget must be a positive number of seconds, got {budget:g}")
    protocol, ref, factory, client = _resolve(protocol_spec, client_spec)
    forget()  # every stall the engines find is judged at the full limit (the shortcut serves minimising only)
    start = time.monotonic()
    deadline = start + budget
    stats = SearchStats()
    last = [start]

    def should_stop() -> bool:
        now = time.monotonic()
        if progress and now - last[0] >= 5:
            last[0] = now
            _err(f"  ... {stats.cases} cases, {now - start:.0f}/{budget:g} s, largest {stats.largest}")
        return now >= deadline

    with _runner(factory, client) as run:
        found = run_engines(protocol, client, factory, run, start=start, budget=budget, should_stop=should_stop,
                            stats=stats, seed=seed)
        if isinstance(found, Found):
            grace = deadline + MINIMISE_GRACE
            original = found
            found = minimise(protocol, found, runner=run, budget_runs=500,
                             should_stop=lambda: time.monotonic() >= grace)
            # `original` was judged at the full limit (see forget() above and in engines._explore)
            found = _confirm_stall(protocol, found, run) or original
    result: dict[str, Any] = {"protocol": protocol.name, "client": client, "verdict": "held", "violations": [],
                              "stats": {"cases": stats.cases, "by_engine": stats.by_engine,
                                        "sizes_done": len(stats.sizes_done), "largest": stats.largest,
                                        "seconds": round(time.monotonic() - start, 3), "budget": budget,
                                        "seed": seed}}
    if found is None:
        return result
    if isinstance(found, Found):
        out = found.outcome
        trace = Trace.from_outcome(out, protocol_ref=ref, client=client, origin=f"check:{found.engine}",
                                   expect={client: "reproduces"})
        violations = out.violations
        result["stats"]["counterexample_case"] = {"n_ranks": found.case.n_ranks, "n_chunks": found.case.n_chunks,
                                                  "faults": found.case.faults.size()}
    elif found.kind == "concurrent":  # measured and minimised by the concurrent layer (engines.racy)
        trace = found
        violations = violations_of(trace)
        result["stats"]["counterexample_rate"] = trace.config["rate"]
    else:
        trace = found
        ops_before = len(trace.ops)
        stop_at = time.monotonic() + max(MINIMISE_GRACE, budget * STORE_MINIMISE_SHARE)
        trace, minimal = minimise_store_ops(trace, factory, client, should_stop=lambda: time.monotonic() >= stop_at,
                                            progress=_err if progress else None)
        result["stats"]["counterexample_ops"] = {"found": ops_before, "saved": len(trace.ops),
                                                 "one_minimal": minimal}
        violations = violations_of(trace)
        result["stats"]["seconds"] = round(time.monotonic() - start, 3)
    path = _save_unique(trace, Path(out_dir), f"{protocol.name if trace.kind == 'protocol' else 'store'}-"
                        f"{trace.property}")
    result["verdict"] = "violated"
    seen = set()
    for v in violations:
        if v.property not in seen:
            seen.add(v.property)
            result["violations"].append({"property": v.property, "counterexample": str(path), "summary": v.summary})
    return result


def _confirm_stall(protocol: Any, found: Any, run: Any) -> Any:
    """`found`, or None when its violation is a stall judged at the shortened limit (`runtime.watchdog`: a line that
    stalled before) that a re-run at the full limit does not confirm."""
    from engines.search import Found
    from runtime.watchdog import forget
    if not any(v.detail.get("provisional") for v in found.outcome.violations):
        return found
    forget()
    outcome = run(protocol, found.case)
    if found.outcome.violations[0].property in outcome.violated():
        return Found(found.case, outcome, found.engine)
    return None


def cmd_check(args: Any) -> int:
    result = run_check(args.protocol, args.client, budget=args.budget, seed=args.seed, out_dir=args.out,
                       progress=not args.json)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print_check(result)
    return EXIT_VIOLATED if result["verdict"] == "violated" else EXIT_HELD


def _print_check(r: dict) -> None:
    s = r["stats"]
    print(f"protocol {r['protocol']}  client {r['client']}  verdict {r['verdict'].upper()}  "
          f"({s['cases']} cases in {s['seconds']:.1f} s)")
    for v in r["violations"]:
        print(f"  {v['property']}: {v['summary']}\n    counterexample: {v['counterexample']}")


# -- prove ------------------------------------------------------------------------------------------
def cmd_prove(args: Any) -> int:
    import proofs
    if args.seeds < 1:
        raise UsageError(f"--seeds must be at least 1, got {args.seeds}")
    results = proofs.run_all(seeds=args.seeds)
    ok = all(r["result"] == r["expected"] for r in results)
    print(json.dumps(results, indent=2) if args.json else proofs.format_table(results))
    return EXIT_HELD if ok else EXIT_VIOLATED


# -- replay -----------------------------------------------------------------------------------------
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


def replay_one(trace: Any, protocol_spec: str | None, run: Any, factory: Any, client: str) -> tuple[str, str]:
    """Replay one trace: ('reproduces'|'fixed'|'error', why)."""
    from model.sim import ScheduleError
    if trace.kind == "store-ops":
        return _replay_store_ops(trace, factory, client)
    if trace.kind == "concurrent":  # judged by its recorded rate (engines.racy)
        from engines.racy import replay
        options = {k: trace.config[k] for k in ("op_timeout",) if k in trace.config and client != "model"}
        return replay(trace, factory, options=options)
    try:
        protocol, _ = protocol_of(protocol_spec or trace.protocol.get("ref") or trace.protocol["name"])
    except UsageError as exc:
        return "error", str(exc)
    try:
        violations = run(protocol, trace.case()).violations
    except ScheduleError as exc:
        return "error", f"schedule: {exc}"
    props = [v.property for v in violations]
    if trace.property in props:
        return "reproduces", next(v.summary for v in violations if v.property == trace.property)
    return "fixed", ("no violation" if not props else f"other violations only: {', '.join(sorted(set(props)))}")


def _replay_store_ops(trace: Any, factory: Any, client: str) -> tuple[str, str]:
    """A store-ops trace on fresh, bounded stores of the client (see `engines.storeops.bounded_factory`)."""
    from engines.storeops import bounded_factory, run
    try:
        _, violations = run(trace, bounded_factory(trace, factory, client))
    except (ValueError, KeyError, TypeError) as exc:
        return "error", f"ops: {exc}"
    if violations and violations[0]["detail"].get("index") == -1 and trace.property != "store-error":
        return "error", violations[0]["summary"]
    if any(v["property"] == trace.property for v in violations):
        return "reproduces", violations[0]["summary"]
    return "fixed", "no violation" if not violations else f"other violation: {violations[0]['summary']}"


def run_replay(paths: list[str], client_spec: str | None, protocol_spec: str | None = None) -> tuple[str, list[dict]]:
    """`shardcheck replay` as a function: the client's name and one row per trace."""
    from model.trace import Trace, TraceError
    traces = []
    for p in trace_paths(paths):
        try:
            traces.append((p, Trace.load(p)))
        except TraceError as exc:
            raise UsageError(str(exc)) from None
    _, _, factory, client = _resolve(None, client_spec)
    rows = []
    with _runner(factory, client) as run:
        for p, t in traces:
            t0 = time.monotonic()
            outcome, why = replay_one(t, protocol_spec, run, factory, client)
            expected = t.expect.get(client)
            rows.append({"path": str(p), "property": t.property, "outcome": outcome, "expected": expected,
                         "matches": outcome == expected, "why": why, "seconds": round(time.monotonic() - t0, 3)})
    return client, rows


def cmd_replay(args: Any) -> int:
    client, rows = run_replay(args.paths, args.client, args.protocol)
    if args.json:
        print(json.dumps({"client": client, "results": rows}, indent=2))
    else:
        w = max(len(r["path"]) for r in rows)
        print(f"{'trace':<{w}}  {'property':<16} {'outcome':<10} {'expected':<10} why")
        for r in rows:
            flag = "" if not args.expect or r["matches"] else "  <-- expectation not met"
            print(f"{r['path']:<{w}}  {r['property'] or '-':<16} {r['outcome']:<10} {r['expected'] or '-':<10} "
                  f"{r['why']}{flag}")
    if any(r["outcome"] == "error" for r in rows):
        return EXIT_USAGE
    if args.expect:
        return EXIT_HELD if all(r["matches"] for r in rows) else EXIT_VIOLATED
    return EXIT_VIOLATED if any(r["outcome"] == "reproduces" for r in rows) else EXIT_HELD


# -- show -------------------------------------------------------------------------------------------
def cmd_show(args: Any) -> int:
    from shardcheck.show import show_command
    return show_command(args.trace, args.svg)


# -- bench ------------------------------------------------------------------------------------------
def cmd_bench(args: Any) -> int:
    from shardcheck.bench import run_bench
    result = run_bench(seconds=args.seconds, progress=None if args.json else _err)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        from shardcheck.bench import format_bench
        print(format_bench(result))
    return EXIT_HELD
