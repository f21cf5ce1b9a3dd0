"""The state machines as a search engine for `shardcheck check`: seeded batches until a budget ends.

Each batch runs `ProtocolMachine` (and, for a real client, `StoreMachine` first) with Hypothesis under a
seed derived from `seed` and the batch number, so the same seed gives the same search. A failing run
writes its trace under `found_dir` (as in `pytest properties/`); the engine returns those paths.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable

from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import Flaky
from hypothesis.stateful import run_state_machine_as_test

from properties import config, profiles
from properties.machines import RULE_STEPS, ProtocolMachine, StoreMachine

#: One batch: few examples, so the budget is polled often. No shrinking inside Hypothesis: it cannot be
#: bounded in time (each shrink step of a hanging client costs a timeout); `check` minimises protocol
#: cases itself.
BATCH = settings(max_examples=10, stateful_step_count=25, deadline=None, database=None,
                 phases=(Phase.generate,), report_multiple_bugs=False, suppress_health_check=list(HealthCheck))


def hypothesis_search(protocol: Any, client: Any, *, should_stop: Callable[[], bool], seed: int = 0,
                      store_layer: bool = False, op_timeout: float = 2.0) -> tuple[list[Path], int]:
    """Run the machines in seeded batches until `should_stop()` or a failure: (traces written, rule steps)."""
    found_dir = Path(tempfile.mkdtemp(prefix="shardcheck-hypothesis-"))
    machines = ([StoreMachine] if store_layer else []) + [ProtocolMachine]
    steps0 = sum(RULE_STEPS.values())
    batch = 0
    with config.using(protocol=protocol, client=client, found_dir=found_dir, op_timeout=op_timeout):
        while not should_stop():
            for machine in machines:
                profiles.seed_test(f"shardcheck-check-{seed}-{batch}-{machine.__name__}")
                try:
                    run_state_machine_as_test(machine, settings=BATCH)
                except (AssertionError, ExceptionGroup, Flaky):
                    return sorted(found_dir.glob("*.json")), sum(RULE_STEPS.values()) - steps0
            batch += 1
    return [], sum(RULE_STEPS.values()) - steps0
