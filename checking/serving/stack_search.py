"""The stack search: stack cases on one serving stack until the budget ends; findings minimised, judged by their rate,
and written as `stack` traces (the engine search's pipeline, `checking.serving.engine_search`, over a `CaseSource` of
stack cases).

`StackTarget` is a serving stack under test (`--engine vllm --connector ...`): the resolved engine, its connector and
options, and the one stack it starts on first use (`stack()`, within `--setup-timeout`: a vLLM start costs a minute,
so every case of a check runs on it, emptied between cases) and closes at the end. `StackCases` is the engine of
`check` for such a target (`checking.api.target_kind` "stack"); `stack_session` replays a `stack` trace.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import attrs

from checking.api import SearchContext
from checking.serving.engine_run import EngineOutcome
from checking.serving.engine_search import CaseSource, EngineCasesCoverage, ServingTarget, engine_search
from checking.serving.stack_cases import stack_enumeration, stack_random_case
from checking.serving.stack_run import References, StackBounds, run_stack_case
from model.contract import STACK_METHODS, StoreCallTimeout, missing_members
from model.finding import Finding
from model.stack_case import StackCase
from model.timing import SetupTimeout, over_text
from model.trace import Trace
from runtime import starvation
from runtime.bounded import call_bounded

__all__ = ["StackTarget", "stack_source", "StackCases", "stack_session", "stack_target"]


@attrs.define(kw_only=True)
class StackTarget(ServingTarget):
    """A serving stack under test (see the module docstring)."""

    engine: Any
    connector: str
    options: dict = attrs.field(factory=dict)
    n_ranks: int = 1
    _stack: Any = None
    references: References = attrs.field(factory=References)

    @property
    def runner(self) -> str:
        return "in-process"

    def stack(self) -> Any:
        """The stack (started on first use, within `--setup-timeout`: `SetupTimeout` otherwise), validated against
        `model.contract.ServingStack`."""
        if self._stack is None:
            seconds = starvation.setup_timeout()
            try:
                made = call_bounded(seconds, "start the stack", "", lambda: self.engine.stack(
                    self.n_ranks, connector=self.connector, **self.options))
            except StoreCallTimeout as exc:
                raise SetupTimeout(f"starting the {self.name} stack (the harness's own work, not the stack's) did not "
                                   f"finish within --setup-timeout {over_text(seconds, exc.waited)}; give a longer "
                                   "--setup-timeout on a slow or loaded machine") from None
            lacking = missing_members(made, STACK_METHODS)
            if lacking:
                with contextlib.suppress(Exception):
                    made.close()
                raise ValueError(f"engine {self.name!r}: {type(made).__name__} lacks the ServingStack member(s) "
                                 f"{', '.join(lacking)} (CONTRACT.md, \"Serving stacks\")")
            self._stack = made
        return self._stack

    def source(self) -> CaseSource:
        """Its stack cases, on its one stack (`stack_source`)."""
        return stack_source(self)

    def close(self) -> list[str]:
        """Close the stack, if it was started (bounded); what did not close."""
        stack, self._stack = self._stack, None
        if stack is None:
            return []
        try:
            return list(call_bounded(30.0, "close", "", stack.close) or [])
        except StoreCallTimeout as exc:
            return [str(exc)]


def stack_source(target: StackTarget, bounds: StackBounds = StackBounds()) -> CaseSource:
    """The `CaseSource` of a serving stack: stack cases on its one stack, emptied before each."""
    def run(case: StackCase, salt: str | None = None, quick: bool = False) -> EngineOutcome:
        return run_stack_case(target.stack(), case, bounds=bounds, salt=salt, references=target.references)

    return CaseSource(run=run, cases=lambda: stack_enumeration(target.n_ranks, counts=(target.n_ranks,)),
                      random_case=lambda rng, i: stack_random_case(rng, target.n_ranks), first_level=6,
                      shrink_ranks=False, subject=target.subject)


@attrs.define
class StackCasesCoverage(EngineCasesCoverage):
    """What `StackCases` ran."""

    what: str = "stack cases"


class StackCases:
    """`check`'s strategy for a serving stack under test: stack cases on its stack (see the module doc); the first
    finding, as found (its row minimises and measures it: `checking.layers`)."""

    name = "stack-cases"

    def search(self, ctx: SearchContext) -> Finding | None:
        target: StackTarget = ctx.target.engine
        cov = ctx.coverage.of(self.name, StackCasesCoverage)
        findings = engine_search(target.source(), strategy=self.name, seed=ctx.seed,
                                 should_stop=ctx.should_stop, stats=cov.stats, faults=target.faults, one=True,
                                 minimise=False, stop_before=ctx.phase_end)
        return findings[0] if findings else None


def stack_target(spec: Any, *, connector: str | None = None, options: dict | None = None, patches: Any = (),
                 max_ranks: int | None = None, engines: Any = None) -> StackTarget:
    """The `StackTarget` a user named: `--engine` (a name of `engines`, the named serving engines handed down, or
    `MOD:ATTR`), `--connector` (default: the engine's first), `--engine-option`
    (`tp=N`: ranks, default the engine's `ranks`; the rest go to the factory), `--engine-patch` (`ResolveError` when unusable)."""
    from runtime.registry import ResolveError
    from runtime.serving import resolve_serving_engine
    engine = resolve_serving_engine(spec, patches, engines)
    if engine.seam != "stack":
        raise ResolveError(f"engine {engine.name!r} is not a serving stack (--connector is for stacks)")
    opts = dict(options or {})
    connector = connector or (engine.connectors[0] if engine.connectors else None)
    if connector is None:
        raise ResolveError(f"engine {engine.name!r}: give --connector NAME|MOD:ATTR")
    if engine.connectors and connector not in engine.connectors and ":" not in connector:
        raise ResolveError(f"--connector {connector!r}: engine {engine.name!r} offers {', '.join(engine.connectors)}, "
                           "or MOD:ATTR of a KV connector class")
    unknown = sorted(set(opts) - set(engine.options)) if engine.options is not None else []
    if unknown:
        raise ResolveError(f"engine {engine.name!r} takes no option {unknown[0]!r} (it takes "
                           f"{', '.join(engine.options or ())})")
    ranks = opts.get("tp", engine.ranks)
    if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
        raise ResolveError(f"--engine-option tp={ranks!r}: expected a whole number of ranks, at least 1")
    if max_ranks is not None and ranks > max_ranks:
        raise ResolveError(f"--engine-option tp={ranks} exceeds --max-ranks {max_ranks}")
    return StackTarget(engine=engine, connector=connector, options=opts, n_ranks=ranks)


@contextlib.contextmanager
def stack_session(trace: Trace, target: StackTarget) -> Iterator[Callable[[], tuple[list, str]]]:
    """Runs of a stack trace's case, each on the target's stack emptied first (`checking.layers.LAYERS`)."""
    case = trace.case()

    def once() -> tuple[list, str]:
        return list(run_stack_case(target.stack(), case, references=target.references).violations), ""
    yield once
