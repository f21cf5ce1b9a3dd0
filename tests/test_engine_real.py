"""The engine layer on real LMCache 0.5.6 engines on real Valkey: what stock `lmcache` does wrong, that
`lmcache-patched` does not, that every engine-layer demo patch is caught, and that a case leaves nothing behind."""
import contextlib
import multiprocessing
import os
import threading

import pytest

from adapters.catalogue import SERVING_ENGINES
from checking.serving.engine_cases import isolation_cases, recurring
from checking.serving.engine_run import Bounds, run_engine_case
from checking.serving.engine_search import engine_target
from model.engine_case import EngineCase, EnginePrompt, Step
from model.checks import CATALOG
from tests.class_patches import classes_restored

pytestmark = pytest.mark.real
QUICK = Bounds(close=0.3)


def _target(engine, **given):
    """The `EngineTarget` of a named serving engine (`adapters.catalogue.SERVING_ENGINES`)."""
    return engine_target(engine, engines=SERVING_ENGINES, **given)


def _run(engine, case, bounds=QUICK, patches=()):
    return run_engine_case(_target(engine, patches=patches).make, case, bounds=bounds)


def _case(lookup, *steps, n_ranks=1, chunks=3):
    return EngineCase(n_ranks=n_ranks, lookup=lookup, prompts=(EnginePrompt(name="p0", chunks=chunks),),
                      steps=tuple(Step(**s) for s in steps))


STORE, LOOK, RETR, END = ({"kind": "store", "prompt": "p0"}, {"kind": "lookup", "request": "q1", "prompt": "p0"},
                          {"kind": "retrieve", "request": "q1"}, {"kind": "end", "request": "q1"})


def test_stock_async_recurring_prompt_retrieves_freed_memory():
    """Async: retrieve releases the prefetched objects and `lookup_unpin` releases them again; the next lookup of
    the same prompt is handed freed memory. The patched engine loads the stored bytes."""
    stock = _run("lmcache", recurring(1, "async"))
    hit = next(v for v in stock.violations if v.property == "engine-integrity")
    assert hit.detail.get("freed") and "freed" in hit.summary
    assert "engine-integrity" not in _run("lmcache-patched", recurring(1, "async")).violated()


def test_stock_sync_lookup_again_leaks_pins_and_close_never_returns():
    """A second sync lookup of one request id overwrites its pin ledger (one pin per chunk is never released), and
    the stock engine's close never returns; the patched engine does neither."""
    case = _case("sync", STORE, LOOK, LOOK, RETR, END)
    stock = run_engine_case(_target("lmcache").make, case, bounds=Bounds(close=0.5))
    assert set(stock.violated()) == {"pins", "engine-returns"}
    assert any(v.detail.get("call") == "close" for v in stock.violations)
    assert _run("lmcache-patched", case).violations == []


def test_isolation_under_the_engines_key_scheme():
    """Same tokens: another tenant (a request-config tag), an image (LMCache's own mm-hash substitution), another model
    or another deployment of the same model are kept apart or shared correctly; another LoRA adapter is not (vLLM
    passes no adapter, the token database ignores extra keys) -- until the patched integration tags it."""
    cases = dict(isolation_cases(1, "sync"))
    for name in ("isolation-tenant", "isolation-image", "isolation-model", "isolation-deployment"):
        assert "engine-isolation" not in _run("lmcache", cases[name]).violated(), name
    assert "engine-isolation" in _run("lmcache", cases["isolation-adapter"]).violated()
    assert _run("lmcache-patched", cases["isolation-adapter"]).violations == []


def test_patched_retrieves_a_chunk_another_deployment_stored():
    """Regression: the engine path re-classed the connector but kept LMCache's native client, whose GET answers no
    per-key results (fix 10), so every remote read of the patched engine failed: a second deployment of the same model
    found the first one's chunk on the shared Valkey and loaded 0 of it. Stock loads it; so must the patched engine."""
    case = EngineCase(n_ranks=1, lookup="sync", models=("m", "m"),
                      prompts=(EnginePrompt(name="p0", chunks=1),
                               EnginePrompt(name="p1", chunks=1, stem="p0", shared=1, deployment=1)),
                      steps=(Step(kind="store", prompt="p0"), Step(kind="lookup", request="q1", prompt="p1"),
                             Step(kind="retrieve", request="q1")))
    assert "engine-integrity" not in _run("lmcache", case).violated()  # (stock's close does not return: E6)
    assert _run("lmcache-patched", case).violations == []


