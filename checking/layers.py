"""The layers under test, one row each (`LAYERS`, keyed by trace kind): everything `check` and `replay` do
differently per layer, written here once and read by both.

A `Layer` says what its subject is (`subject`: the part of a `checking.api.Target` its traces are saved under and
replayed on: a protocol over a client, a client, or a serving engine), how a trace of it runs on fresh stores or a
fresh deployment (`session`), when one run is the verdict (`deterministic`), its case (`codec`: the typed case a
trace re-runs and the parts the one delta-debugging shrinker drops), how `check` minimises a finding of it
(`minimise`: each row has one, over those parts) and what a finding adds to the verdict's
`stats.counterexample` (`stats`). `checking.replay` judges any trace through its row; `checking.check` minimises,
measures and saves any finding through it; `shardcheck.replay_cmd` picks what a trace replays on by its `subject`.
A new layer is a trace kind (`model.trace.KINDS`), its case (`model.cases.CODECS`) and one row here
(tests/test_layers.py holds every kind to one). Its cases' generators are `check`'s strategies, scheduled by kind of
target (`runtime.registry.CHECK_SCHEDULE`), not by layer: one check of a client searches its store-ops, concurrent
and protocol layers within one budget, and a strategy returns a finding of whichever layer it ran.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, ContextManager, Iterator

import attrs

from checking.api import Runner, SearchContext, Target
from model.calls import DEFAULT_OP_TIMEOUT
from model.cases import CODECS, CaseCodec
from model.finding import Finding
from model.outcome import Violation
from model.trace import Trace

__all__ = ["Layer", "LAYERS", "SUBJECTS", "ReplayOn", "ReplayError", "Once", "layer_of", "HINT_SCHEDULES"]

#: Schedules tried when a protocol trace's recorded schedule no longer fits the protocol replayed.
HINT_SCHEDULES = 32
#: What a layer's traces are of: a protocol (over a client), a store client, or a serving engine (`--engine`).
SUBJECTS = ("protocol", "client", "engine")

#: One run of a trace: its violations, and a note on how it ran ("" when there is nothing to say).
Once = Callable[[], tuple[list[Violation], str]]


class ReplayError(Exception):
    """The trace cannot run on this target (a factory that fails, ops that do not fit the client)."""


@attrs.define(kw_only=True)
class ReplayOn:
    """What a trace runs on: the client (`runtime.registry.Client`) and its user options, the protocol of protocol
    traces, and `runner()`: a context giving `run(protocol, case)` over fresh stores of the client; or a serving
    engine (`engine`: `checking.serving.engine_search.EngineTarget` or `checking.serving.stack_search.StackTarget`)."""

    #: None for a serving engine's traces (`engine`).
    client: Any = None
    protocol: Any = None
    runner: Callable[[], ContextManager[Runner]] | None = None
    runner_name: str = "sim"
    options: dict = attrs.field(factory=dict)
    op_timeout: float = DEFAULT_OP_TIMEOUT
    engine: Any = None
    #: The real faults a trace strikes go through it (`checking.nemesis_strategy.NemesisPlan`); None: a trace with one
    #: cannot run.
    nemesis: Any = None

    @classmethod
    def of(cls, target: Target, *, runner: Callable[[], ContextManager[Runner]] | None = None,
           op_timeout: float = DEFAULT_OP_TIMEOUT, nemesis: Any = None) -> "ReplayOn":
        """What `target`'s traces run on (the one way from a `Target`: `check`'s measuring, `replay`): its client,
        protocol, options and serving engine, with `runner` (fresh stores each) and the real faults of `nemesis`."""
        return cls(client=target.client, protocol=target.protocol, runner=runner, runner_name=target.runner,
                   options=dict(target.client_options), op_timeout=op_timeout, engine=target.engine, nemesis=nemesis)

    def control(self, stores: list) -> Any:
        """A `ServerControl` over `stores`' servers; `ReplayError` when there is none."""
        control = self.nemesis.control(stores) if self.nemesis is not None else None
        if control is None:
            raise ReplayError("the trace strikes real faults on the servers: it needs servers shardcheck started "
                              "(or --nemesis given explicitly for servers passed with urls)")
        return control

    def deterministic(self, trace: Trace) -> bool:
        """Whether every run of `trace` here gives the same result (one run is the verdict)."""
        return layer_of(trace).deterministic(self)


