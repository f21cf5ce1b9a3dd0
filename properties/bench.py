"""`measure(seconds)`: rule steps per second of each property layer, default protocol and client.

Each layer's state machine runs under Hypothesis (generation only: no database, no shrinking is needed on
a passing reference) for about `seconds / 2`; the machines count their rule executions in
`properties.machines.RULE_STEPS`.
"""
from __future__ import annotations

import time

from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from properties import config
from properties.machines import RULE_STEPS, ProtocolMachine, StoreMachine

__all__ = ["measure"]

_SETTINGS = dict(deadline=None, database=None, phases=(Phase.generate,), stateful_step_count=50,
                 suppress_health_check=list(HealthCheck))


def _rate(machine: type, layer: str, seconds: float) -> float:
    """Rule steps per second of `machine` over at least `seconds` (whole Hypothesis runs of 100 examples)."""
    steps, spent = 0, 0.0
    while spent < seconds:
        before = RULE_STEPS[layer]
        start = time.perf_counter()
        run_state_machine_as_test(machine, settings=settings(max_examples=100, **_SETTINGS))
        spent += time.perf_counter() - start
        steps += RULE_STEPS[layer] - before
    return steps / spent if spent else 0.0


def measure(seconds: float = 4.0) -> dict[str, float]:
    """`{"protocol_steps_per_s": ..., "store_steps_per_s": ...}` with the reference protocol and `model` client."""
    with config.using(protocol=None, client=None, write_traces=False):
        return {"protocol_steps_per_s": _rate(ProtocolMachine, "protocol", seconds / 2),
                "store_steps_per_s": _rate(StoreMachine, "store", seconds / 2)}


if __name__ == "__main__":
    print(measure())
