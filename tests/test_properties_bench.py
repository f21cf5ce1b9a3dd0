"""`properties.layer_rates`: the ceiling machine is the protocol machine's rules doing nothing (it bounds the protocol
layer from above only while it draws exactly what the protocol machine draws); the figures are reported."""
from __future__ import annotations

from properties.layer_rates import CeilingMachine, measure
from properties.machines import ProtocolMachine


def _shape(machine: type) -> list[tuple]:
    """(rule name, its argument names and strategies, how many preconditions) of each rule and initializer."""
    state = machine.setup_state()
    return sorted((r.function.__name__, sorted((k, repr(v)) for k, v in r.arguments.items()), len(r.preconditions))
                  for r in state.rules + state.initializers)


def test_the_ceiling_draws_what_the_protocol_machine_draws():
    """Same rules, same strategies, same preconditions: a rule added to the protocol machine (or a strategy
    changed) without its twin in the ceiling machine fails here."""
    assert _shape(CeilingMachine) == _shape(ProtocolMachine)


def test_measure_reports_the_layer_its_ceiling_and_the_share():
    """A short measurement has every figure, and the share is the ratio of the two rates."""
    got = measure(0.4)
    assert got["protocol_steps_per_s"] > 0 and got["protocol_ceiling_steps_per_s"] > 0 and got["store_steps_per_s"] > 0
    assert abs(got["protocol_of_ceiling"] - got["protocol_steps_per_s"] / got["protocol_ceiling_steps_per_s"]) < 1e-9
