"""The explorer's shards on a 2-worker local Ray cluster give the one-process result (Ray always shut down)."""
from __future__ import annotations

import os

import pytest
import ray

from checking.explore.on_ray import ROOT, explore_ray
from checking.manifest import load, run_entry
from tests.test_explore_shards import spec_of

ENTRIES = {e["name"]: e for e in load()["entries"]}
CONFIGS = ("PaperProtocolAsync-3x5-all-f2-por", "GiveUpOnLocalMiss-2x3-all-f1-full-agreement")


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster of 2 CPUs for this module, shut down whatever happens."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}})
    try:
        yield ray
    finally:
        ray.shutdown()


def test_ray_shards_equal_one_process(ray_cluster):
    """Two manifest configurations (one held, one violated) on 2 Ray workers: same states, verdict, counterexample."""
    for name in CONFIGS:
        entry = ENTRIES[name]
        one = run_entry(entry)
        got = explore_ray(spec_of(entry), None, workers=2, timeout=300)
        assert got.failed_shards == [] and got.workers == 2
        assert (got.verdict, got.states, got.depth, got.counterexample) == \
            (one.verdict, one.states, one.depth, one.counterexample), name
    assert ray_cluster.is_initialized()  # a cluster the caller started is left running


def test_a_ray_shard_whose_worker_dies_is_retried_then_reported(ray_cluster, monkeypatch):
    """Tasks whose worker process dies are retried by Ray, then named in failed_shards: verdict incomplete."""
    from checking.explore.shards import ShardSpec
    monkeypatch.setenv("SHARDCHECK_TEST_DRIVER_PID", str(os.getpid()))  # the parent resolves the protocol too
    spec = ShardSpec(protocol="tests.dying:DiesOutsideTheDriver", n_ranks=2, n_chunks=3)
    got = explore_ray(spec, None, workers=2, retries=1, timeout=120)
    assert got.verdict == "incomplete" and [i for i, _ in got.failed_shards] == [0, 1]
    assert all(why for _, why in got.failed_shards)