def test_patched_connector_rejects_a_client_without_per_key_results():
    """The guarded connector's GET refuses a native client that answers no per-key results, rather than reading it
    as all misses (the regression above, made loud): its buffers are freed and the error names the fix."""
    import asyncio

    from adapters.patched_connector import GuardedConnector

    class Buffer:
        byte_array, freed = bytearray(8), 0

        def ref_count_down(self):
            Buffer.freed += 1

    class StockLikeClient:
        async def batch_get(self, keys, bufs):
            return None

    class Connector(GuardedConnector):
        def _allocate(self):
            return Buffer()

    async def read():
        conn = Connector()
        conn.client, conn.loop = StockLikeClient(), asyncio.get_running_loop()
        with pytest.raises(TypeError, match="per-key results"):
            await conn._read([type("Key", (), {"to_string": lambda self: "k"})()])
    asyncio.run(read())
    assert Buffer.freed == 1


def test_patched_connector_reads_a_key_again_when_its_get_failed_and_never_answers_a_miss_for_it():
    """Fix 14: the native GET answers a lost connection with a per-key failure and no error (measured: `(id, True, '',
    [False])` after CLIENT KILL). A present key whose GET failed is read again on a renewed client, not answered as a
    miss; when every attempt fails a single read raises (a batch logs that key and reads it as a miss, keeping its
    other keys); an EXISTS that did not answer raises too (it was a miss)."""
    import asyncio

    from adapters.patched_connector import GuardedConnector

    class Buffer:
        byte_array, freed = bytearray(8), 0

        def ref_count_down(self):
            Buffer.freed += 1

    class Native:
        """A native client whose GETs fail on the first `dead` clients made (their workers lost the connection)."""
        made: list = []
        dead = 1

        def __init__(self, *args):
            self.alive = len(Native.made) >= Native.dead
            Native.made.append(self)

        async def exists(self, key):
            return True

        async def batch_exists(self, keys):
            return [True] * len(keys)

        async def batch_get(self, keys, bufs):
            return [self.alive] * len(keys)

        def close(self):
            pass

    class Connector(GuardedConnector):
        client_class = Native
        host, port, num_threads = "127.0.0.1", 1, 8

        def _allocate(self):
            return Buffer()

    key = type("Key", (), {"to_string": lambda self: "k"})()

    async def read(dead: int) -> tuple:
        Native.made, Native.dead, Buffer.freed = [], dead, 0
        conn = Connector()
        conn.loop = asyncio.get_running_loop()
        conn.client = Native()
        got = []
        for op in (lambda: conn._get(key), lambda: conn._batched_get([key, key])):
            try:
                got.append(await op())
            except ConnectionError as exc:
                got.append(exc)
        return got, len(Native.made)
    (one, batch), made = asyncio.run(read(dead=1))
    assert isinstance(one, Buffer) and made == 2  # renewed once, read on the renewed client
    assert all(isinstance(mo, Buffer) for mo in batch)
    (one, batch), made = asyncio.run(read(dead=99))  # no client reads it: one read is an error, never a miss
    assert isinstance(one, ConnectionError) and "failed twice" in str(one), one
    assert batch == [None, None], batch  # a batch keeps its other keys: a key no GET read is logged and missed
    assert Buffer.freed == 2 + 2 + 2 * 2  # every failed GET's buffer: 2 attempts of `_get`, the batch, 2 of each key

    class Unanswered(Native):
        async def exists(self, key):
            raise RuntimeError("socket recv failed: connection closed")

    async def exists() -> None:
        conn = Connector()
        conn.loop, conn.client_class = asyncio.get_running_loop(), Unanswered
        conn.client = Unanswered()
        with pytest.raises(ConnectionError, match="did not answer"):
            await conn._exists(key)
    asyncio.run(exists())


