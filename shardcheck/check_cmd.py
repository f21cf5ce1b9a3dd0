"""`shardcheck check`: parse, hand the target to `checking.check.run_check`, print the verdict."""
from __future__ import annotations

import math
import sys
import time
from typing import Any

from checking.api import DEFAULT_RETENTION
from shardcheck.tables import STRATEGIES
from shardcheck.errors import EXIT_HELD, EXIT_UNDECIDED, EXIT_VIOLATED, UsageError
from shardcheck.output import print_json
from shardcheck.targets import (add_engine_arguments, add_nemesis_arguments, add_target_arguments, build_engine_target,
                                build_target, case_runner_of, fresh_runner_of, nemesis_plan_of)

__all__ = ["add_arguments", "run_check", "cmd_check"]


def add_arguments(c: Any) -> None:
    add_target_arguments(c)
    add_engine_arguments(c)
    c.add_argument("--ranks", type=int, default=None, metavar="N",
                   help="run protocol cases of exactly N ranks; store-layer strategies use at most N (default: any)")
    c.add_argument("--max-ranks", type=int, default=None, metavar="N",
                   help="no engine uses more than N ranks (default: as many as --client-option urls names, else 8)")
    c.add_argument("--budget", type=float, default=30.0, help="seconds to search (default: 30)")
    c.add_argument("--seed", type=int, default=0, help="seed of the random strategies (default: 0)")
    c.add_argument("--op-timeout", type=float, default=None, metavar="SECONDS",
                   help="seconds one store call may take before it is a hang (default: 2)")
    c.add_argument("--until-exhausted", default=None, metavar="RANKS,CHUNKS",
                   help="first enumerate every configuration up to this size, whatever the budget, then spend "
                        "--budget on the strategies (default: off)")
    c.add_argument("--retention", type=float, default=DEFAULT_RETENTION, metavar="SECONDS",
                   help="the least age a value put and never deleted is read back at (a client's own `retention` "
                        f"member lowers it; 0: not tested) (default: {DEFAULT_RETENTION:g})")
    c.add_argument("--out", default="counterexamples/found",
                   help="where counterexamples are written (default: counterexamples/found)")
    c.add_argument("--json", action="store_true", help="print the result as JSON (default: a summary)")
    c.add_argument("--explore-workers", type=int, default=1, metavar="W",
                   help="local processes the explorer's configurations are shared out to (default: 1)")
    add_nemesis_arguments(c)


def run_check(protocol_spec: Any, client_spec: Any, *, budget: float, seed: int = 0,
              out_dir: str = "counterexamples/found", progress: bool = False, op_timeout: float | None = None,
              until_exhausted: tuple[int, int] | None = None, runner: str = "sim", explore_workers: int = 1,
              options: list[str] | dict | None = None, ranks: int | None = None,
              max_ranks: int | None = None, retention: float = DEFAULT_RETENTION, nemesis: str | None = None,
              recovery_seconds: float | None = None, engine: Any = None, lookup: str = "both",
              engine_options: list[str] | dict | None = None, engine_patches: Any = (),
              connector: str | None = None, started: float | None = None) -> dict:
    """`shardcheck check` as a function: the contract's JSON result (a dict); with `engine`, the serving engine's
    own lookup-and-load path is what is checked (docs/CONTRACT.md, "Engines"). The budget counts from `started`
    (monotonic seconds; default: now): building the target, its clients and servers, is within it."""
    started = time.monotonic() if started is None else started
    from checking.check import CheckPlan, SaveError, run_check as check
    from model.calls import DEFAULT_OP_TIMEOUT
    from shardcheck.progress import Progress
    if not math.isfinite(budget) or budget <= 0:
        raise UsageError(f"--budget must be a positive number of seconds, got {budget:g}")
    op_timeout = DEFAULT_OP_TIMEOUT if op_timeout is None else op_timeout
    if not math.isfinite(op_timeout) or op_timeout <= 0:
        raise UsageError(f"--op-timeout must be a positive number of seconds, got {op_timeout:g}")
    if explore_workers < 1:
        raise UsageError(f"--explore-workers must be at least 1, got {explore_workers}")
    if not math.isfinite(retention) or retention < 0:
        raise UsageError(f"--retention must be a number of seconds >= 0, got {retention:g}")
    if engine is not None:
        if protocol_spec is not None or client_spec is not None or options:
            raise UsageError("--engine checks a serving engine's own path: it takes no --protocol, --client or "
                             "--client-option")
        if nemesis is not None or recovery_seconds is not None:
            raise UsageError("--nemesis and --recovery-seconds strike store clients' servers; an engine's cases "
                             "strike their own (fault steps: pause, resume, kill, restart of a rank's server)")
        target = build_engine_target(engine, lookup=lookup, options=engine_options, patches=engine_patches,
                                     max_ranks=ranks or max_ranks, runner=runner, connector=connector)
        return _check_engine(target, budget=budget, seed=seed, out_dir=out_dir, progress=progress, started=started)
    if engine_options or engine_patches or connector:
        raise UsageError("--engine-option, --engine-patch and --connector need --engine")
    target = build_target(protocol_spec, client_spec, options=options, ranks=ranks, max_ranks=max_ranks,
                          runner=runner, op_timeout=op_timeout)
    plan = nemesis_plan_of(target, nemesis, recovery_seconds=recovery_seconds)
    bar = Progress(budget, enabled=progress, started=started)
    with case_runner_of(target, op_timeout, plan) as run, bar:
        try:
            asked = CheckPlan(budget=budget, strategies=STRATEGIES, seed=seed, out_dir=out_dir,
                              op_timeout=op_timeout, explore_workers=explore_workers,
                              until_exhausted=until_exhausted, retention=retention, started=started)
            result = check(target, asked, run=run, fresh_runner=fresh_runner_of(target, op_timeout, plan),
                           nemesis=plan, on_progress=bar.update, note=_err if progress else (lambda text: None))
        except SaveError as exc:
            raise UsageError(f"--out {out_dir}: {exc}") from None
    return result.to_json()


