"""The strategy interface of `check`: what is under test (`Target`), what a strategy searches with
(`SearchContext`), the `Strategy` protocol, and the typed coverage records strategies fill (`Coverage`).

Words: a *strategy* is one of `check`'s ways of searching (the scenarios, the enumeration, the explorer, the
Hypothesis machines...); a *serving engine* (`--engine`) is a subject under test: an engine's own lookup-and-load
path (a deployment) or a whole serving stack.

A strategy is an object with a `name` and `search(ctx) -> Finding | None`; `runtime.registry.CHECK_SCHEDULE` says
which kinds of target it runs on and its share of the budget. It counts what it covered in its own coverage record,
`ctx.coverage.of(self.name, MyCoverage)`, whose `text()` and `to_json()` are the verdict's coverage. The schedule
(`checking.check`) runs the strategies in order, each within its share; adding one is its module, one entry in
`shardcheck.tables.STRATEGIES` and a place in `CHECK_SCHEDULE`.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Protocol as TypingProtocol, runtime_checkable

import attrs

from model.finding import Finding
from model.outcome import Case, Outcome
from model.trace import Trace

__all__ = ["Target", "SearchContext", "Strategy", "CoverageRecord", "Coverage", "Runner", "target_kind", "Later",
           "DEFAULT_RETENTION"]

#: Default `--retention`: the least age (seconds) a value nobody deleted is read back at (`checking.retention`).
DEFAULT_RETENTION = 3.0

#: `run(protocol, case) -> Outcome`: one protocol case over the target's client (the simulator or rank processes).
Runner = Callable[[Any, Case], Outcome]


@attrs.frozen(kw_only=True)
class Target:
    """What is under test: a protocol over a store client (`runtime.registry.Protocol` and `Client`), or a serving
    engine's own deployment (`engine`). `client_options` are the user's (`--client-option`); `max_ranks` caps every
    engine's rank counts (`--max-ranks`, or the number of `urls`); `ranks`, when set, is the only rank count."""

    #: None when the subject is a serving engine (`engine`): named `-` in the verdict.
    protocol: Any = None
    client: Any = None
    client_options: Mapping[str, Any] = attrs.field(factory=dict)
    max_ranks: int | None = None
    ranks: int | None = None
    runner: str = "sim"
    engine: Any = None

    def allows(self, n_ranks: int) -> bool:
        """Whether a case of `n_ranks` ranks stays within the user's shape."""
        if self.ranks is not None:
            return n_ranks == self.ranks
        return self.max_ranks is None or n_ranks <= self.max_ranks

    def rank_cap(self, default: int) -> int:
        """The most ranks a strategy that would draw up to `default` may use."""
        return min(default, self.ranks or self.max_ranks or default)

    def store_options(self, **ours: Any) -> dict:
        """The options of a factory call: the user's, then shardcheck's own (`op_timeout`...) where the client
        accepts them."""
        return {**self.client.accepted(ours), **self.client_options}


def target_kind(target: Target) -> str:
    """`deployment` (an engine's own path under test), `stack` (a serving stack), `in-memory` (a client that cannot
    block) or `real`."""
    if target.engine is not None:
        return "stack" if getattr(target.engine, "connector", None) is not None else "deployment"
    return "in-memory" if target.client.in_memory else "real"


@runtime_checkable
class CoverageRecord(TypingProtocol):
    """What one strategy covered: `text()` in words (one line), `to_json()` as data."""

    def text(self) -> str: ...

    def to_json(self) -> dict: ...


