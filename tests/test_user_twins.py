"""The user's valkey-py client and its buggy twins (`tests.user_twins`) on real embedded Valkey: a client-local read
cache (correct alone), a 1 s TTL, an MGET that shifts values onto the wrong keys; each caught with its own property,
its trace replaying on the twin and `fixed` on the correct client."""
from __future__ import annotations

import time

import pytest

from adapters.catalogue import CLIENTS
from checking.retention import RetentionRun
from checking.scenarios import SCENARIOS, SHARED_SCENARIOS, ScenarioCoverage, run_scenarios
from runtime.registry import resolve_client
from shardcheck.replay_cmd import run_replay

pytestmark = pytest.mark.real
TWINS = "tests.user_twins"
CORRECT = "tests.user_clients:valkey_factory"


def test_a_client_local_read_cache_is_correct_alone_and_wrong_on_a_shared_tier(tmp_path):
    """One client per server: every scenario passes. Two clients of the same servers: another client's delete or
    overwrite, and the server's own eviction (found by SCAN: the client has no server_key), are missed."""
    client = resolve_client(f"{TWINS}:local_cache_factory", CLIENTS)
    assert run_scenarios(client, op_timeout=2.0, names=SCENARIOS) == []
    ran = ScenarioCoverage()
    found = run_scenarios(client, op_timeout=2.0, names=SHARED_SCENARIOS, coverage=ran)
    assert ran.clients == 2 and not ran.shared_not_run, ran
    assert {t.origin: t.property for t in found} == {
        "scenario:another-client-deletes": "shared-tier", "scenario:another-client-overwrites": "shared-tier",
        "scenario:server-evicts": "shared-tier"}
    paths = [str(t.save_unique(tmp_path, "twin")) for t in found]
    assert {r["outcome"] for r in run_replay(paths)} == {"reproduces"}
    assert {r["outcome"] for r in run_replay(paths, CORRECT)} == {"fixed"}


def test_a_1s_ttl_passes_every_scenario_and_fails_retention():
    client = resolve_client(f"{TWINS}:ttl_factory", CLIENTS)
    assert run_scenarios(client, op_timeout=2.0) == []
    assert run_scenarios(resolve_client(CORRECT, CLIENTS), op_timeout=2.0) == []
    for factory, violated in ((client, True), (resolve_client(CORRECT, CLIENTS), False)):
        aged = RetentionRun(factory, retention=1.5, op_timeout=2.0)
        try:
            trace = aged.finish(time.monotonic() + 10)
        finally:
            aged.close()
        assert (trace is not None and trace.property == "retention") is violated, aged.note


def test_an_mget_that_drops_misses_is_a_wrong_key_and_replays(tmp_path):
    client = resolve_client(f"{TWINS}:mget_shift_factory", CLIENTS)
    (trace,) = run_scenarios(client, op_timeout=2.0)
    assert (trace.origin, trace.property) == ("scenario:batch-misses", "wrong-key")
    path = str(trace.save_unique(tmp_path, "twin"))
    assert run_replay([path])[0]["outcome"] == "reproduces"
    assert run_replay([path], CORRECT)[0]["outcome"] == "fixed"
