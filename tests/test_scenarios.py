"""The store client's fixed scenarios (`checking.scenarios`): the model passes every one; each is a store-ops
sequence over the client's declared read paths, and a failure is a trace that replays."""
from __future__ import annotations

from adapters.catalogue import CLIENTS
from checking.scenarios import SCENARIOS, ScenarioCoverage, run_scenarios, scenario_ops
from checking.storeops import bounded_factory, run
from runtime.registry import resolve_client


def test_the_model_passes_every_scenario():
    assert run_scenarios(resolve_client("model", CLIENTS), op_timeout=1.0) == []


def test_scenarios_read_through_every_declared_path():
    """A path the client declares is read in each scenario that reads; a multi-key one with a list of keys."""
    paths = ("get", "get_sync", "get_prefix", "contains", "contains_batch")
    for name in SCENARIOS:
        ops = scenario_ops(name, paths=paths)
        reads = {op["op"] for op in ops if op["op"] not in ("put", "delete")}
        assert reads - {"get_async"} == ({"get_prefix", "contains_batch"} if name == "batch-misses" else set(paths)), name
        assert all(isinstance(op["keys"], list) for op in ops if op["op"] in ("get_prefix", "contains_batch"))


def test_an_mget_that_drops_its_misses_fails_batch_misses_as_wrong_key():
    """The MGET demo passes every single-key scenario and fails `batch-misses` with `wrong-key`; its trace
    replays on fresh stores."""
    client = resolve_client("properties.bad_stores:mget_drops_misses_factory", CLIENTS)
    found = run_scenarios(client, op_timeout=1.0)
    assert [(t.origin, t.property) for t in found] == [("scenario:batch-misses", "wrong-key")]
    _, violations = run(found[0], bounded_factory(found[0], client))
    assert violations[0].property == "wrong-key"


def test_a_client_local_read_cache_fails_the_shared_tier_scenarios_and_replays(tmp_path):
    """Correct alone (every single-client scenario passes), the local read cache fails the scenarios where another
    client deletes or overwrites, or the server evicts, as `shared-tier`; each trace replays on fresh shared stores
    (reproduces on it, fixed on the model), and on a client that cannot share its servers it cannot run."""
    from shardcheck.replay_cmd import run_replay
    client = resolve_client("properties.bad_stores:local_read_cache_factory", CLIENTS)
    found = run_scenarios(client, op_timeout=1.0)
    assert {t.origin: t.property for t in found} == {
        "scenario:another-client-deletes": "shared-tier", "scenario:another-client-overwrites": "shared-tier",
        "scenario:server-evicts": "shared-tier"}
    paths = [str(t.save_unique(tmp_path, "shared")) for t in found]
    assert all(t.config["clients"] == 2 for t in found)
    assert {r["outcome"] for r in run_replay(paths)} == {"reproduces"}
    assert {r["outcome"] for r in run_replay(paths, "model")} == {"fixed"}
    rows = run_replay(paths, "properties.bad_stores:shared_server_factory")
    assert {r["outcome"] for r in rows} == {"error"} and all("takes no `urls`" in r["why"] for r in rows)


def test_a_client_that_cannot_share_its_servers_is_told_so():
    """A factory without `urls` runs the single-client scenarios; the coverage says the shared-tier ones did not run."""
    ran = ScenarioCoverage()
    found = run_scenarios(resolve_client("properties.bad_stores:shared_server_factory", CLIENTS), op_timeout=1.0, coverage=ran)
    assert [t.origin for t in found] == ["scenario:rank-isolation"]
    assert "urls" in ran.shared_not_run and "the shared-tier ones did not run" in ran.text()