class Coverage:
    """Every strategy's coverage record by strategy name, in the order the strategies first reported; and the strategies that
    did not run, with the reason."""

    def __init__(self) -> None:
        self.records: dict[str, CoverageRecord] = {}
        self.skipped: dict[str, str] = {}
        #: The strategy running now (progress reports show it).
        self.phase = ""

    def of(self, strategy: str, cls: type) -> Any:
        """The record of `strategy`, made (`cls()`) on first use."""
        got = self.records.get(strategy)
        if got is None:
            got = self.records[strategy] = cls()
        return got

    def skip(self, strategy: str, why: str) -> None:
        self.skipped[strategy] = why

    def to_json(self) -> dict:
        out = {name: {**rec.to_json(), "text": rec.text()} for name, rec in self.records.items()}
        if self.skipped:
            out["not_run"] = dict(self.skipped)
        return out

    def lines(self) -> list[str]:
        out = [f"{name}: {rec.text()}" for name, rec in self.records.items()]
        out += [f"{name}: not run ({why})" for name, why in self.skipped.items()]
        return out

    def cases(self) -> int:
        """Protocol cases run by every strategy (records with a `cases` field)."""
        return sum(getattr(rec, "cases", 0) for rec in self.records.values())


@attrs.define(kw_only=True)
class SearchContext:
    """Everything a strategy searches with. `should_stop()` is the current phase's stop (the schedule sets it, with
    `phase_end`); `deadline` is the end of the whole search, `finish_by` the latest a finding may be minimised and
    measured (`checking.check.Deadlines`)."""

    target: Target
    #: Runs a protocol case over the target's client (None: a serving engine's target, whose cases need no runner).
    run: Runner | None = None
    seed: int = 0
    op_timeout: float = 2.0
    coverage: Coverage = attrs.field(factory=Coverage)
    should_stop: Callable[[], bool] = lambda: False
    #: The end of the current phase, of the whole search, and of a finding's minimising and measuring (monotonic s).
    phase_end: float = float("inf")
    deadline: float = float("inf")
    finish_by: float = float("inf")
    explore_workers: int = 1
    note: Callable[[str], None] = lambda text: None
    #: The real faults of the run (`checking.nemesis_strategy.NemesisPlan`, `--nemesis`), or None: none.
    nemesis: Any = None
    #: `--retention`: the least age a value nobody deleted is read back at (0: not tested).
    retention: float = DEFAULT_RETENTION
    #: Checks a strategy started that come due later (`Later`: a retention sample): polled while the strategies after
    #: it run, finished at the end of the schedule, closed when the check ends.
    later: list = attrs.field(factory=list)
    #: Why the harness could not judge what a strategy ran (`model.timing.HarnessOutcome`, after its reruns).
    undecided: list[str] = attrs.field(factory=list)

    def stores(self, n_ranks: int, **ours: Any) -> list:
        """Fresh stores of the target's client for `n_ranks` ranks (validated; `op_timeout` given where accepted)."""
        return self.target.client.stores(n_ranks, **self.target.store_options(op_timeout=self.op_timeout, **ours))

    def protocol_finding(self, case: Case, outcome: Outcome, strategy: str) -> Finding:
        """The finding of a protocol case that violated a property (its trace names the protocol and client)."""
        t = self.target
        trace = Trace.from_outcome(outcome, protocol_ref=t.protocol.ref, client=t.client.name,
                                   origin=f"check:{strategy}", expect={t.client.name: "reproduces"})
        trace.notes = f"runner: {t.runner}"
        return Finding(strategy=strategy, violations=list(outcome.violations), trace=trace, case=case, outcome=outcome)

    def left(self) -> float:
        return self.deadline - time.monotonic()


class Later(TypingProtocol):
    """A check that comes due after the strategy that started it returned: `poll()` (cheap; from every strategy's
    `should_stop`) is its finding once due, `finish(deadline)` waits for it if that fits before `deadline`,
    `close()` releases what it holds."""

    def poll(self) -> Finding | None: ...

    def finish(self, deadline: float) -> Finding | None: ...

    def close(self) -> None: ...


class Strategy(TypingProtocol):
    """One strategy of `check` (see the module doc)."""

    name: str

    def search(self, ctx: SearchContext) -> Finding | None: ...