@attrs.frozen(kw_only=True)
class Layer:
    """One layer under test (see the module doc). `in_memory_deterministic`: a run on an in-memory client under the
    simulator gives the same result every time (its schedule is the trace's own)."""

    kind: str
    what: str
    subject: str = attrs.field(validator=attrs.validators.in_(SUBJECTS))
    session: Callable[[Trace, ReplayOn], ContextManager[Once]]
    minimise: Callable[[SearchContext, Finding, Callable[[], bool]], Finding]
    stats: Callable[[Finding], dict] = lambda finding: {}
    in_memory_deterministic: bool = False
    #: Its case: what a trace of it re-runs and the parts its minimiser drops (default: its kind's,
    #: `model.cases.CODECS`; None for a kind that has none).
    codec: CaseCodec | None = attrs.field(default=attrs.Factory(lambda self: CODECS.get(self.kind), takes_self=True))

    def deterministic(self, on: ReplayOn) -> bool:
        """Whether one run of a trace of this layer on `on` is the verdict."""
        return (self.in_memory_deterministic and on.client is not None and on.client.in_memory
                and on.runner_name == "sim")

    def saved_under(self, target: Target) -> str:
        """The name a finding of this layer on `target` is saved under: its protocol's, client's or engine's."""
        return getattr(target, self.subject).name

    def source(self, *, client: Any = None, protocol: Any = None, engine: Any = None) -> str | None:
        """The digest of the source of this layer's subject (`runtime.source`), the `config.source` a trace of it
        records: of the `client` (`runtime.registry.Client`) and, for a protocol trace, the `protocol`; or of the
        serving `engine` (an `EngineTarget` or a `StackTarget`) with its patches and connector. (A `Target` and a
        `ReplayOn` hand theirs.) None when it cannot be told or the part is missing."""
        from runtime.source import source_digest
        if self.subject == "engine":
            if engine is None:
                return None
            serving = engine.engine
            connector = getattr(engine, "connector", None) or ""
            return source_digest([serving.factory, *serving.patches, *([connector] if ":" in connector else [])])
        if client is None or (self.subject == "protocol" and protocol is None):
            return None
        return source_digest([client.factory] + ([protocol.obj] if self.subject == "protocol" else []))


def layer_of(trace: Trace) -> Layer:
    """The layer of `trace`'s kind; `ReplayError` for a kind no layer has."""
    try:
        return LAYERS[trace.kind]
    except KeyError:
        raise ReplayError(f"cannot replay a {trace.kind!r} trace here (known kinds: {', '.join(LAYERS)})") from None


# -- protocol cases ---------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _protocol_session(trace: Trace, on: ReplayOn) -> Iterator[Once]:
    """Runs of a protocol trace's case over one runner of fresh stores (each run under its own key salt); a
    recorded schedule that no longer fits the protocol replayed: other schedules of the same case."""
    from model.sim import ScheduleError
    if on.protocol is None or on.runner is None:
        raise ReplayError("a protocol trace needs a protocol and a runner")
    case = trace.case()
    with on.runner() as run:
        def once() -> tuple[list[Violation], str]:
            try:
                return list(run(on.protocol.obj, case).violations), ""
            except ScheduleError as exc:
                note = f"the recorded schedule no longer fits ({exc})"
                for i in range(HINT_SCHEDULES + 1):
                    again = attrs.evolve(case, schedule=(), seed=None if i == 0 else i)
                    violations = run(on.protocol.obj, again).violations
                    if trace.property in {v.property for v in violations}:
                        return list(violations), f"{note}; shown under schedule {i + 1} of {HINT_SCHEDULES + 1} tried"
                return list(violations), f"{note}; not shown under {HINT_SCHEDULES + 1} other schedules"
        yield once


def _protocol_minimise(ctx: SearchContext, finding: Finding, stop: Callable[[], bool]) -> Finding:
    """The delta-debugging minimiser over the case; a stall judged at the minimiser's shortened limit is judged
    again at the full one (the original finding stands when it does not hold there)."""
    from checking.minimise import minimise
    from runtime.watchdog import forget
    if finding.case is None:
        return finding
    original = finding
    finding = minimise(ctx.target.protocol.obj, finding, runner=ctx.run, budget_runs=500, should_stop=stop)
    if any(v.detail.get("provisional") for v in finding.violations):
        forget()
        out = ctx.run(ctx.target.protocol.obj, finding.case)
        finding = finding.with_case(finding.case, out).lead_with(original.property) \
            if original.property in out.violated() else original
    return finding


