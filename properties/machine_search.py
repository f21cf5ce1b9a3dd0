"""The state machines as a search engine for `shardcheck check`: seeded batches until a budget ends.

Each batch runs `ProtocolMachine` (and, for a real client, `StoreMachine` first) with Hypothesis under a
seed derived from `seed` and the batch number, so the same seed gives the same search. A failing run hands its
trace over in memory (`properties.config.RunConfig.found`); the engine returns it as a `Finding`.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import attrs
import hypothesis
from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import Flaky
from hypothesis.stateful import run_state_machine_as_test

from checking.api import SearchContext
from model.calls import DEFAULT_OP_TIMEOUT
from model.finding import Finding
from model.trace import Trace, violations_of
from properties import config
from properties.machines import PATH_CALLS, RULE_STEPS, ProtocolMachine, StoreMachine, violated_properties

__all__ = ["BATCH", "batch_size", "run_machine", "caught", "hypothesis_search", "HypothesisMachines", "HypothesisCoverage"]

#: One batch: few examples, so the budget is polled often. No shrinking inside Hypothesis: it cannot be
#: bounded in time (each shrink step of a hanging client costs a timeout); `check` minimises protocol
#: cases itself.
BATCH = settings(max_examples=10, stateful_step_count=25, deadline=None, database=None,
                 phases=(Phase.generate,), report_multiple_bugs=False, suppress_health_check=list(HealthCheck))


def run_machine(machine: type, how: settings) -> tuple[bool, set[str]]:
    """Run `machine` once under `how` with the current run config: (whether it failed, properties violated)."""
    try:
        run_state_machine_as_test(machine, settings=how)
    except (AssertionError, ExceptionGroup, Flaky) as exc:
        return True, violated_properties(exc)
    return False, set()


def caught(machine: type, how: settings, **changes: Any) -> set[str]:
    """The properties `machine` violates under `how`, with the run config changed by `changes`."""
    with config.using(**changes):
        return run_machine(machine, how)[1]


@attrs.define
class HypothesisCoverage:
    """Rule steps the state machines ran, per machine, and the client paths the store layer called."""

    rule_steps: int = 0
    batches: int = 0
    by_machine: dict[str, int] = attrs.field(factory=dict)
    paths: dict[str, int] = attrs.field(factory=dict)

    def text(self) -> str:
        machines = ", ".join(f"{name} {steps:,}" for name, steps in self.by_machine.items())
        paths = ("; client paths exercised: " + ", ".join(f"{p} x{n}" for p, n in sorted(self.paths.items()))
                 if self.paths else "")
        return f"{self.rule_steps:,} rule steps in {self.batches} batch(es) ({machines}){paths}"

    def to_json(self) -> dict:
        return attrs.asdict(self)


def batch_size(left: float, per_example: float | None) -> int:
    """Examples in the next batch of a machine with `left` seconds for it: `BATCH`'s, or as many as the longest
    example so far says fit (`per_example`; None: none ran yet, and one example first tells); 0: none fits."""
    if per_example is None:
        return 1 if left < float("inf") else BATCH.max_examples
    return max(0, min(BATCH.max_examples, int(left / max(per_example, 1e-6))))


def hypothesis_search(protocol: Any, client: Any, *, should_stop: Callable[[], bool], seed: int = 0,
                      store_layer: bool = False, op_timeout: float = DEFAULT_OP_TIMEOUT,
                      coverage: HypothesisCoverage | None = None, client_options: dict | None = None,
                      max_ranks: int | None = None, left: Callable[[], float] = lambda: float("inf")) -> list[Trace]:
    """Run the machines in seeded batches until `should_stop()` or a failure: the traces of the failure (kept in
    memory, not written), and the rule steps counted in `coverage`. A batch is sized to end within `left()` seconds
    by the longest example of its machine so far (`batch_size`)."""
    cov = coverage if coverage is not None else HypothesisCoverage()
    machines = ([StoreMachine] if store_layer else []) + [ProtocolMachine]
    found: list[Trace] = []
    paths0 = dict(PATH_CALLS)
    per_example: dict[str, list[float]] = {}  # each batch's seconds per example, per machine
    # minimise_seconds=0: `check` minimises the finding itself, within its own budget
    # nemesis_spec="none": in `check` real faults are the nemesis engine's (a strike costs its fault's length, which
    # these batches, polled between examples, cannot budget)
    with config.using(protocol=protocol, client=client, op_timeout=op_timeout, minimise_seconds=0, found=found,
                      client_options=dict(client_options or {}), max_ranks=max_ranks, nemesis_spec="none"):
        try:
            while not should_stop():
                ran = False
                for i, machine in enumerate(machines):
                    took = per_example.setdefault(machine.__name__, [])  # (the first batch made the stores too:
                    #                                                          it counts until another one ran)
                    examples = batch_size(left() / (len(machines) - i), max(took[1:] or took) if took else None)
                    if not examples:
                        continue
                    ran = True
                    steps0, t0 = RULE_STEPS[_layer(machine)], time.monotonic()
                    seeded = hypothesis.seed(f"shardcheck-check-{seed}-{cov.batches}-{machine.__name__}")(
                        type(machine.__name__, (machine,), {"__module__": machine.__module__}))
                    failed = run_machine(seeded, settings(BATCH, max_examples=examples))[0]
                    took.append((time.monotonic() - t0) / examples)
                    steps = RULE_STEPS[_layer(machine)] - steps0
                    cov.rule_steps += steps
                    cov.by_machine[machine.__name__] = cov.by_machine.get(machine.__name__, 0) + steps
                    if failed:
                        return found
                if not ran:  # no machine's batch fits in what is left of the phase
                    break
                cov.batches += 1
        finally:
            for path, count in PATH_CALLS.items():
                if count > paths0.get(path, 0):
                    cov.paths[path] = cov.paths.get(path, 0) + count - paths0.get(path, 0)
    return []


def _layer(machine: type) -> str:
    return "store" if issubclass(machine, StoreMachine) else "protocol"


class HypothesisMachines:
    """`check`'s Hypothesis engine: the state machines in seeded batches (the store layer first for a real client). A
    protocol-layer failure is re-run as a `Case` by the check's runner (so it is minimised like the others); a
    store-layer failure is its store-ops trace."""

    name = "hypothesis"

    def search(self, ctx: SearchContext) -> Finding | None:
        t = ctx.target
        traces = hypothesis_search(t.protocol, t.client, should_stop=ctx.should_stop, seed=ctx.seed,
                                   store_layer=not t.client.in_memory, op_timeout=ctx.op_timeout,
                                   coverage=ctx.coverage.of(self.name, HypothesisCoverage),
                                   client_options=dict(t.client_options), max_ranks=t.ranks or t.max_ranks,
                                   left=lambda: ctx.phase_end - time.monotonic())
        for trace in traces:
            if trace.kind == "store-ops":
                trace.client, trace.expect = t.client.name, {t.client.name: "reproduces"}
                return Finding(strategy=self.name, violations=violations_of(trace), trace=trace)
            case = trace.case()
            if (case.others and t.runner != "sim") or not t.allows(case.n_ranks):
                continue
            outcome = ctx.run(t.protocol.obj, case)
            if outcome.violations:
                return ctx.protocol_finding(case, outcome, self.name)
        return None
