"""`measure(seconds)`: rule steps per second of each property layer, default protocol and client, and the
ceiling Hypothesis itself puts on the protocol layer in the same run.

Each layer's state machine runs under Hypothesis (generation only: no database, no shrinking is needed on
a passing reference) for about `seconds / 2`; the machines count their rule executions in
`properties.machines.RULE_STEPS`. The ceiling is `CeilingMachine`: the protocol machine's rules, with the same
strategies and precondition, doing nothing; what Hypothesis spends drawing and dispatching bounds the protocol
layer from above. The two are run in alternation, so a shared machine's load falls on both alike.
"""
from __future__ import annotations

import time

from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

from properties import config, strategies as s
from properties.machines import RULE_STEPS, ProtocolMachine, StoreMachine

__all__ = ["measure", "CeilingMachine"]

_SETTINGS = dict(deadline=None, database=None, phases=(Phase.generate,), stateful_step_count=50,
                 suppress_health_check=list(HealthCheck))


class CeilingMachine(RuleBasedStateMachine):
    """`ProtocolMachine`'s rules and strategies with empty bodies: Hypothesis's own cost per rule step."""

    def __init__(self) -> None:
        super().__init__()
        self.chunks = 0

    @initialize(n_ranks=s.n_ranks, n_chunks=s.n_chunks, salt=s.salts)
    def first_prompt(self, n_ranks: int, n_chunks: int, salt: str) -> None:
        RULE_STEPS["ceiling"] += 1
        self.chunks = n_chunks

    @rule(n_ranks=s.n_ranks, n_chunks=s.n_chunks, salt=s.salts, others=s.other_prompts)
    def store_prompt(self, n_ranks: int, n_chunks: int, salt: str, others: list) -> None:
        RULE_STEPS["ceiling"] += 1
        self.chunks = n_chunks

    @precondition(lambda self: self.chunks > 0)
    @rule(chunk=s.chunk_index, rank=s.evict_rank)
    def evict(self, chunk: int, rank: int | None) -> None:
        RULE_STEPS["ceiling"] += 1

    @rule()
    def lookup(self) -> None:
        RULE_STEPS["ceiling"] += 1

    @rule(rank=s.rank_index, ahead=s.async_ahead)
    def lose_completion(self, rank: int, ahead: int) -> None:
        RULE_STEPS["ceiling"] += 1

    @rule(rank=s.rank_index, ahead=s.async_ahead, seconds=s.delays)
    def delay_completion(self, rank: int, ahead: int, seconds: float) -> None:
        RULE_STEPS["ceiling"] += 1

    @rule()
    def start_load(self) -> None:
        RULE_STEPS["ceiling"] += 1

    @rule(choice=s.move_choice)
    def move(self, choice: int) -> None:
        RULE_STEPS["ceiling"] += 1

    @rule()
    def finish(self) -> None:
        RULE_STEPS["ceiling"] += 1


def _run(machine: type, layer: str) -> tuple[int, float]:
    """One Hypothesis run of 100 examples: (rule steps, seconds)."""
    before = RULE_STEPS[layer]
    start = time.perf_counter()
    run_state_machine_as_test(machine, settings=settings(max_examples=100, **_SETTINGS))
    return RULE_STEPS[layer] - before, time.perf_counter() - start


def _rates(machines: dict[str, type], seconds: float) -> dict[str, float]:
    """Rule steps per second of each machine (layer name -> class), run in turn until each had `seconds`."""
    steps = {layer: 0 for layer in machines}
    spent = {layer: 0.0 for layer in machines}
    while min(spent.values()) < seconds:
        for layer, machine in machines.items():
            got, took = _run(machine, layer)
            steps[layer] += got
            spent[layer] += took
    return {layer: steps[layer] / spent[layer] if spent[layer] else 0.0 for layer in machines}


def measure(seconds: float = 4.0) -> dict[str, float]:
    """`{"protocol_steps_per_s", "protocol_ceiling_steps_per_s", "protocol_of_ceiling", "store_steps_per_s"}` with
    the reference protocol and `model` client (`protocol_of_ceiling`: the protocol layer's share of the ceiling)."""
    with config.using(protocol=None, client=None, write_traces=False):
        both = _rates({"protocol": ProtocolMachine, "ceiling": CeilingMachine}, seconds / 2)
        store = _rates({"store": StoreMachine}, seconds / 2)
    return {"protocol_steps_per_s": both["protocol"], "protocol_ceiling_steps_per_s": both["ceiling"],
            "protocol_of_ceiling": both["protocol"] / both["ceiling"] if both["ceiling"] else 0.0,
            "store_steps_per_s": store["store"]}


if __name__ == "__main__":
    print(measure())