#: Per demo patch: a case on lmcache-patched (which holds on it unpatched) that shows the demo's property.
DEMO_CASES = {
    "take_max": _case("sync", STORE, {"kind": "evict", "prompt": "p0", "rank": 1, "chunk": 1, "tier": "both"}, LOOK,
                      n_ranks=2),
    "one_chunk_short": _case("sync", STORE, LOOK),
    "memoise_sync_lookup": _case("sync", LOOK, STORE, LOOK, RETR, END),  # (q1 looked up again once p0 is stored)
    "flip_retrieved_byte": _case("sync", STORE, LOOK, RETR),
    "drop_request_tags": dict(isolation_cases(1, "sync"))["isolation-tenant"],
    "drop_lookup_unpin": _case("sync", STORE, LOOK, RETR, END),
    "stuck_close": _case("sync"),
}


@contextlib.contextmanager
def _patched_for_a_while():
    """Undo every LMCache class attribute the demos patch (they patch process-wide, for good)."""
    from lmcache.v1.cache_engine import LMCacheEngine
    from lmcache.v1.lookup_client.lmcache_async_lookup_client import LMCacheAsyncLookupClient, LMCacheAsyncLookupServer
    from lmcache.v1.lookup_client.lmcache_lookup_client import LMCacheLookupClient
    from lmcache.v1.rpc.zmq_transport import ZmqReqRepClientTransport
    from lmcache.v1.token_database import ChunkedTokenDatabase

    from adapters import engine_demos
    try:
        with classes_restored(LMCacheEngine, LMCacheAsyncLookupClient, LMCacheAsyncLookupServer, LMCacheLookupClient,
                              ZmqReqRepClientTransport, ChunkedTokenDatabase):
            yield
    finally:
        engine_demos._DONE.clear()


@pytest.mark.parametrize("demo", sorted(DEMO_CASES))
def test_every_engine_demo_is_caught(demo):
    """Each `--engine-patch` demo of the catalog's engine layer violates its property on lmcache-patched: the first
    violation of its case is the one the catalog names for it."""
    prop = next(p.name for p in CATALOG if p.layer == "engine" and demo in p.demos)
    case = DEMO_CASES[demo]
    bounds = Bounds(close=0.5)
    assert _run("lmcache-patched", case, bounds).violations == [], "the patched engine holds without the demo"
    with _patched_for_a_while():
        out = _run("lmcache-patched", case, bounds, patches=(f"adapters.engine_demos:{demo}",))
    assert out.violations and out.violations[0].property == prop, (demo, out.violated())


def test_every_engine_property_has_a_demo_case():
    assert {d for p in CATALOG if p.layer == "engine" for d in p.demos} == set(DEMO_CASES)


def test_a_case_leaves_nothing_behind():
    """After a case (stock: its close never returns), no LMCache socket file, no server, no loop thread is left, and
    the start method LMCache forces to `spawn` is what it was."""
    from adapters.lmcache_engine.zmq_paths import rpc_dir
    from adapters.valkey_servers import live_pids
    before = multiprocessing.get_start_method(allow_none=True)
    loops = {t for t in threading.enumerate() if t.name == "storage-manager-event-loop"}  # (earlier tests')
    out = run_engine_case(_target("lmcache").make, _case("async", STORE, LOOK, RETR, END), bounds=QUICK)
    assert "engine-returns" in out.violated()  # the close that never returns ...
    assert [f for f in os.listdir(rpc_dir()) if f.startswith("engine_")] == []
    assert live_pids() == []
    assert multiprocessing.get_start_method(allow_none=True) == before
    for t in threading.enumerate():  # ... is unstuck: its loop thread ends
        if t.name == "storage-manager-event-loop" and t not in loops:
            t.join(5.0)
            assert not t.is_alive()


def test_runner_processes_one_process_per_rank():
    """`--runner processes`: every rank in its own OS process (the scheduler here); the stock engine shows the same
    freed memory, the patched one holds, and no rank process is left."""
    import multiprocessing as mp
    stock = run_engine_case(_target("lmcache", runner="processes").make, recurring(2, "async"), bounds=QUICK)
    assert "engine-integrity" in stock.violated()
    patched = run_engine_case(_target("lmcache-patched", runner="processes").make, recurring(2, "async"),
                              bounds=Bounds(close=2.0))
    assert patched.violations == [], patched.violations
    assert [p for p in mp.active_children() if p.name.startswith("shardcheck-rank")] == []
