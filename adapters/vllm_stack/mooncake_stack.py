"""`--engine vllm --connector mooncake`: the real vLLM stack serving through vLLM 0.31's own `MooncakeStoreConnector`
(vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/) over a real Mooncake master and store.

What runs: one `mooncake_master` that shardcheck starts (`adapters.mooncake_servers`: in this process's private network
namespace, on a free 127.0.0.1 port, PDEATHSIG, SIGKILL on every stop path), and the vLLM process
(`adapters.vllm_stack.stack_child`) started INSIDE that namespace (`nsenter --net=...`, which execs it in place: the
same pid, still tied to this process): its connector's `MooncakeDistributedStore` (protocol tcp, metadata
`P2PHANDSHAKE`, embedded mode: vLLM's worker mounts a segment of its own, `segment_mb`) reaches the master on
loopback, and the transfer engine's listeners, bound on 0.0.0.0 whatever its flags say, live in the namespace only.
vLLM reads the store's config from `MOONCAKE_CONFIG_PATH` (a JSON file in a temporary directory of this stack's). The
connector's one CPU-only stand-in (`wait_for_save` without a CUDA event) is `adapters.vllm_stack.mooncake_child`'s.

The stack is vLLM's: the scheduler's lookup (`MooncakeStoreScheduler` -> ZMQ -> `LookupKeyServer` ->
`MooncakeStoreWorker.lookup` -> `batch_is_exist` of every rank namespace's key), asynchronous loads
(`batch_get_into_multi_buffers` on the receiving threads, `load_async` as vLLM defaults it), saves on the sending
thread (`batch_is_exist` then `batch_put_from_multi_buffers` straight from the registered KV blocks), each save job
holding references on its blocks until a step carries its completion back (store/scheduler.py:478-494, :610-633).
Observations: a chunk is one vLLM block (32 tokens: the connector's key unit); a rank's key of a chunk is its
`MooncakeStoreWorker`'s own (`process_tokens`, then its store layout's `key_for`, over vLLM's block hashes of the
prompt and tenant); `holdings` asks the master (`batch_is_exist` through the rank's own store handle; there is no
local tier); `evict` removes a key on the master (`remove(key, force=True)`); faults strike the master's process
(`pause`, `resume`, `kill`, `restart`: empty on its port; every rank shares the one master); `reset` waits for the
save jobs (stepping the idle engine as vLLM's busy loop would), `remove_all(force=True)`.

Members beyond the contract: `lookup_timeout` is the store client's RPC deadline (`MC_RPC_TIMEOUT_MS`, from
`lookup_timeout_ms`): the connector's lookup client itself waits without a bound, so the store's deadline is what
bounds a lookup; `recovery_seconds` (`RECOVERY_SECONDS`), `store_lag` (`STORE_LAG`).

Options: `tp` (1; 2 shares the master between two TP workers), `lookup_timeout_ms` (2000), `segment_mb` (64: the
segment vLLM's worker mounts, and its local buffer), `max_blocks`, `max_model_len`, `start_timeout`, `call_timeout`,
`close_timeout`, `log_level`. LMCache's options (`async_loading`, `urls`, `chunk_size`, `local_cpu_gb`,
`cpu_connector`) are refused.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Sequence

from adapters.mooncake_servers import MasterSet, start_masters, unavailable
from adapters.nemesis import Nemesis
from adapters.vllm_stack.serving_stack import BLOCK_SIZE, _KV_BYTES_PER_TOKEN, _KV_CACHE_BYTES, MOONCAKE, VllmStack
from runtime import reaper

__all__ = ["MooncakeVllmStack", "LOOKUP_TIMEOUT_MS", "RECOVERY_SECONDS", "STORE_LAG"]

LOOKUP_TIMEOUT_MS = 2000
#: Seconds after a fault on the master within which the stack may still recompute what the master holds: a restarted
#: master is empty and the client's heartbeat remounts its segment within a few seconds; a save job caught by the fault
#: holds its blocks until its RPCs give up (measured: see docs/serving-stacks.md, Mooncake).
RECOVERY_SECONDS = 10.0
#: Seconds after a request ended within which its saves may still land (the sending thread's `batch_is_exist`
#: then `batch_put_from_multi_buffers`, after the step that carried them).
STORE_LAG = 1.0
#: Seconds `reset` waits for the store to answer again after a master was restarted.
_REMOUNT_SECONDS = 20.0
_REFUSED = ("async_loading", "urls", "chunk_size", "local_cpu_gb", "cpu_connector")


class MooncakeVllmStack(VllmStack):
    """See the module docstring."""

    recovery_seconds = RECOVERY_SECONDS
    store_lag = STORE_LAG

    def __init__(self, n_ranks: int = 1, *, tp: int | None = None, lookup_timeout_ms: int = LOOKUP_TIMEOUT_MS,
                 segment_mb: int = 64, max_blocks: int | None = None, max_model_len: int | None = None,
                 start_timeout: float | None = None, call_timeout: float = 120.0, close_timeout: float | None = None,
                 log_level: str = "WARNING", **refused: Any) -> None:
        bad = sorted(refused)
        if bad:
            raise ValueError(f"--connector mooncake takes no option {bad[0]!r} (LMCache's: "
                             f"{', '.join(_REFUSED)})" if bad[0] in _REFUSED else
                             f"--connector mooncake takes no option {bad[0]!r}")
        tp = n_ranks if tp is None else int(tp)
        if tp not in (1, 2) or n_ranks != tp:
            raise ValueError(f"the vLLM stack runs tp=1 or tp=2 with one rank per TP worker; got n_ranks={n_ranks}, "
                             f"tp={tp}")
        reason = unavailable()
        if reason:
            raise RuntimeError(f"--connector mooncake cannot run here: {reason}")
        self.n_ranks, self.tp, self.connector = n_ranks, tp, MOONCAKE
        self.chunk_size = BLOCK_SIZE  # (the connector keys every vLLM block)
        self.lookup_timeout = int(lookup_timeout_ms) / 1000.0
        self.chunk_bytes = BLOCK_SIZE * _KV_BYTES_PER_TOKEN // tp
        self.owned = None
        self.held = None
        self.masters: MasterSet | None = None
        self.child = None
        self.last_reset: dict = {}
        self._closed = False
        self._config_dir = reaper.temp_dir("shardcheck-mooncake-conf-")
        try:
            self.masters = start_masters(1)
            self.master = self.masters.masters[0]
            self.held = Nemesis([self.master] * n_ranks)  # (every rank's store is on the one master)
            seg = int(segment_mb) << 20
            config = {"metadata_server": "P2PHANDSHAKE", "master_server_address": self.master.address,
                      "protocol": "tcp", "device_name": "", "mode": "embedded", "global_segment_size": seg,
                      "local_buffer_size": seg}
            config_path = os.path.join(self._config_dir, "mooncake.json")
            with open(config_path, "w") as f:
                json.dump(config, f)
            if max_model_len is None:
                max_model_len = 4096 if not max_blocks else min(4096, (int(max_blocks) - 1) * BLOCK_SIZE)
            spec = {"connector": MOONCAKE, "tier": MOONCAKE, "cpu_connector": False, "tp": tp,
                    "block_size": BLOCK_SIZE, "max_model_len": int(max_model_len), "max_blocks": max_blocks,
                    "kv_cache_bytes": _KV_CACHE_BYTES, "max_num_batched_tokens": 2048,
                    "connector_extra": {"load_async": True, "lookup_rpc_port": 0}}
            env = {"MOONCAKE_CONFIG_PATH": config_path, "MC_RPC_TIMEOUT_MS": str(int(lookup_timeout_ms)),
                   "VLLM_HOST_IP": "127.0.0.1", "VLLM_LOGGING_LEVEL": log_level, "GLOG_minloglevel": "1"}
            self._start_child(spec, env, start_timeout=start_timeout, call_timeout=call_timeout,
                              close_timeout=close_timeout, argv_prefix=self.masters.net.nsenter([]))
        except BaseException:
            self.close()
            raise

    # -- observations ---------------------------------------------------------------------------------------------------
    def holdings(self, rank: int, keys: Sequence[str]) -> tuple[list[bool], list[bool] | None]:
        keys = list(keys)
        local = [False] * len(keys)  # (no local tier: every chunk lives in the store)
        if not keys:
            return local, []
        if not self.reachable(rank):
            return local, None
        remote = self._call("remote", rank, keys)
        return local, None if remote is None else [bool(x) for x in remote]

    def stuck(self) -> int:
        return 0

    # -- faults ------------------------------------------------------------------------------------------------------------
    def evict(self, rank: int, key: str, tier: str) -> None:
        if tier not in ("local", "remote", "both"):
            raise ValueError(f"tier is local, remote or both, got {tier!r}")
        if tier in ("remote", "both") and self.reachable(rank):
            self._call("rank", rank, "evict", key)

    # (`fault`, `reachable` and resuming on close: `VllmStack`'s, held on the master through `held`; a restart comes
    # back empty: a master keeps its metadata in memory only)

    # -- a fresh case, and the end ---------------------------------------------------------------------------------------
    def use_connector(self, name: str) -> None:
        """Serve through `name` from now on, without a restart: `mooncake`, or a `MOD:ATTR` class with
        `around(connector)` (`adapters.vllm_stack.connector_demos`), put around the `MooncakeStoreConnector`
        built."""
        self._call("use_connector", name)
        self.connector = name

    def reset(self) -> None:
        """A fresh case: the master resumed (or started again, and the store answering again within
        `_REMOUNT_SECONDS`), every request gone, the save jobs finished (or their block references dropped, as a
        restart would), the master emptied (`remove_all`), the records forgotten."""
        if self.held is not None:
            self.held.restore_all()
        deadline = time.monotonic() + _REMOUNT_SECONDS
        while self._call("remote", 0, ["shardcheck-probe"]) is None and time.monotonic() < deadline:
            time.sleep(0.2)
        self.last_reset = self._call("reset")

    def _stop_servers(self) -> None:
        if self.masters is not None:
            self.masters.stop()
