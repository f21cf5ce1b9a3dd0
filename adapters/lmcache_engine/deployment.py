"""A real LMCache 0.5.6 deployment on CPU: `--engine lmcache` (stock) and `--engine lmcache-patched`.

`LMCacheDeployment(n_ranks, lookup=..., models=...)` builds, per entry of `models` (a deployment: one model, its own
engine id), `n_ranks` real `LMCacheEngine`s (`LMCacheEngineBuilder.get_or_create`) with LocalCPU and a remote
backend (`resp://`) to the rank's own Valkey server (every deployment shares the servers: one tier), each rank's
real lookup server (`LookupClientFactory.create_lookup_server`, then `engine.post_init`), and the scheduler's real
lookup client (`create_lookup_client`, role `scheduler`) on LMCache's real ZMQ transport: sync
(`LMCacheLookupClient`, REQ/ROUTER) or async (`LMCacheAsyncLookupClient`, PUSH/PULL, prefetch on the ranks).
Every rank's KV moves through `CPUConnector` (real bytes). It implements `model.contract.EngineDeployment`: the
calls LMCache offers vLLM (`lookup_cache`, `lookup`, `clear_lookup_status`, `store`, `retrieve`, `lookup_unpin`),
what the checks observe (`chunk_keys`, `holdings`, `pins`, `facts`) and the faults (`evict`, `fault`: held on the
servers it started through `adapters.nemesis.Nemesis.hold`).

The ranks are `adapters.lmcache_engine.rank_side.RankSide`s in this process; `ProcessDeployment`
(`adapters.lmcache_engine.process_deployment`) runs each in an OS process of its own and keeps the rest here.

Requests reach LMCache as vLLM's integration passes them: the tenant as the `lmcache.tag.tenant` request config,
an image through LMCache's own `apply_mm_hashes_to_token_ids` (the placeholder span rewritten from the image's
hash), the LoRA adapter not at all (vLLM's LMCache connector passes none, and LMCache's token database ignores
extra keys) unless `adapter_tag` (the patched integration) passes it as `lmcache.tag.adapter`.

Hygiene: `LMCACHE_TRACK_USAGE=false`; the process's start method is restored after LMCache forces `spawn`; LMCache's
ZMQ socket files go to a private temp dir (`rpc_dir`), the case's files are removed on close; `close()` closes
everything on daemon threads and waits at most `close_timeout`, resuming paused servers and stopping the servers
it started whatever happens. Calls are not bounded here: the caller (`checking.serving.engine_run`) bounds each one.
"""
from __future__ import annotations

import collections
import time
import uuid
from typing import Any, Sequence

from adapters.lmcache_engine.closing import WAKE_ID, close_all, wake
from adapters.lmcache_engine.connector import bytes_per_token
from adapters.lmcache_engine.rank_side import CHUNK_SIZE, RankSide, engine_config, engine_metadata, quiet_lmcache, \
    request_configs_of, tokens_of
from adapters.lmcache_engine.zmq_paths import own_context, remove_case_sockets, use_private_rpc_dir
from adapters.nemesis import Nemesis
from adapters.valkey_servers import ServerSet, resp_command, start_servers
from model.contract import EngineRequest, EngineRetrieve
from model.faults import HeldControl

__all__ = ["LMCacheDeployment", "CHUNK_SIZE", "LOOKUP_TIMEOUT_MS"]

#: The scheduler's lookup timeout (LMCache's `lookup_timeout_ms`; 3000 by default, shorter so faults cost less).
LOOKUP_TIMEOUT_MS = 600
#: Seconds a store waits for its remote writes to land (a paused server: the write lands when it resumes).
STORE_LAND_SECONDS = 1.0
#: Seconds `close` waits for LMCache's own closes before reporting that they did not return.
CLOSE_TIMEOUT = 2.0
#: One round trip: EXISTS of every key (the admin connection reads one reply of at most 4 KB).
_EXISTS_EACH = "local r = {} for i, k in ipairs(KEYS) do r[i] = redis.call('EXISTS', k) end return r"


