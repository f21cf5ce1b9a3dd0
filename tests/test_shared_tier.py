"""Several clients of the same servers (`runtime.tier`): in-memory servers for the model, embedded Valkey servers for
a real client, the server's own eviction, and a client that cannot share its servers."""
from __future__ import annotations

import pytest

from adapters.catalogue import CLIENTS
from checking.concurrency import Layout, ServerClients, measure, run_layout
from checking.concurrency_judge import judge
from model.store import MemoryStore, MemoryTier, memory_factory
from runtime.registry import resolve_client
from runtime.tier import NotShared, open_shared


def test_model_clients_of_one_memory_tier_share_its_servers():
    """Two `memory_factory` calls with a tier's urls are two clients of the same servers; the tier evicts by itself."""
    with MemoryTier(2) as tier:
        a, b = memory_factory(2, urls=tier.urls), memory_factory(2, urls=tier.urls)
        a[1].put("k", b"v")
        assert b[1].get("k") == b"v" and b[0].get("k") is None
        tier.evict(1, "k")
        assert a[1].get("k") is None and not b[1].contains("k")
    with pytest.raises(ValueError, match="no in-memory server"):
        memory_factory(1, urls=tier.urls)  # (closed: its servers are gone)


def test_open_shared_gives_clients_of_the_same_servers_or_says_why_not():
    shared = open_shared(resolve_client("model", CLIENTS), 2, clients=3)
    try:
        assert shared.n_clients == 3 and shared.can_evict()
        shared.clients[2][0].put("k", b"v")
        assert shared.clients[0][0].get("k") == b"v"
        shared.evict(0, "k")
        assert shared.clients[1][0].get("k") is None
    finally:
        shared.close()
    with pytest.raises(NotShared, match="takes no `urls`"):
        open_shared(resolve_client("properties.bad_stores:shared_server_factory", CLIENTS), 2)


def test_a_factory_takes_urls_when_it_declares_or_names_them():
    def named(n_ranks, *, urls=None, **options):
        return [MemoryStore() for _ in range(n_ranks)]

    def hidden(n_ranks, **options):
        return [MemoryStore() for _ in range(n_ranks)]
    hidden_declared = lambda n_ranks, **options: [MemoryStore() for _ in range(n_ranks)]  # noqa: E731
    hidden_declared.options = ("urls", "op_timeout")
    assert resolve_client(named, CLIENTS).takes_urls() and resolve_client(hidden_declared, CLIENTS).takes_urls()
    assert not resolve_client(hidden, CLIENTS).takes_urls()
    assert resolve_client("lmcache", CLIENTS).takes_urls() and resolve_client("model", CLIENTS).takes_urls()


def test_a_local_read_cache_is_not_linearizable_across_two_clients():
    """One client of a local read cache is linearizable; reads through a second client of the same server after
    the first deleted a key (or the server evicted it) are not."""
    from properties.bad_stores import local_read_cache_factory
    layout = Layout([[{"path": "put", "keys": ["k"], "pad": 1}, {"path": "get", "keys": ["k"], "client": 1},
                      {"path": "delete", "keys": ["k"]}, {"path": "get", "keys": ["k"], "client": 1}]])
    shared = open_shared(resolve_client(local_read_cache_factory, CLIENTS), 1)
    try:
        violations, _ = judge(run_layout(ServerClients.shared(shared), layout, bound=1.0))
    finally:
        shared.close()
    assert [v.property for v in violations] == ["linearizability"]
    alone = Layout([[{k: v for k, v in op.items() if k != "client"} for op in layout.threads[0]]])
    assert measure(local_read_cache_factory(1)[0], alone, runs=3, bound=1.0).k == 0


@pytest.mark.real
def test_valkey_servers_shared_by_two_clients_and_evicting_by_themselves():
    """Two lmcache-patched clients of the same embedded servers see each other's writes; the server's own eviction
    (DEL of the client's `server_key`) is seen by both; everything stops on close."""
    shared = open_shared(resolve_client("lmcache-patched", CLIENTS), 2, op_timeout=2.0)
    servers = shared.tier.owned
    try:
        assert shared.can_evict(), shared.evict_note
        shared.clients[0][1].put("k", b"value")
        assert shared.clients[1][1].get("k") == b"value"
        shared.evict(1, "k")
        assert shared.clients[0][1].get("k") is None and shared.clients[1][1].get("k") is None
    finally:
        shared.close()
    assert not servers.running()


@pytest.mark.real
def test_the_server_finds_a_clients_keys_by_their_names_or_says_it_cannot():
    """Without `server_key`, the server's eviction finds a client's keys on the server (SCAN MATCH); a client whose
    server keys do not contain its keys gets a note and no server evictions."""
    from adapters.shared_tier import ValkeyTier

    class Prefixed:  # keys stored as "app:<key>" (a tier-side client, only put/delete needed here)
        def __init__(self, tier, hashed=False):
            import valkey
            host, port, _ = tier.endpoints[0]
            self.conn, self.hashed = valkey.Valkey(host=host, port=port, socket_timeout=2), hashed

        def name(self, key):
            import hashlib
            return "app:" + (hashlib.sha1(key.encode()).hexdigest() if self.hashed else key)

        def put(self, key, value):
            self.conn.set(self.name(key), value)

        def delete(self, key):
            self.conn.delete(self.name(key))

    tier = ValkeyTier(1)
    try:
        plain = Prefixed(tier)
        assert tier.check_naming(plain) == ""
        plain.put("a*b[1]", b"x")
        tier.evict(0, "a*b[1]", plain)
        assert plain.conn.get("app:a*b[1]") is None
        for key in ("k\r\nSET k0 x", "x" * 300):  # a CR/LF inside a key, a key of its own 4 KB of SCAN replies
            plain.put(key, b"y")
        for key in ("k\r\nSET k0 x", "x" * 300):
            tier.evict(0, key, plain)
            assert plain.conn.get(plain.name(key)) is None, key
        assert "did not run" in tier.check_naming(Prefixed(tier, hashed=True))
    finally:
        tier.close()
