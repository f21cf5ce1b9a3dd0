"""What the command line hands the strategies: the `Target` a user named (`--protocol`, `--client`, `--client-option`,
`--ranks`, `--max-ranks`), checked before any property runs (an unreachable tier is exit 2, one line), and the case
runners over its client (`--runner sim|processes`)."""
from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Iterator

from runtime.options import ENGINE_FLAGS, HARNESS_FLAGS, NEMESIS_FLAGS, add_options
from shardcheck.errors import UsageError

__all__ = ["parse_options", "build_target", "case_runner_of", "fresh_runner_of", "add_target_arguments",
           "add_engine_arguments", "build_engine_target", "add_nemesis_arguments", "nemesis_plan_of"]


def add_target_arguments(p: Any, *, protocol: bool = True) -> None:
    """The options that name what is under test (check, replay)."""
    if protocol:
        p.add_argument("--protocol", default=None, help="a short name (paper, paper-async, rank0-single-writer) or "
                       "MOD:ATTR (default: paper)")
    p.add_argument("--client", default=None, help="model, lmcache, lmcache-native, lmcache-valkey, "
                   "lmcache-patched, or MOD:ATTR of a factory (default: model)")
    add_options(p.add_argument, "--client-option", *HARNESS_FLAGS)
    p.add_argument("--runner", choices=("sim", "processes"), default="sim",
                   help="sim: every rank in one simulator; processes: one OS process per rank with real collectives "
                        "(torch.distributed, gloo) (default: sim)")


def add_nemesis_arguments(p: Any) -> None:
    """`--nemesis` and `--recovery-seconds` (check, replay)."""
    add_options(p.add_argument, *NEMESIS_FLAGS)


def nemesis_plan_of(target: Any, spec: str | None, *, recovery_seconds: float | None = None) -> Any:
    """The `checking.nemesis_strategy.NemesisPlan` of `--nemesis` for `target` (`checking.nemesis_strategy.plan_for`), or
    None; bad input is exit 2."""
    from checking.nemesis_strategy import plan_for
    from shardcheck.tables import CATALOGUE
    try:
        return plan_for(target.client, dict(target.client_options), spec, recovery_seconds=recovery_seconds,
                        nemesis=CATALOGUE.nemesis)
    except ValueError as exc:
        raise UsageError(f"--nemesis {spec or ''}: {exc}".replace("--nemesis : --", "--")) from None


def parse_options(items: list[str], flag: str = "--client-option") -> dict:
    """`runtime.registry.parse_options`, a bad item being unusable input (exit 2)."""
    from runtime.registry import ResolveError, parse_options as parse
    try:
        return parse(items, flag=flag)
    except ResolveError as exc:
        raise UsageError(str(exc)) from None


def add_engine_arguments(p: Any) -> None:
    """The options that put a serving engine's own lookup-and-load path under test (CONTRACT.md, "Engines")."""
    add_options(p.add_argument, *ENGINE_FLAGS)


def build_engine_target(spec: Any, *, lookup: str = "both", options: list[str] | dict | None = None,
                        patches: Any = (), max_ranks: int | None = None, runner: str = "sim",
                        preflight: bool = True, connector: str | None = None) -> Any:
    """The `checking.api.Target` of a serving engine (`--engine`) or a serving stack (`--engine vllm --connector ...`),
    validated: an unknown engine, connector, option or patch, or servers (`urls`) that cannot be reached, are
    `UsageError` (exit 2) before any property runs."""
    from checking.api import Target
    from checking.serving.engine_search import engine_target
    from runtime.registry import ResolveError
    from runtime.serving import resolve_serving_engine
    from shardcheck.tables import SERVING_ENGINES
    if max_ranks is not None and max_ranks < 1:
        raise UsageError(f"--max-ranks must be at least 1, got {max_ranks}")
    opts = parse_options(options, flag="--engine-option") if isinstance(options, list) else dict(options or {})
    try:
        if connector is not None or resolve_serving_engine(spec, patches, SERVING_ENGINES).seam == "stack":
            from checking.serving.stack_search import stack_target
            if runner == "processes":
                raise ResolveError("a serving stack runs its ranks its own way: no --runner processes")
            stack = stack_target(spec, connector=connector, options=opts, patches=tuple(patches or ()),
                                 max_ranks=max_ranks, engines=SERVING_ENGINES)
            if preflight and opts.get("urls"):
                _reach_urls(opts["urls"])
            return Target(engine=stack, max_ranks=stack.n_ranks)
    except ResolveError as exc:
        raise UsageError(str(exc)) from None
    try:
        engine = engine_target(spec, lookup=lookup, options=opts, patches=tuple(patches or ()), max_ranks=max_ranks,
                               runner="processes" if runner == "processes" else "in-process", engines=SERVING_ENGINES)
    except ResolveError as exc:
        raise UsageError(str(exc)) from None
    if preflight and engine.options.get("urls"):
        _reach_urls(engine.options["urls"])
    return Target(engine=engine, max_ranks=engine.max_ranks, runner=engine.runner)


