"""The real lmcache 0.5.6 clients against real Valkey servers: round trips, bounds, recovery,
the generic probe's findings against stock 0.5.6, and the patched client passing every check."""

from __future__ import annotations

import concurrent.futures as cf
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adapters.lmcache_stores import (
    CHUNK_BYTES,
    MAX_VALUE,
    StoreCallTimeout,
    native_factory,
    resp_factory,
    valkey_factory,
)
from adapters.patched import patched_factory, patched_valkey_factory
from adapters.probe import CHECKS, probe
from adapters.valkey_servers import ServerSet, ping

pytestmark = pytest.mark.real
ROOT = Path(__file__).resolve().parents[1]
T = 0.3  # op_timeout of these tests: every op here takes milliseconds when it answers at all

FACTORIES = {"lmcache": resp_factory, "lmcache-native": native_factory,
             "lmcache-valkey": valkey_factory, "lmcache-patched": patched_factory}


def close_all(stores) -> None:
    for s in stores:
        s.close()


@pytest.mark.parametrize("client", list(FACTORIES))
def test_factory_round_trips_and_owns_its_servers(client: str):
    """Each real client round-trips a value and stops the servers it started when its stores close."""
    mla = client in ("lmcache-patched", "lmcache-native")  # stock RemoteBackend + MLA: see the probe
    stores = FACTORIES[client](2, use_mla=mla, op_timeout=2.0)
    servers = stores[0].servers
    try:
        assert isinstance(servers, ServerSet) and len(servers) == 2
        assert {"get", "get_async", "get_batch"} <= set(stores[0].paths)
        for rank, st in enumerate(stores):
            for n in (0, 1, 7, 1000, MAX_VALUE):
                v = bytes((rank * 31 + i) % 256 for i in range(n))
                st.put(f"k{n}", v)
                assert st.get(f"k{n}") == v
            assert st.contains("k7") and not st.contains("never")
            fut = st.get_async("k1000")
            assert isinstance(fut, cf.Future) and len(fut.result(2.0)) == 1000
            assert st.get_batch(["k0", "k1"]) == [b"", bytes([(rank * 31) % 256])]
            st.delete("k7")
            assert not st.contains("k7")
            # LMCache's own key names, each rank on its own server
            assert f"shardcheck@2@{rank}@" in " ".join(st.server_keys())
        with pytest.raises(ValueError):
            stores[0].put("too-big", bytes(CHUNK_BYTES))
    finally:
        pids = servers.pids
        close_all(stores)
    assert not servers.running() and not any(ping(p, timeout=0.2) for p in servers.ports), pids


def test_urls_option_uses_running_servers_and_leaves_them_running(shardcheck_servers):
    """With `urls`, a client uses the given servers and leaves them running on close."""
    stores = native_factory(2, urls=shardcheck_servers.urls, op_timeout=2.0)
    try:
        assert stores[0].servers is None
        assert [s.port for s in stores] == shardcheck_servers.ports
        stores[1].put("x", b"y")
        assert stores[1].get("x") == b"y"
    finally:
        close_all(stores)
    assert shardcheck_servers.running()


def test_shared_topology_is_one_server_for_every_rank():
    """The shared topology puts every rank on one server."""
    stores = valkey_factory(3, topology="shared", use_mla=False, op_timeout=2.0)
    try:
        assert len({s.port for s in stores}) == 1 and len(stores[0].servers) == 1
        for r, s in enumerate(stores):
            s.put("same-name", bytes([r]))
        assert [s.get("same-name") for s in stores] == [b"\x00", b"\x01", b"\x02"]
    finally:
        close_all(stores)


def test_password_reaches_every_client():
    """A password option reaches every client that can authenticate."""
    for client in ("lmcache", "lmcache-native", "lmcache-patched", "valkey-patched"):
        fac = patched_valkey_factory if client == "valkey-patched" else FACTORIES[client]
        stores = fac(1, password="pw", use_mla=False, op_timeout=2.0)
        try:
            stores[0].put("a", b"b")
            assert stores[0].get("a") == b"b", client
        finally:
            close_all(stores)


