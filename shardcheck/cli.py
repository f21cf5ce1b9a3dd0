"""The `shardcheck` command line: check, prove, replay, bench, show, verify, regen, campaign, tier, explore.

Exit codes: 0 every property held / expectations met; 1 a violation (or an unmet expectation);
2 unusable input (a bad spec, a malformed trace, a dead server), with a message naming it; 3 protocol code
that blocked and could not be interrupted (see `runtime.watchdog`), reported on stderr.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

from shardcheck.errors import EXIT_UNDECIDED, EXIT_USAGE, UsageError

__all__ = ["HANDLERS", "main", "REAL_CLIENT_MIN_STALL", "stall_limit"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="shardcheck", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    from shardcheck.check_cmd import add_arguments as check_arguments
    check_arguments(sub.add_parser("check", help="search for a violation of any property"))

    pr = sub.add_parser("prove", help="run the Z3 proofs with a seed sweep")
    pr.add_argument("--json", action="store_true", help="print the rows as JSON (default: a table)")
    pr.add_argument("--seeds", type=int, default=10, help="solver seeds per theorem (default: 10)")

    from shardcheck.replay_cmd import add_arguments as replay_arguments
    replay_arguments(sub.add_parser("replay", help="replay saved traces on the client and protocol they record"))

    b = sub.add_parser("bench", help="measure explorer, Hypothesis and Z3 throughput")
    b.add_argument("--json", action="store_true", help="print the figures as JSON (default: a table)")
    b.add_argument("--seconds", type=float, default=5.0, help="seconds per measurement (default: 5)")
    b.add_argument("--histories", default=None, metavar="DIR",
                   help="instead: run the linearizability checker on every *.json history in DIR, one row per file "
                        "(default: off)")
    b.add_argument("--write-histories", default=None, metavar="DIR",
                   help="write the side-by-side histories (checking.concurrency_bench.SPECS) into DIR first; an "
                        "existing file is not overwritten (default: off)")
    b.add_argument("--repeat", type=int, default=None, metavar="N",
                   help="with --histories: check each file N times and report the least wall and CPU seconds, the "
                        "best of N as other checkers' harnesses report it (default: 1)")

    s = sub.add_parser("show", help="draw a trace as a timeline (and an SVG)")
    s.add_argument("trace", help="a trace file")
    s.add_argument("--svg", default=None, metavar="OUT", help="also write an SVG sequence diagram here (default: none)")
    s.add_argument("--engine", default=None, metavar="NAME",
                   help="for an engine trace: the serving engine it is read for (its expectation there is shown) "
                        "(default: the one it records)")

    v = sub.add_parser("verify", help="the main job: proofs, checks, real clients, replays; a summary table")
    v.add_argument("--budget", type=float, default=20.0, help="seconds per check (default: 20)")
    v.add_argument("--json", action="store_true", help="print the steps as JSON (default: a table)")
    v.add_argument("--engine", default=None, metavar="NAME",
                   help="only the engine layer, on this engine (lmcache, lmcache-patched, vllm, ...) or on all of "
                        "them (all) (default: everything; the engine layer on every engine runs in a child process "
                        "beside the other steps)")
    v.add_argument("--full", action="store_true",
                   help="the full sweep: also every engine demo patched into LMCache and every stack demo connector "
                        "on vLLM, each in a process of its own, and the slow replays (the corpus on the stock clients, "
                        "the nemesis findings on every LMCache client, the engine corpus) (default: off; the "
                        "newcomer's run)")

    from shardcheck.campaign import add_arguments as campaign_arguments
    campaign_arguments(sub.add_parser("campaign", help="a Hypothesis campaign on xdist workers sharing one example "
                                      "database on Valkey"))

    from shardcheck.regen import add_arguments as regen_arguments
    regen_arguments(sub.add_parser("regen", help="regenerate the manifest and the curated counterexamples"))

    from shardcheck import tier_cmd
    tier_cmd.add_arguments(sub.add_parser("tier", help="measure a KV tier through LMCache; the paper's cost model"))

    from shardcheck import explore_cmd
    explore_cmd.add_arguments(sub.add_parser("explore", help="exhaustive exploration (local workers or Ray)"))
    return p


#: The module that handles each command (`cmd_<command>(args) -> exit code`).
HANDLERS = {"check": "check_cmd", "prove": "commands", "replay": "replay_cmd", "bench": "commands", "show": "commands",
            "verify": "verify", "regen": "regen", "campaign": "campaign", "tier": "tier_cmd",
            "explore": "explore_cmd"}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from shardcheck import supervise
    if argv is None and args.command == "check" and not supervise.in_child() and args.budget > 0 \
            and args.until_exhausted is None:  # (--until-exhausted runs whatever the budget: no deadline then)
        # run as a program: a protocol stuck in C starves the watchdog, so a parent process ends it at a deadline
        # (see shardcheck.supervise); an in-process call (main([...])) runs unsupervised
        return supervise.supervise(sys.argv[1:], supervise.deadline(args.budget), args.command)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    if argv is None and os.environ.get(supervise.SUPERVISED) == "1":
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _interrupt_once)
    from model.calls import Stalled
    from model.timing import HarnessOutcome
    from runtime import starvation
    from runtime.registry import ResolveError
    from runtime.watchdog import watching
    import importlib
    from shardcheck.output import json_stdout
    handler = getattr(importlib.import_module(f"shardcheck.{HANDLERS[args.command]}"), f"cmd_{args.command}")
    starvation.start()  # the harness's measure of its own lateness (`model.timing`)
    try:
        starvation.set_setup_timeout(getattr(args, "setup_timeout", None))
    except ValueError as exc:
        print(f"shardcheck {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with json_stdout(bool(getattr(args, "json", False))), watching(stall_limit(args)):
            code = handler(args)
        if argv is None and args.command == "check" and os.environ.get(supervise.SUPERVISED) == "1":
            supervise.quick_exit(code)  # (its clean-up done: the interpreter's finalisation would overrun the budget)
        return code
    except HarnessOutcome as exc:  # outside any case: nothing was judged
        print(f"shardcheck {args.command}: undecided: {exc.reason}", file=sys.stderr)
        return EXIT_UNDECIDED
    except Stalled as exc:  # protocol code outside any case (the strategies turn a stall in a case into a violation)
        print(f"shardcheck {args.command}: error: the protocol stalled outside a checked case: {exc}",
              file=sys.stderr)
        return EXIT_USAGE
    except (UsageError, ResolveError) as exc:  # (a client's factory that breaks the contract, found on first use)
        print(f"shardcheck {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"shardcheck {args.command}: interrupted", file=sys.stderr)
        if argv is None:  # (its clean-up unwound: finalising LMCache's and torch's threads once crashed it, SIGSEGV)
            supervise.quick_exit(130)
        return 130
    except Exception:  # never exit 1 (which means "violation") on a crash: report it as unusable input
        import traceback
        traceback.print_exc()
        print(f"shardcheck {args.command}: error: the run could not complete (traceback above); "
              "this is most often a protocol or client that does not follow docs/CONTRACT.md", file=sys.stderr)
        return EXIT_USAGE


#: The least stall limit for a real client: a protocol call's time in store calls counts, and one store call may
#: take the pool's op timeout (2 s) before it is a hang of its own.
REAL_CLIENT_MIN_STALL = 5.0


def stall_limit(args: Any) -> float:
    """Seconds one protocol call may run without returning: `STALL_SECONDS`, or a quarter of a shorter
    `--budget` (at least 1 s; `REAL_CLIENT_MIN_STALL` with a real client), so that `check` ends near its
    budget even against a protocol that blocks."""
    from runtime.watchdog import STALL_SECONDS
    budget = getattr(args, "budget", None)
    if not (isinstance(budget, float) and budget > 0):
        return STALL_SECONDS
    floor = 1.0 if _in_memory(getattr(args, "client", None)) else REAL_CLIENT_MIN_STALL
    op = getattr(args, "op_timeout", None) or 0.0  # a protocol call's store calls count: exceed one of them
    return max(2 * op, min(STALL_SECONDS, max(floor, budget / 4)))


def _in_memory(spec: str | None) -> bool:
    """Whether the client `spec` names is in memory (its capability, `MOD:ATTR` factories included); a spec that
    does not resolve is taken as a real client here (the command reports it)."""
    from runtime.registry import ResolveError, resolve_client
    from shardcheck.tables import CLIENTS
    try:
        return resolve_client(spec, CLIENTS).in_memory
    except ResolveError:
        return False


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _interrupt_once(signum: int, frame: Any) -> None:
    """A supervised child's first Ctrl-C or SIGTERM unwinds it; later ones are ignored, so that its clean-up (closing
    engines, stopping servers, removing their dirs) is not cut short: the supervisor passes a Ctrl-C on, which may
    be the second one, and kills a child whose clean-up overruns `shardcheck.supervise.STOP_SECONDS`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