def _check_engine(target: Any, *, budget: float, seed: int, out_dir: str, progress: bool, started: float) -> dict:
    """`check --engine`: the deployment schedule of `checking.check.run_check` (no protocol runner: every case runs
    on fresh deployments of the engine)."""
    from checking.check import CheckPlan, SaveError, run_check as check
    from shardcheck.progress import Progress

    starting = getattr(target.engine, "stack", None)
    if callable(starting):  # a serving stack starts once, as set-up (`--setup-timeout`), and serves every case
        try:
            starting()
        except (ValueError, TypeError, OSError, RuntimeError) as exc:
            target.engine.close()
            raise UsageError(f"engine {target.engine.name!r}: starting the stack raised {type(exc).__name__}: "
                             f"{exc}") from None
    bar = Progress(budget, enabled=progress, started=started)
    with bar:
        try:
            result = check(target, CheckPlan(budget=budget, strategies=STRATEGIES, seed=seed, out_dir=out_dir,
                                             started=started),
                           on_progress=bar.update, note=_err if progress else (lambda text: None))
        except SaveError as exc:
            raise UsageError(f"--out {out_dir}: {exc}") from None
        finally:  # (a serving stack started once for the whole check: closed with it)
            closing = getattr(target.engine, "close", None)
            left = closing() if callable(closing) else []
    out = result.to_json()
    if left:
        out["stats"]["close"] = list(left)
    return out


def cmd_check(args: Any) -> int:
    from shardcheck.supervise import started
    result = run_check(args.protocol, args.client, budget=args.budget, seed=args.seed, out_dir=args.out,
                       progress=not args.json, op_timeout=args.op_timeout,
                       until_exhausted=_size_arg(args.until_exhausted), runner=args.runner,
                       explore_workers=args.explore_workers, options=args.client_option, ranks=args.ranks,
                       max_ranks=args.max_ranks, retention=args.retention, nemesis=args.nemesis,
                       recovery_seconds=args.recovery_seconds, engine=args.engine, lookup=args.lookup,
                       engine_options=args.engine_option, engine_patches=args.engine_patch,
                       connector=args.connector, started=started())
    if args.json:
        print_json(result)
    else:
        _print_check(result)
    return {"violated": EXIT_VIOLATED, "undecided": EXIT_UNDECIDED}.get(result["verdict"], EXIT_HELD)


def _size_arg(text: str | None) -> tuple[int, int] | None:
    """`N,K` of `--until-exhausted` (ranks, chunks)."""
    if text is None:
        return None
    from checking.search import ENUM_CHUNKS, ENUM_RANKS
    try:
        n, k = (int(x) for x in text.split(","))
    except ValueError:
        raise UsageError(f"--until-exhausted {text!r}: expected RANKS,CHUNKS such as 4,10") from None
    if n not in ENUM_RANKS or k not in ENUM_CHUNKS:
        raise UsageError(f"--until-exhausted {text!r}: the enumeration covers {ENUM_RANKS.start}-{ENUM_RANKS.stop - 1} "
                         f"ranks and {ENUM_CHUNKS.start}-{ENUM_CHUNKS.stop - 1} chunks")
    return n, k


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _print_check(r: dict) -> None:
    s = r["stats"]
    what = (f"engine {r['engine']}" + (f" connector {r['connector']}" if "connector" in r else "")) if "engine" in r \
        else f"protocol {r['protocol']}  client {r['client']}"
    print(f"{what}  verdict {r['verdict'].upper()}  ({s['seconds']:.1f} s of a {s['budget']:g} s budget)")
    for name, cov in s["coverage"].items():
        if name == "not_run":
            for engine, why in cov.items():
                print(f"  {engine}: not run ({why})")
        else:
            print(f"  {name}: {cov['text']}")
    for why in r.get("undecided", []):
        print(f"  undecided: {why}")
    for v in r["violations"]:
        print(f"  {v['property']}: {v['summary']}\n    counterexample: {v['counterexample']}")
    found = s.get("counterexample")
    if found:
        rate = found.get("rate") or {}
        shown = ("deterministic" if rate.get("deterministic") else
                 f"showed in {rate['k']} of {rate['n']} runs on fresh stores" if rate else "not measured")
        print(f"    found by {found['strategy']}; {shown}" + "".join(f"; {n}" for n in found.get("notes", [])))