class LMCacheDeployment:
    """N LMCache ranks per model on one shared tier of Valkey servers (one per rank); see the module docstring."""

    runner = "in-process"

    def __init__(self, n_ranks: int, *, lookup: str = "sync", models: Sequence[str] = ("m",),
                 urls: Sequence[str] | None = None, lookup_timeout_ms: int = LOOKUP_TIMEOUT_MS,
                 adapter_tag: bool = False, name: str = "lmcache", close_timeout: float = CLOSE_TIMEOUT,
                 patches: Sequence[str] = ()) -> None:
        if n_ranks < 1:
            raise ValueError(f"n_ranks must be >= 1, got {n_ranks}")
        if lookup not in ("sync", "async"):
            raise ValueError(f"lookup must be 'sync' or 'async', got {lookup!r}")
        self.name, self.n_ranks, self.lookup_mode = name, n_ranks, lookup
        self.models = tuple(models)
        self.deployments = len(self.models)
        self.chunk_size = CHUNK_SIZE
        self.chunk_bytes = CHUNK_SIZE * bytes_per_token()
        self.lookup_timeout = lookup_timeout_ms / 1000.0
        self.lookup_timeout_ms = lookup_timeout_ms
        self.adapter_tag = adapter_tag
        self.close_timeout = float(close_timeout)
        self.patches = tuple(patches)
        self.close_errors: list[str] = []
        self._closed = False
        self.owned: ServerSet | None = None
        self.faults: HeldControl | None = None  # servers shardcheck did not start are never paused or killed
        self.engine_ids = [f"sc{uuid.uuid4().hex[:10]}" for _ in self.models]
        self.rank_sides: list[Any] = []
        self.clients: list[Any] = []
        if urls is not None:
            self.endpoints = _endpoints(urls, n_ranks)
        try:  # (the servers too: a Ctrl-C just after they started still closes them)
            if urls is None:
                self.owned = start_servers(n_ranks)
                self.endpoints = [("127.0.0.1", p) for p in self.owned.ports]
                self.faults = Nemesis(self.owned.servers)  # (its held form: `fault`, `reachable`)
            use_private_rpc_dir()
            quiet_lmcache()
            self.rank_sides = self._rank_sides()
            for d in range(self.deployments):
                self._build_client(d)
        except BaseException:
            self.close()
            raise

    def _rank_sides(self) -> list[Any]:
        """Every rank's engines, here in this process."""
        sides: list[Any] = []
        for r in range(self.n_ranks):
            sides.append(RankSide(r, self.n_ranks, self.endpoints[r], engine_ids=self.engine_ids, models=self.models,
                                  lookup=self.lookup_mode, lookup_timeout_ms=self.lookup_timeout_ms,
                                  adapter_tag=self.adapter_tag))
        return sides

    def _build_client(self, d: int) -> None:
        from lmcache.v1.lookup_client.factory import LookupClientFactory

        with own_context():  # one scheduler per process in production: one ZMQ context per client here
            self.clients.append(LookupClientFactory.create_lookup_client(
                engine_config(self.endpoints[0], self.lookup_mode, self.lookup_timeout_ms),
                engine_metadata(self.models[d], self.engine_ids[d], self.n_ranks, 0, "scheduler")))

    @property
    def ranks(self) -> list[list[Any]]:
        """`ranks[d][r]`: rank `r`'s objects of deployment `d` (engine, server, connector; in-process only)."""
        return [[side.ranks[d] for side in self.rank_sides] for d in range(self.deployments)]

    def request_configs(self, request: EngineRequest) -> dict | None:
        return request_configs_of(request, self.adapter_tag)

    # -- the scheduler's lookup client ---------------------------------------------------------------------------
    def lookup_cache(self, d: int, request: EngineRequest) -> int | None:
        return self.clients[d].lookup_cache(request.id)

    def lookup(self, d: int, request: EngineRequest) -> int | None:
        return self.clients[d].lookup(tokens_of(request).tolist(), request.id, self.request_configs(request))

    def clear_lookup_status(self, d: int, request: EngineRequest) -> None:
        self.clients[d].clear_lookup_status(request.id)

    # -- the ranks ----------------------------------------------------------------------------------------------
    def store(self, d: int, rank: int, request: EngineRequest, kv: Sequence[bytes]) -> None:
        """Rank `rank` stores the request's KV (every full chunk); returns once its remote writes landed, or after
        `STORE_LAND_SECONDS` (a paused server: they land when it resumes)."""
        keys = self.rank_sides[rank].store(d, request, list(kv))
        if not self.reachable(rank):
            return
        deadline = time.monotonic() + STORE_LAND_SECONDS
        while keys and time.monotonic() < deadline:
            if self._remote_count(rank, keys) == len(keys):
                return
            time.sleep(0.002)

    def retrieve(self, d: int, rank: int, request: EngineRequest, n_tokens: int) -> EngineRetrieve:
        return self.rank_sides[rank].retrieve(d, request, n_tokens)

    def lookup_unpin(self, d: int, rank: int, request: EngineRequest) -> None:
        self.rank_sides[rank].lookup_unpin(d, request)

    # -- what the checks observe ----------------------------------------------------------------------------------
    def chunk_keys(self, d: int, rank: int, request: EngineRequest) -> list[str]:
        return self.rank_sides[rank].chunk_keys(d, request)

    def holdings(self, d: int, rank: int, keys: Sequence[str]) -> tuple[list[bool], list[bool] | None]:
        """Which of `keys` this rank holds: in its LocalCPU, and on its server (None when it cannot be reached)."""
        local = self.rank_sides[rank].local_holdings(d, list(keys))
        if not keys:
            return local, []
        if not self.reachable(rank):
            return local, None
        try:
            reply = self._admin(rank, "EVAL", _EXISTS_EACH, str(len(keys)), *keys)
        except OSError:
            return local, None
        flags = [line == b":1" for line in reply.split(b"\r\n")[1:1 + len(keys)]]
        return local, flags if reply.startswith(b"*") and len(flags) == len(keys) else None

    def pins(self, d: int, rank: int) -> int:
        return self.rank_sides[rank].pins(d)

    def facts(self) -> dict[str, int]:
        """What the engine's own objects counted of what they did, summed over every rank and lookup client (a
        patched engine's fixes count the runs of their own paths: `adapters.engine_patched.E2_DEFERRED`...; a stock
        engine counts nothing)."""
        out: collections.Counter = collections.Counter()
        for side in self.rank_sides:
            out.update(side.facts())
        for client in self.clients:
            out.update(getattr(client, "facts", None) or {})
        return dict(out)

    # -- faults ---------------------------------------------------------------------------------------------------
    def evict(self, d: int, rank: int, request: EngineRequest, chunk: int, tier: str) -> None:
        """Evict one chunk of the request from this rank: its LocalCPU copy (LMCache's own forced remove), its
        remote copy (DEL on the rank's server, as the server's LRU would), or both."""
        key_str = self.chunk_keys(d, rank, request)[chunk]
        if tier in ("local", "both"):
            self.rank_sides[rank].evict_local(d, key_str)
        if tier in ("remote", "both") and self.reachable(rank):
            self._admin(rank, "DEL", key_str)

    def fault(self, rank: int, action: str) -> None:
        if self.faults is None:
            raise ValueError("server faults need servers shardcheck started (no urls option)")
        self.faults.hold(rank, action)

    def reachable(self, rank: int) -> bool:
        return self.faults is None or self.faults.reachable(rank)

    # -- helpers --------------------------------------------------------------------------------------------------
    def _admin(self, rank: int, *args: str) -> bytes:
        host, port = self.endpoints[rank]
        return resp_command(host, port, None, *args, timeout=0.5)

    def _remote_count(self, rank: int, keys: Sequence[str]) -> int:
        try:
            reply = self._admin(rank, "EXISTS", *keys)
        except OSError:
            return -1
        return int(reply[1:].split(b"\r\n")[0]) if reply.startswith(b":") else -1

    # -- closing --------------------------------------------------------------------------------------------------
    def close(self, timeout: float | None = None) -> list[str]:
        """Close the lookup clients and every rank (LMCache's own closes, each on a daemon thread, all at once,
        every parked ZMQ receive woken first: `closing.wake`), waiting at most `timeout`; then remove the case's
        socket files and stop the servers started. Returns (and keeps in `close_errors`) what did not return in
        time or raised."""
        if self._closed:
            return self.close_errors
        self._closed = True
        timeout = self.close_timeout if timeout is None else timeout
        try:
            if self.faults is not None:
                self.faults.resume_all()
            self._wake_clients()
            jobs = [(f"deployment {d}: the lookup client's close", client.close) for d, client in enumerate(self.clients)]
            side_errors: list[list[str]] = [[] for _ in self.rank_sides]
            for r, side in enumerate(self.rank_sides):
                def close_side(r: int = r, side: Any = side) -> None:
                    side_errors[r] = list(side.close(timeout))
                jobs.append((f"rank {r}'s close", close_side))
            errors = close_all(jobs, timeout + 2.0)
            self.close_errors = [e for side in side_errors for e in side] + errors
        finally:
            self._after_close()
            for engine_id in self.engine_ids:
                remove_case_sockets(engine_id)
            if self.owned is not None:
                self.owned.stop()
        return self.close_errors

    def _after_close(self) -> None:
        """What a subclass releases after the closes (the rank processes)."""

    def _wake_clients(self) -> None:
        """Clear `running` on every async lookup client and send its parked receive one harmless message."""
        if self.lookup_mode != "async":
            return
        import msgspec
        import zmq
        from lmcache.v1.lookup_client import factory
        from lmcache.v1.lookup_client.async_lookup_message import LookupResponseMsg

        for d, client in enumerate(self.clients):
            client.running = False
            wake(factory.get_zmq_rpc_path_lmcache(self.engine_ids[d], "lookup_scheduler", 0, 0),
                 [msgspec.msgpack.encode(LookupResponseMsg(lookup_id=WAKE_ID, num_hit_tokens=0))], zmq.PUSH)

    def __enter__(self) -> "LMCacheDeployment":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _endpoints(urls: Sequence[str], n_ranks: int) -> list[tuple[str, int]]:
    from urllib.parse import urlparse

    if isinstance(urls, str):
        urls = [u for u in urls.split(",") if u]
    if len(urls) != n_ranks:
        raise ValueError(f"{n_ranks} ranks need {n_ranks} server urls (one per rank), got {len(urls)}")
    out = []
    for u in urls:
        p = urlparse(u if "://" in u else f"resp://{u}")
        if p.hostname is None or p.port is None:
            raise ValueError(f"url {u!r} has no host:port")
        out.append((p.hostname, p.port))
    return out
