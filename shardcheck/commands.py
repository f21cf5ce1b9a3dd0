"""The subcommands behind `shardcheck.cli`."""
from __future__ import annotations

import contextlib
import math
import json
import sys
import time
from typing import Any, Iterator

from shardcheck.errors import EXIT_HELD, EXIT_VIOLATED, UsageError

__all__ = ["protocol_of", "client_of", "MINIMISE_GRACE", "STORE_MINIMISE_SHARE", "run_check", "cmd_check",
           "cmd_prove", "cmd_show", "cmd_bench"]


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def protocol_of(spec: Any) -> Any:
    """The resolved protocol `spec` names (`runtime.registry.Protocol`: `.obj`, `.name`, `.ref`)."""
    from runtime.registry import ResolveError, resolve_protocol
    try:
        return resolve_protocol(spec)
    except ResolveError as exc:
        raise UsageError(str(exc)) from None


def client_of(spec: Any) -> Any:
    """The resolved client `spec` names (`runtime.registry.Client`)."""
    from runtime.registry import ResolveError, resolve_client
    try:
        return resolve_client(spec)
    except ResolveError as exc:
        raise UsageError(str(exc)) from None


@contextlib.contextmanager
def _runner(client: Any, op_timeout: float, runner: str = "sim") -> Iterator[Any]:
    """`run(protocol, case)` over the client (`runtime.pool.case_runner`); with `runner="processes"`, one OS process
    per rank with real collectives (`adapters.processes`). A client that cannot be used is exit 2."""
    from runtime.pool import case_runner
    from runtime.registry import ResolveError
    if runner == "processes":
        from adapters.processes import ProcessRunner, RunnerError
        with ProcessRunner(client.name, op_timeout=op_timeout) as processes:
            def on_processes(protocol: Any, case: Any) -> Any:
                try:
                    return processes.run(protocol, case)
                except RunnerError as exc:  # the runner could not run the case (replay: an error row; check: exit 2)
                    raise UsageError(f"--runner processes: {exc}") from None
            yield on_processes
        return
    with case_runner(client, op_timeout=op_timeout) as run:
        def guarded(protocol: Any, case: Any) -> Any:
            try:
                return run(protocol, case)
            except ResolveError as exc:  # the factory failed or made stores that break the contract
                raise UsageError(str(exc)) from None
            except OSError as exc:  # a dead server
                raise UsageError(f"client {client.name!r}: {type(exc).__name__}: {exc}") from None
        yield guarded


# -- check ------------------------------------------------------------------------------------------
#: Seconds past --budget that shrinking a found protocol case may take (plus, for a stall, one confirming run at
#: the full stall limit; a store-ops counterexample gets STORE_MINIMISE_SHARE of the budget instead).
MINIMISE_GRACE = 3.0
#: Share of --budget that shrinking a store-ops counterexample may take past it: every replay of a real client
#: starts fresh servers and a hanging op costs its timeout, so it gets more than MINIMISE_GRACE.
STORE_MINIMISE_SHARE = 0.5


