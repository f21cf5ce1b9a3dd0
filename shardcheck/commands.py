"""The small subcommands behind `shardcheck.cli` (prove, show, bench), and resolving what a user names."""
from __future__ import annotations

import sys
from typing import Any

from shardcheck.errors import EXIT_HELD, EXIT_VIOLATED, UsageError
from shardcheck.output import print_json

__all__ = ["protocol_of", "cmd_prove", "cmd_show", "cmd_bench"]


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def protocol_of(spec: Any) -> Any:
    """The resolved protocol `spec` names (`runtime.registry.Protocol`: `.obj`, `.name`, `.ref`)."""
    from runtime.registry import ResolveError, resolve_protocol
    try:
        return resolve_protocol(spec)
    except ResolveError as exc:
        raise UsageError(str(exc)) from None


# -- prove ------------------------------------------------------------------------------------------
def cmd_prove(args: Any) -> int:
    import proofs
    if args.seeds < 1:
        raise UsageError(f"--seeds must be at least 1, got {args.seeds}")
    results = proofs.run_all(seeds=args.seeds)
    ok = all(r["result"] == r["expected"] for r in results)
    if args.json:
        print_json(results)
    else:
        print(proofs.format_table(results))
    return EXIT_HELD if ok else EXIT_VIOLATED


# -- show -------------------------------------------------------------------------------------------
def cmd_show(args: Any) -> int:
    from shardcheck.show import show_command
    return show_command(args.trace, args.svg, getattr(args, "engine", None))


# -- bench ------------------------------------------------------------------------------------------
def cmd_bench(args: Any) -> int:
    from shardcheck.bench import histories_command, run_bench
    if args.histories or args.write_histories or args.repeat is not None:
        return histories_command(args.histories, args.write_histories, as_json=args.json, repeat=args.repeat)
    result = run_bench(seconds=args.seconds, progress=None if args.json else _err)
    if args.json:
        print_json(result)
    else:
        from shardcheck.bench import format_bench
        print(format_bench(result))
    return EXIT_HELD
