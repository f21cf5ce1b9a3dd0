"""The state machines as a search engine for `shardcheck check`: seeded batches until a budget ends.

Each batch runs `ProtocolMachine` (and, for a real client, `StoreMachine` first) with Hypothesis under a
seed derived from `seed` and the batch number, so the same seed gives the same search. A failing run
writes its trace (as in `pytest properties/`, here into a temporary directory); the engine returns them.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable

import hypothesis
from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import Flaky
from hypothesis.stateful import run_state_machine_as_test

from model.calls import DEFAULT_OP_TIMEOUT
from model.trace import Trace
from properties import config
from properties.machines import RULE_STEPS, ProtocolMachine, StoreMachine, violated_properties

__all__ = ["BATCH", "run_machine", "caught", "hypothesis_search"]

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


def hypothesis_search(protocol: Any, client: Any, *, should_stop: Callable[[], bool], seed: int = 0,
                      store_layer: bool = False, op_timeout: float = DEFAULT_OP_TIMEOUT) -> tuple[list[Trace], int]:
    """Run the machines in seeded batches until `should_stop()` or a failure: (traces found, rule steps)."""
    with tempfile.TemporaryDirectory(prefix="shardcheck-hypothesis-") as tmp:
        return _search(protocol, client, Path(tmp), should_stop, seed, store_layer, op_timeout)


def _search(protocol: Any, client: Any, found_dir: Path, should_stop: Callable[[], bool], seed: int,
            store_layer: bool, op_timeout: float) -> tuple[list[Trace], int]:
    machines = ([StoreMachine] if store_layer else []) + [ProtocolMachine]
    steps0 = sum(RULE_STEPS.values())
    batch = 0
    # minimise_seconds=0: `check` minimises the trace itself, within its own budget
    with config.using(protocol=protocol, client=client, found_dir=found_dir, op_timeout=op_timeout,
                      minimise_seconds=0):
        while not should_stop():
            for machine in machines:
                seeded = hypothesis.seed(f"shardcheck-check-{seed}-{batch}-{machine.__name__}")(
                    type(machine.__name__, (machine,), {"__module__": machine.__module__}))
                if run_machine(seeded, BATCH)[0]:
                    traces = [Trace.load(p) for p in sorted(found_dir.glob("*.json"))]
                    return traces, sum(RULE_STEPS.values()) - steps0
            batch += 1
    return [], sum(RULE_STEPS.values()) - steps0
