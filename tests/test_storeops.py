"""`checking.minimise.ddmin`: delta debugging of store-op sequences to a 1-minimal one; the runs a candidate gets."""
from __future__ import annotations

from hypothesis import given

import pytest

from checking.minimise import CANDIDATE_RUNS, runs_per_candidate
from checking.minimise import ddmin as minimise_ops
from checking.storeops import run_ops
from model.finding import Rate
from properties.strategies import needed_ops


def _ops(n: int) -> list[dict]:
    return [{"rank": 0, "op": "get", "key": f"k{i}"} for i in range(n)]


@given(needed_ops)
def test_minimise_keeps_exactly_the_needed_ops_in_order(case):
    """With a failure that needs a set of ops, the result is exactly those ops, in order, and 1-minimal."""
    n, needed = case
    keys = {f"k{i}" for i in needed}
    ops, minimal = minimise_ops(_ops(n), lambda shorter: keys <= {o["key"] for o in shorter})
    assert [o["key"] for o in ops] == [f"k{i}" for i in sorted(needed)] and minimal


def test_minimise_removes_large_chunks_first():
    """One culprit among 64 ops is found in a logarithmic number of replays, not one per op."""
    calls = []

    def fails(shorter):
        calls.append(len(shorter))
        return any(o["key"] == "k41" for o in shorter)

    ops, minimal = minimise_ops(_ops(64), fails)
    assert [o["key"] for o in ops] == ["k41"] and minimal
    assert len(calls) <= 16, calls


def test_minimise_stops_when_told_and_says_it_is_not_minimal():
    """`should_stop` ends the search with a still-failing sequence marked not 1-minimal."""
    calls = []

    def fails(shorter):
        calls.append(1)
        return True

    ops, minimal = minimise_ops(_ops(10), fails, should_stop=lambda: len(calls) >= 2)
    assert not minimal and len(calls) == 2 and len(ops) < 10


def test_minimise_returns_a_sequence_that_fails_only_as_it_is():
    """When every removal loses the failure, the sequence comes back unchanged and 1-minimal."""
    ops, minimal = minimise_ops(_ops(3), lambda shorter: len(shorter) == 3)
    assert [o["key"] for o in ops] == ["k0", "k1", "k2"] and minimal


@pytest.mark.parametrize("kind", sorted(CANDIDATE_RUNS))
def test_a_candidate_gets_the_runs_its_rate_needs_up_to_its_layers_cap(kind):
    """A frequent finding's candidate gets the few runs its rate needs to show; a rare one's, its layer's cap."""
    assert runs_per_candidate(kind, 50, 50) == Rate(50, 50).runs_to_show() < CANDIDATE_RUNS[kind]
    assert runs_per_candidate(kind, 1, 50) == CANDIDATE_RUNS[kind] < Rate(1, 50).runs_to_show()
    with pytest.raises(KeyError):
        runs_per_candidate("protocol", 1, 2)  # (a deterministic layer's candidate runs once: it has no cap)


def test_run_ops_tells_a_wrong_key_from_a_stale_value():
    """A read answering another key's value is `wrong-key`; a stale value of its own key stays `store-roundtrip`."""
    from properties.bad_stores import DeleteKeepsCacheStore, MgetDropsMissesStore
    ops = [{"rank": 0, "op": "put", "key": "b", "value": b"B"}, {"rank": 0, "op": "get_batch", "keys": ["a", "b"]}]
    _, violations = run_ops([MgetDropsMissesStore()], ops)
    assert violations[0].property == "wrong-key" and "answered 'a' with a value put for 'b'" in violations[0].summary
    ops = [{"rank": 0, "op": "put", "key": "a", "value": b"A"}, {"rank": 0, "op": "get", "key": "a"},
           {"rank": 0, "op": "put", "key": "b", "value": b"A"}, {"rank": 0, "op": "delete", "key": "a"},
           {"rank": 0, "op": "get", "key": "a"}]
    _, violations = run_ops([DeleteKeepsCacheStore()], ops)
    assert violations[0].property == "store-roundtrip"