def _protocol_stats(finding: Finding) -> dict:
    c = finding.case
    return {} if c is None else {"n_ranks": c.n_ranks, "n_chunks": c.n_chunks, "faults": c.faults.size()}


# -- store-ops runs ---------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _store_ops_session(trace: Trace, on: ReplayOn) -> Iterator[Once]:
    """Runs of a store-ops trace, each on fresh stores (its keys are the trace's own)."""
    from checking.storeops import CannotRun, bounded_factory, run

    def once() -> tuple[list[Violation], str]:
        try:
            _, violations = run(trace, bounded_factory(trace, on.client, on.options), control_for=on.control)
        except CannotRun as exc:
            raise ReplayError(str(exc)) from None
        except (ValueError, KeyError, TypeError) as exc:
            raise ReplayError(f"ops: {exc}") from None
        if violations and violations[0].detail.get("index") == -1 and trace.property != "store-error":
            raise ReplayError(violations[0].summary)
        return violations, ""
    yield once


def _store_ops_minimise(ctx: SearchContext, finding: Finding, stop: Callable[[], bool]) -> Finding:
    """Delta debugging over the ops, on fresh stores each try (a finding built minimal is left as it is)."""
    if finding.minimal:
        return finding
    from checking.storeops import minimise_store_ops
    from model.trace import violations_of
    before = len(finding.trace.ops)
    trace, minimal = minimise_store_ops(finding.trace, ctx.target.client, should_stop=stop,
                                        options=dict(ctx.target.client_options), progress=ctx.note,
                                        control_for=ctx.nemesis.control if ctx.nemesis is not None else None)
    finding = attrs.evolve(finding, trace=trace, violations=violations_of(trace) or finding.violations,
                           notes=list(finding.notes))
    finding.notes.append(f"minimised from {before} to {len(trace.ops)} ops"
                         f"{' (1-minimal)' if minimal else ' (stopped before it was 1-minimal)'}")
    return finding


def _ops_stats(finding: Finding) -> dict:
    return {"ops": len(finding.trace.ops)}


# -- concurrent layouts -----------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _concurrent_session(trace: Trace, on: ReplayOn) -> Iterator[Once]:
    """Runs of a concurrent trace's layout on one fresh store (each run under its own key prefix); a trace of several
    clients of one server (`checking.concurrency_strategy.needs_shared`) on that many fresh clients of one fresh
    server."""
    from checking.concurrency_strategy import layout_runs, needs_shared, strikes_of, targets
    options = {**on.client.accepted({k: trace.config[k] for k in ("op_timeout",) if k in trace.config}),
               **on.options}
    if needs_shared(trace):
        fresh, not_shared = targets(on.client, **options)
        if not_shared:
            raise ReplayError(f"the trace runs several clients of the same server, and {not_shared}")
        made = fresh(int(trace.config.get("clients", 2)))
        if any(op.get("path") == "evict" for op in trace.ops) and made.evict is None:
            made.close()
            raise ReplayError("the trace has the server's own evictions; these servers cannot evict by themselves")
    else:
        made = on.client.stores(1, **options)
    try:
        control = on.control(made if isinstance(made, list) else list(made.clients)) if strikes_of(trace.config) \
            else None
    except BaseException:
        for s in made if isinstance(made, list) else ():
            s.close()
        if not isinstance(made, list):
            made.close()
        raise
    with layout_runs(trace, made, control) as once:
        yield once