def _reach_urls(urls: Any) -> None:
    """Every server of `urls` answers PING (else exit 2, one line naming it)."""
    from urllib.parse import urlparse

    from adapters.valkey_servers import resp_command
    for rank, url in enumerate(urls):
        p = urlparse(url if "://" in url else f"resp://{url}")
        try:
            if p.hostname is None or p.port is None:
                raise ValueError("no host:port")
            reply = resp_command(p.hostname, p.port, p.password, "PING", timeout=2.0)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--engine-option urls: rank {rank}'s server {url} cannot be reached: {exc}") from None
        if not reply.startswith(b"+PONG"):
            raise UsageError(f"--engine-option urls: rank {rank}'s server {url} answered {reply[:40]!r}, not PONG")



def build_target(protocol_spec: Any, client_spec: Any, *, options: list[str] | dict | None = None,
                 ranks: int | None = None, max_ranks: int | None = None, runner: str = "sim",
                 op_timeout: float = 2.0, preflight: bool = True) -> Any:
    """The `checking.api.Target` the user named, validated; with `preflight`, a client whose servers cannot be reached
    raises `UsageError` (exit 2) before any property runs."""
    from checking.api import Target
    from runtime.preflight import TierUnreachable, reach
    from runtime.registry import ResolveError, resolve_client, resolve_protocol
    from shardcheck.tables import CLIENTS
    try:
        protocol, client = resolve_protocol(protocol_spec), resolve_client(client_spec, CLIENTS)
        opts = parse_options(options) if isinstance(options, list) else dict(options or {})
        client.check_options(opts)
    except ResolveError as exc:
        raise UsageError(str(exc)) from None
    for name, value in (("--ranks", ranks), ("--max-ranks", max_ranks)):
        if value is not None and value < 1:
            raise UsageError(f"{name} must be at least 1, got {value}")
    if ranks is not None and max_ranks is not None and ranks > max_ranks:
        raise UsageError(f"--ranks {ranks} exceeds --max-ranks {max_ranks}")
    urls = opts.get("urls")
    if max_ranks is None and ranks is None and urls and opts.get("topology") != "shared":
        max_ranks = len(urls)  # one server per rank: as many ranks as the user has servers
    target = Target(protocol=protocol, client=client, client_options=opts, ranks=ranks, max_ranks=max_ranks,
                    runner=runner)
    if preflight and not client.in_memory:
        try:
            reach(client, target.store_options(op_timeout=op_timeout), n_ranks=target.rank_cap(1),
                  op_timeout=op_timeout)
        except (TierUnreachable, ResolveError) as exc:
            raise UsageError(str(exc)) from None
    return target


@contextlib.contextmanager
def case_runner_of(target: Any, op_timeout: float, nemesis: Any = None) -> Iterator[Callable]:
    """`run(protocol, case)` over the target's client (`runtime.pool.case_runner`); with the processes runner, one OS
    process per rank with real collectives (`adapters.processes`). A client that cannot be used is exit 2. A case's
    real-server faults strike through the `NemesisPlan` `nemesis` (the simulator's runner only)."""
    from runtime.pool import case_runner
    from runtime.registry import ResolveError
    if target.runner == "processes":
        from adapters.processes import ProcessRunner, RunnerError
        with ProcessRunner(target.client, options=dict(target.client_options), op_timeout=op_timeout) as processes:
            def on_processes(protocol: Any, case: Any) -> Any:
                try:
                    return processes.run(protocol, case)
                except RunnerError as exc:  # the runner could not run the case (replay: an error row; check: exit 2)
                    raise UsageError(f"--runner processes: {exc}") from None
            yield on_processes
        return
    with case_runner(target.client, op_timeout=op_timeout, options=dict(target.client_options),
                     nemesis=nemesis.control if nemesis is not None else None,
                     recovery_seconds=nemesis.recovery_seconds if nemesis is not None else None) as run:
        def guarded(protocol: Any, case: Any) -> Any:
            try:
                return run(protocol, case)
            except ResolveError as exc:  # the factory failed or made stores that break the contract
                raise UsageError(str(exc)) from None
            except OSError as exc:  # a server that died after the preflight
                raise UsageError(f"client {target.client.name!r}: {type(exc).__name__}: {exc}") from None
        yield guarded


def fresh_runner_of(target: Any, op_timeout: float, nemesis: Any = None) -> Callable[[], ContextManager[Callable]]:
    """A maker of case runners over fresh stores of the target's client (one per measured run)."""
    return lambda: case_runner_of(target, op_timeout, nemesis)