STOCK_VALKEY_AUTH = """
import json
from adapters.lmcache_stores import valkey_factory
from adapters.probe import probe
fs = probe(valkey_factory, 1, client="lmcache-valkey", use_mla=False, op_timeout=0.5,
           checks=("auth-round-trip",))
print(json.dumps([f.to_json() for f in fs]), flush=True)
import os
os._exit(0)  # glide keeps retrying the failed clients on its own threads: do not wait for them
"""


def test_probe_stock_valkey_connector_cannot_authenticate():
    # in a child process: after the failed connect, glide's threads keep reporting errors
    """The probe finds that stock lmcache's valkey:// connector cannot authenticate."""
    out = subprocess.run([sys.executable, "-c", STOCK_VALKEY_AUTH], capture_output=True, text=True,
                         timeout=60, cwd=str(ROOT))
    fs = json.loads(out.stdout.strip().splitlines()[-1])
    assert [f["check"] for f in fs] == ["auth-round-trip"], out.stderr[-2000:]
    assert "could not connect" in fs[0]["summary"]


def test_a_stuck_call_times_out_close_never_blocks_and_a_new_factory_call_works():
    """A stuck call times out, close() never blocks, and a new factory call works."""
    stores = resp_factory(2, use_mla=False, op_timeout=T)
    servers = stores[0].servers
    t0 = time.monotonic()
    with pytest.raises(StoreCallTimeout) as exc:
        stores[0].get("never-written")
    took = time.monotonic() - t0
    assert (exc.value.op, exc.value.key, exc.value.seconds) == ("get", "never-written", T)
    assert T <= took < T + 5  # the bound is what ended the call (a hang would be the client's 10 s, or never)
    t0 = time.monotonic()
    close_all(stores)
    assert time.monotonic() - t0 < 5  # close() never waits on the stuck call (it would wait for ever)
    assert not servers.running()
    again = resp_factory(2, use_mla=False, op_timeout=T)
    try:
        again[1].put("k", b"v")
        assert again[1].get("k") == b"v"
    finally:
        close_all(again)


# --------------------------------------------------------------------------- the probe on stock 0.5.6

def checks_of(findings) -> set[str]:
    return {f.check for f in findings}


def test_probe_stock_resp_missing_key_read_never_returns_and_wedges_the_client():
    """The probe finds that stock lmcache's GET of a missing key never returns and wedges the client."""
    fs = probe(resp_factory, 2, client="lmcache", use_mla=False, op_timeout=T,
               checks=("miss-prompt", "round-trip", "usable-after"))
    assert checks_of(fs) == {"miss-prompt", "usable-after"}
    miss = next(f for f in fs if f.check == "miss-prompt")
    hung = {o.op for o in miss.ops if o.outcome == "timeout"}
    assert hung == {"get", "get_async", "get_batch", "get_prefix"}  # every read path of a miss
    wedged = next(f for f in fs if f.check == "usable-after").violating
    assert wedged.op == "put" and wedged.outcome == "timeout"  # even a put, after the misses


def test_probe_stock_native_client_has_the_same_missing_key_hang():
    """The probe finds the same missing-key hang on the native RESP client."""
    fs = probe(native_factory, 2, client="lmcache-native", use_mla=False, op_timeout=T,
               checks=("miss-prompt", "round-trip", "read-paths-agree"))
    # (read-paths-agree fails too when the stock client's sync prefix count loses a completion, a 2-6% race)
    assert "miss-prompt" in checks_of(fs) and checks_of(fs) <= {"miss-prompt", "read-paths-agree"}


def test_probe_stock_mla_collapse_drops_rank_puts_and_splits_paths():
    # per-rank stores: rank 1's put never reaches its server (valkey answers misses promptly)
    """The probe finds that stock lmcache's MLA collapse drops rank puts and splits read paths."""
    no_auth = tuple(c for c in CHECKS if c != "auth-round-trip")  # that one: test above
    fs = probe(valkey_factory, 2, client="lmcache-valkey", use_mla=True, op_timeout=T, checks=no_auth)
    assert {"round-trip", "contains-get", "rank-isolation"} <= checks_of(fs)
    rt = next(f for f in fs if f.check == "round-trip")
    assert rt.violating.rank == 1 and rt.violating.observed is None
    assert not probe(valkey_factory, 2, client="lmcache-valkey", use_mla=False, op_timeout=T,
                     checks=no_auth)
    # one shared store: rank 1's sync reads return rank 0's value, its async reads its own key
    fs = probe(resp_factory, 2, client="lmcache", topology="shared", use_mla=True, op_timeout=T,
               checks=("rank-isolation",))
    iso = fs[0]
    by_op = {o.op: o for o in iso.ops if o.rank == 1 and o.op != "put"}
    rank0_value = next(o.value for o in iso.ops if o.op == "put" and o.rank == 0)
    assert by_op["get"].observed == rank0_value and by_op["get_batch"].observed == [rank0_value]
    assert by_op["get_async"].outcome == "timeout"
    assert all("@2@0@" in k for keys in iso.server_keys.values() for k in keys)


