"""Retention (`checking.retention`): a value put and never deleted is still readable later; a client that writes
with a 1 s TTL passes every other store check and is violated here; a declared `retention` is honoured."""
from __future__ import annotations

import time

from adapters.catalogue import CLIENTS
from checking.retention import RetentionRun, plan
from checking.scenarios import run_scenarios
from checking.storeops import bounded_factory, run
from model.store import MemoryStore
from properties.bad_stores import ExpiringStore, expiring_factory
from runtime.registry import resolve_client


class Promising(ExpiringStore):
    """Keeps values `TTL` seconds and says so (`retention`)."""

    TTL = 1.0
    retention = 1.0


class Overpromising(ExpiringStore):
    TTL = 0.3
    retention = 1.0


def _run(factory, retention: float = 1.2):
    aged = RetentionRun(resolve_client(factory, CLIENTS), retention=retention, op_timeout=1.0)
    try:
        return aged.finish(time.monotonic() + 10), aged.note
    finally:
        aged.close()


def test_the_age_tested_is_retention_or_just_before_the_declared_one():
    assert plan([MemoryStore()], 3.0)[0] == 3.0
    assert plan([Promising()], 3.0)[0] == 0.9 and "declares retention = 1 s" in plan([Promising()], 3.0)[1]
    assert plan([Promising()], 0.5)[0] == 0.5
    zero = type("Zero", (MemoryStore,), {"retention": 0})
    assert plan([zero()], 3.0) == (None, "not tested: the client declares retention = 0 (it promises to keep nothing)")
    assert plan([MemoryStore()], 0.0)[0] is None


def test_a_1s_ttl_passes_every_scenario_and_is_violated_by_retention():
    """The TTL client passes the fixed scenarios (fresh keys, milliseconds) and fails `retention`, with a
    3-op trace (put, age, read) that replays: reproduces on it, fixed on the model."""
    assert run_scenarios(resolve_client(expiring_factory, CLIENTS), op_timeout=1.0) == []
    trace, note = _run(expiring_factory)
    assert trace is not None and trace.property == "retention" and "VIOLATED" in note
    assert [op["op"] for op in trace.ops] == ["put", "age", "get"] and "never deleted" in trace.summary
    _, violations = run(trace, bounded_factory(trace, resolve_client(expiring_factory, CLIENTS)))
    assert violations[0].property == "retention"
    assert run(trace, bounded_factory(trace, resolve_client("model", CLIENTS)))[1] == []


def test_the_model_keeps_its_values():
    trace, note = _run("model", retention=0.5)
    assert trace is None and "held" in note


def test_a_declared_retention_is_honoured_and_held_to():
    """A client that declares it keeps values 1 s is read back just before (held); one that declares 1 s and keeps
    0.3 s is violated."""
    def factory(cls):
        made = lambda n_ranks, **options: [cls() for _ in range(n_ranks)]  # noqa: E731
        made.options = ()
        return made
    trace, note = _run(factory(Promising), retention=5.0)
    assert trace is None and "declares retention = 1 s" in note
    trace, _ = _run(factory(Overpromising), retention=5.0)
    assert trace is not None and trace.property == "retention"


def test_check_says_what_retention_it_tested_or_why_not():
    from shardcheck.check_cmd import run_check
    held = run_check(None, "model", budget=2.0, retention=0.5)["stats"]["coverage"]["retention"]
    assert "read back 0.5 s after their put" in held["text"] and "held" in held["text"]
    short = run_check(None, "model", budget=1.0, retention=30.0)["stats"]["coverage"]["retention"]
    assert short["text"].startswith("not tested: the run ended")
    found = run_check(None, "properties.bad_stores:expiring_factory", budget=4.0, retention=1.0)
    assert found["verdict"] == "violated" and found["violations"][0]["property"] == "retention"
    assert found["stats"]["seconds"] < 4.0 + 5.0 + 2.0  # (the budget, check's grace, and a margin for a slow box)