def _concurrent_minimise(ctx: SearchContext, finding: Finding, stop: Callable[[], bool]) -> Finding:
    """Fewest threads, ops and shortest values, each candidate on fresh stores, then measured again until `ctx`'s
    finish (`checking.concurrency_strategy.minimised`). A trace whose runs strike real faults is left as found."""
    from checking.concurrency_strategy import minimised, strikes_of, targets
    from model.finding import Rate
    from model.trace import violations_of
    trace = finding.trace
    if strikes_of(trace.config):
        finding.notes.append("not minimised: its runs strike real faults")
        return finding
    options = ctx.target.store_options(**{k: trace.config[k] for k in ("op_timeout",) if k in trace.config})
    fresh, _ = targets(ctx.target.client, **options)
    bound = float(trace.config["bound"])
    small = minimised(trace, fresh, should_stop=stop, measure_stop=lambda: time.monotonic() + bound >= ctx.finish_by)
    if small is trace:
        finding.notes.append("not minimised: no smaller layout kept its rate")
        return finding
    finding.notes.append(f"minimised from {len(trace.ops)} to {len(small.ops)} ops")
    return attrs.evolve(finding, trace=small, violations=violations_of(small), rate=Rate.from_json(small.config["rate"]),
                        notes=list(finding.notes))


# -- serving engines and stacks ---------------------------------------------------------------------------------------
def _serving_minimise(ctx: SearchContext, finding: Finding, stop: Callable[[], bool]) -> Finding:
    """Run again to tell a race from a deterministic finding, minimised (`checking.serving.serving_minimise`) on the
    target's deployments or its stack, then measured until `ctx`'s finish; no run is started that the cases so far
    say would end past it. A finding its strategy measured already (the engine machine's) is left as it is."""
    if finding.rate is not None:
        return finding
    from checking.serving.engine_search import EngineCasesCoverage, serving_minimised
    stats = ctx.coverage.of(finding.strategy, EngineCasesCoverage).stats
    ahead = lambda: time.monotonic() + stats.seconds_per_case >= ctx.finish_by  # noqa: E731
    return serving_minimised(ctx.target.engine.source(), finding, stats=stats, stop=lambda: stop() or ahead(),
                             measure_stop=ahead)


def _engine_session(trace: Trace, on: ReplayOn) -> ContextManager[Once]:
    """Runs of an engine trace's case, each on a fresh deployment of the serving engine replayed on; in a fresh
    process (`checking.replay_arm`) when that engine has patches or this process has applied some already (a patch
    changes classes for the whole process: hermetic replays)."""
    from checking.serving.engine_search import engine_session
    from runtime.serving import apply_engine_patches
    if on.engine is None:
        raise ReplayError("an engine trace needs a serving engine (--engine)")
    if on.engine.engine.patches or apply_engine_patches(()):  # (applying none: the patches applied so far)
        from checking.replay_arm import arm_session
        return arm_session(trace, on.engine, ReplayError)
    return engine_session(trace, on.engine.make)


def _serving_stats(finding: Finding) -> dict:
    c = finding.case
    return {} if c is None else {"n_ranks": c.n_ranks, "steps": len(c.steps)}


def _stack_session(trace: Trace, on: ReplayOn) -> ContextManager[Once]:
    """Runs of a stack trace's case on the serving stack replayed on (`checking.serving.stack_search.StackTarget`),
    emptied before each."""
    from checking.serving.stack_search import stack_session
    if on.engine is None or getattr(on.engine, "connector", None) is None:
        raise ReplayError("a stack trace needs a serving stack (--engine vllm, memory-stack, ...)")
    return stack_session(trace, on.engine)


#: Every layer, by its trace kind (`model.trace.KINDS`, in that order).
LAYERS: dict[str, Layer] = {layer.kind: layer for layer in (
    Layer(kind="protocol", what="a protocol's rank programs over a client's stores, faults injected",
          subject="protocol", session=_protocol_session, minimise=_protocol_minimise, stats=_protocol_stats,
          in_memory_deterministic=True),
    Layer(kind="store-ops", what="a client's calls in order, against the key-value specification",
          subject="client", session=_store_ops_session, minimise=_store_ops_minimise, stats=_ops_stats,
          in_memory_deterministic=True),
    Layer(kind="concurrent", what="a client's calls from several threads, judged linearizable or not",
          subject="client", session=_concurrent_session, minimise=_concurrent_minimise, stats=_ops_stats),
    Layer(kind="engine", what="a serving engine's own lookup-and-load path, called in vLLM's order",
          subject="engine", session=_engine_session, minimise=_serving_minimise, stats=_serving_stats),
    Layer(kind="stack", what="a whole serving stack: requests in, observations out",
          subject="engine", session=_stack_session, minimise=_serving_minimise, stats=_serving_stats),
)}
