"""Exact partitioning of the explorer: shards merged give the one-process result on every manifest entry."""
from __future__ import annotations

import pytest

from checking.explore import ExploreError
from checking.explore.shards import ShardSpec, explore_sharded, merge, run_shard
from checking.manifest import load, run_entry

ENTRIES = load()["entries"]


def spec_of(entry: dict) -> ShardSpec:
    """The shard spec of a manifest entry."""
    return ShardSpec(protocol=entry["protocol"], n_ranks=entry["n_ranks"], n_chunks=entry["n_chunks"],
                     cached=None if entry["cached"] == "all" else tuple(entry["cached"]),
                     max_faults=entry["max_faults"], reduction=entry["reduction"], lazy=entry.get("lazy", False),
                     properties=tuple(entry["properties"]) if entry.get("properties") else None,
                     others=tuple({"evicted": [], "shared": 0, "salt": "t1", **o} for o in entry.get("others", ())))


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["name"] for e in ENTRIES])
def test_merged_shards_equal_one_process(entry):
    """2 and 3 shards merge to the one-process states, verdict, depth, property and counterexample."""
    one = run_entry(entry)
    for count in (2, 3):
        got = explore_sharded(spec_of(entry), count)
        assert (got.verdict, got.states, got.depth, got.counterexample) == \
            (one.verdict, one.states, one.depth, one.counterexample), count
        assert (got.violation is None) == (one.violation is None)
        if one.violation is not None:
            assert got.violation.property == one.violation.property


def test_merge_refuses_an_incomplete_partition():
    """A missing or duplicated shard is an error, never a silently smaller count."""
    spec = spec_of(ENTRIES[0])
    a = run_shard(spec, 0, 2)
    with pytest.raises(ExploreError, match="not shards 0..1"):
        merge(spec, [a])
    with pytest.raises(ExploreError, match="not shards 0..1"):
        merge(spec, [a, a])
    with pytest.raises(ExploreError, match="not one of"):
        run_shard(spec, 2, 2)


def test_shards_cut_after_the_violation_level_still_merge_exactly():
    """Shards stopped once past another shard's violation level merge to the one-process result."""
    cuts = 0
    for entry in ENTRIES:
        if entry["expect"]["verdict"] != "violated":
            continue
        spec = spec_of(entry)
        full = [run_shard(spec, i, 3) for i in range(3)]
        level = min(r.key for r in full if r.key is not None)[1]
        again = [r if r.key is not None else run_shard(spec, r.index, 3, stop_after=lambda: level) for r in full]
        cuts += sum(r.verdict == "cut" for r in again)
        got, one = merge(spec, again), run_entry(entry)
        assert (got.verdict, got.states, got.depth, got.counterexample) == \
            (one.verdict, one.states, one.depth, one.counterexample), entry["name"]
    assert cuts > 0