# --------------------------------------------------------------------------- the patched client

@pytest.mark.parametrize("topology,use_mla", [("per-rank", True), ("per-rank", False),
                                              ("shared", True), ("shared", False)])
def test_patched_client_passes_every_check(topology: str, use_mla: bool):
    """lmcache-patched passes every probe check."""
    fs = probe(patched_factory, 2, client="lmcache-patched", topology=topology, use_mla=use_mla,
               op_timeout=T, checks=CHECKS)
    assert fs == [], "\n".join(map(str, fs))


@pytest.mark.parametrize("use_mla", [True, False])
def test_patched_valkey_client_passes_every_check(use_mla: bool):
    """The patched valkey:// client passes every probe check."""
    fs = probe(patched_valkey_factory, 2, client="lmcache-valkey-patched", use_mla=use_mla,
               op_timeout=T, checks=CHECKS)
    assert fs == [], "\n".join(map(str, fs))


# --------------------------------------------------------------------------- the saved counterexamples

from adapters.replay import FINDINGS, replay, trace_of  # noqa: E402
from model.trace import Trace  # noqa: E402

#: The deterministic store-ops findings (`adapters.replay.FINDINGS`); the racy ones are `adapters.racy_findings`.
SAVED = sorted(p for p in (ROOT / "counterexamples").glob("lmcache-*.json") if Trace.load(p).kind == "store-ops")
RACY_SAVED = sorted(p for p in (ROOT / "counterexamples").glob("lmcache-*.json") if Trace.load(p).kind == "concurrent")


def test_every_finding_is_saved_without_drift():
    """Every lmcache finding is saved as a trace equal to what FINDINGS builds."""
    assert {p.stem.removeprefix("lmcache-") for p in SAVED} == set(FINDINGS)
    for p in SAVED:
        t, fresh = Trace.load(p), trace_of(p.stem.removeprefix("lmcache-"))
        assert (t.kind, t.property, t.summary, t.config) == ("store-ops", fresh.property, fresh.summary, fresh.config)
        assert [{k: o[k] for k in ("rank", "op", "key", "value", "wait") if k in o} for o in t.ops] == fresh.ops
        assert t.expect["lmcache-patched"] == "fixed" and t.expect["model"] == "fixed"
        assert t.expect.get(t.client) == "reproduces" and t.verdict["violations"]


def test_every_racy_finding_is_saved_without_drift():
    """Each racy finding is saved with its layout, a measured rate, and lmcache-patched expected fixed."""
    from adapters.racy_findings import RACY_FINDINGS
    assert {p.stem.removeprefix("lmcache-") for p in RACY_SAVED} == set(RACY_FINDINGS)
    for p in RACY_SAVED:
        t = Trace.load(p)
        client, prop, layout, _ = RACY_FINDINGS[p.stem.removeprefix("lmcache-")]
        assert (t.client, t.property, t.ops) == (client, prop, layout.to_ops())
        assert 0 < t.config["rate"]["k"] <= t.config["rate"]["n"]
        assert t.expect[client] == "reproduces" and t.expect["lmcache-patched"] == "fixed"


@pytest.mark.parametrize("path", SAVED, ids=lambda p: p.stem)
def test_counterexample_replays_as_expected(path: Path):
    """Each lmcache finding replays with its recorded outcome on every client."""
    t = Trace.load(path)
    for client in ("lmcache", "lmcache-patched"):
        outcome, why = replay(t, FACTORIES[client])
        assert outcome == t.expect[client], (client, why)