def run_check(protocol_spec: Any, client_spec: Any, *, budget: float, seed: int = 0,
              out_dir: str = "counterexamples/found", progress: bool = False,
              op_timeout: float | None = None, until_exhausted: tuple[int, int] | None = None,
              runner: str = "sim", explore_workers: int = 1) -> dict:
    """`shardcheck check` as a function: the contract's JSON result (a dict)."""
    from engines.storeops import minimise_store_ops
    from engines.minimise import minimise
    from engines.search import Found, SearchStats, enumeration_sizes, search
    from shardcheck.progress import Progress
    from model.trace import Trace, violations_of
    from runtime.watchdog import forget
    from shardcheck.campaign import run_engines
    if not math.isfinite(budget) or budget <= 0:
        raise UsageError(f"--budget must be a positive number of seconds, got {budget:g}")
    from model.calls import DEFAULT_OP_TIMEOUT
    op_timeout = DEFAULT_OP_TIMEOUT if op_timeout is None else op_timeout
    if not math.isfinite(op_timeout) or op_timeout <= 0:
        raise UsageError(f"--op-timeout must be a positive number of seconds, got {op_timeout:g}")
    resolved, client = protocol_of(protocol_spec), client_of(client_spec)
    protocol = resolved.obj
    forget()  # every stall the engines find is judged at the full limit (the shortcut serves minimising only)
    start = t0 = time.monotonic()
    deadline = start + budget
    stats = SearchStats()
    bar = Progress(budget, enabled=progress)

    def should_stop() -> bool:
        bar.update(stats)
        return time.monotonic() >= deadline

    with _runner(client, op_timeout, runner) as run, bar:
        found = None
        if until_exhausted is not None:  # the enumeration first, to the size asked, whatever the budget
            n, k = until_exhausted
            stats.phase = "exhaust"
            found = search(protocol, runner=run, stats=stats, random_cases=False, seed=seed,
                           should_stop=lambda: bar.update(stats) or False,
                           sizes=[s for s in enumeration_sizes() if s[0] <= n and s[1] <= k])
            start = time.monotonic()
            deadline = start + budget
        if found is None:
            found = run_engines(protocol, client, run, start=start, budget=budget, should_stop=should_stop,
                                stats=stats, seed=seed, op_timeout=op_timeout,
                                multi_prompt=runner == "sim", explore_workers=explore_workers,
                                protocol_ref=resolved.ref)
        if isinstance(found, Found):
            grace = deadline + MINIMISE_GRACE
            original = found
            found = minimise(protocol, found, runner=run, budget_runs=500,
                             should_stop=lambda: time.monotonic() >= grace)
            # `original` was judged at the full limit (see forget() above and in shardcheck.campaign._explore)
            found = _confirm_stall(protocol, found, run) or original
    result: dict[str, Any] = {"protocol": resolved.name, "client": client.name, "verdict": "held", "violations": [],
                              "stats": {"cases": stats.cases, "by_engine": stats.by_engine,
                                        "sizes_done": len(stats.sizes_done), "largest": stats.largest,
                                        "seconds": round(time.monotonic() - t0, 3), "budget": budget,
                                        "seed": seed, "runner": runner, "coverage": stats.coverage()}}
    if found is None:
        return result
    if isinstance(found, Found):
        out = found.outcome
        trace = Trace.from_outcome(out, protocol_ref=resolved.ref, client=client.name, origin=f"check:{found.engine}",
                                   expect={client.name: "reproduces"})
        trace.notes = f"runner: {runner}"
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
        trace, minimal = minimise_store_ops(trace, client, should_stop=lambda: time.monotonic() >= stop_at,
                                            progress=_err if progress else None)
        result["stats"]["counterexample_ops"] = {"found": ops_before, "saved": len(trace.ops),
                                                 "one_minimal": minimal}
        violations = violations_of(trace)
        result["stats"]["seconds"] = round(time.monotonic() - t0, 3)
    try:
        path = trace.save_unique(out_dir, resolved.name if trace.kind == "protocol" else "store", trace.property or "")
    except OSError as exc:
        raise UsageError(f"cannot write the counterexample under --out {out_dir}: {exc}") from None
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
                       progress=not args.json, op_timeout=args.op_timeout,
                       until_exhausted=_size_arg(args.until_exhausted), runner=args.runner,
                       explore_workers=args.explore_workers)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print_check(result)
    return EXIT_VIOLATED if result["verdict"] == "violated" else EXIT_HELD


def _size_arg(text: str | None) -> tuple[int, int] | None:
    """`N,K` of `--until-exhausted` (ranks, chunks)."""
    if text is None:
        return None
    from engines.search import ENUM_CHUNKS, ENUM_RANKS
    try:
        n, k = (int(x) for x in text.split(","))
    except ValueError:
        raise UsageError(f"--until-exhausted {text!r}: expected RANKS,CHUNKS such as 4,10") from None
    if n not in ENUM_RANKS or k not in ENUM_CHUNKS:
        raise UsageError(f"--until-exhausted {text!r}: the enumeration covers {ENUM_RANKS.start}-{ENUM_RANKS.stop - 1} "
                         f"ranks and {ENUM_CHUNKS.start}-{ENUM_CHUNKS.stop - 1} chunks")
    return n, k


def _print_check(r: dict) -> None:
    s = r["stats"]
    print(f"protocol {r['protocol']}  client {r['client']}  verdict {r['verdict'].upper()}  "
          f"({s['cases']} cases in {s['seconds']:.1f} s)")
    if r["verdict"] == "held":
        from engines.search import coverage_lines
        for line in coverage_lines(s["coverage"]):
            print(f"  {line}")
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


# -- show -------------------------------------------------------------------------------------------
def cmd_show(args: Any) -> int:
    from shardcheck.show import show_command
    return show_command(args.trace, args.svg)


# -- bench ------------------------------------------------------------------------------------------
def cmd_bench(args: Any) -> int:
    from shardcheck.bench import histories_command, run_bench
    if args.histories or args.write_histories:
        return histories_command(args.histories, args.write_histories, as_json=args.json)
    result = run_bench(seconds=args.seconds, progress=None if args.json else _err)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        from shardcheck.bench import format_bench
        print(format_bench(result))
    return EXIT_HELD
