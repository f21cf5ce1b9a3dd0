"""One rank of `--engine sglang-hicache`: a fresh Python process (`python -m adapters.sglang_hicache.sgl_rank`, spawned
by `sgl_stack` through `adapters.spawning`: killed with its parent) running SGLang 0.5.23's own HiCache controller.

It builds what SGLang builds for a plain MHA model with `--enable-hierarchical-cache --hicache-storage-backend file`
(`hybrid_pool_assembler._PlainKvStrategy` -> `build_kv_only_stack`), on CPU: an `MHATokenToKVPool`, its
`PagedTokenToKVPoolAllocator`, the host pool group (`build_kv_only_group`: an `MHATokenToKVPoolHost`, pinned memory
off: `sgl_stubs.cpu_host_pools`) and the `HybridCacheController` over the world gloo group, which attaches the storage
backend (`HiCacheFile` in this rank's own directory), creates its two dedicated gloo sync groups and starts its storage
threads. Every `--engine-patch` is applied first, in this process.

The parent is the scheduler: it calls this rank over a `multiprocessing.connection` (`Rank.handle`), one call at a
time, and drives every rank in lockstep, as SGLang's schedulers drive theirs (`UnifiedRadixCache`'s
`drain_storage_control_queues` all-reduces the queue sizes with MIN so every rank drains the same operations): `sizes`
then `drain(n_hit, n_ack, terminate)`. What this rank does with a drained operation is what `UnifiedRadixCache` does:
a hit below the threshold or of a terminated request is revoked, else host pages are allocated
(`allocate_storage_hit`) and the operation goes to the controller's `prefetch_buffer` (the page transfer, then the
ack MIN); acks update the completed tokens, and the last one releases the unused tail of the host pages.

The storage backend's calls pass a gate (`Gate`): `pause` makes them block until `resume` (a storage server that
stopped answering), `kill` makes them fail (and the parent empties the directory), `restart` and `resume` open it.
"""
from __future__ import annotations

import argparse
import datetime
import os
import queue
import sys
import threading
import time
import traceback
from array import array
from typing import Any

#: The storage backend methods that pass the gate.
GATED = ("batch_exists", "batch_exists_v2", "batch_get", "batch_get_v1", "batch_get_v2", "batch_set", "batch_set_v1",
         "batch_set_v2", "get", "set", "exists")


class Gate:
    """The storage's state as the faults set it: `up`, `paused` (calls block until it is not), `down` (calls raise)."""

    def __init__(self) -> None:
        self.state = "up"
        self.cond = threading.Condition()
        self.closing = False
        self.blocked = 0

    def set(self, state: str) -> None:
        with self.cond:
            self.state = state
            self.cond.notify_all()

    def passage(self) -> None:
        with self.cond:
            self.blocked += 1
            try:
                while self.state == "paused" and not self.closing:
                    self.cond.wait(0.5)
            finally:
                self.blocked -= 1
            if self.state == "down":
                raise ConnectionError("the storage is down (killed)")

    def wrap(self, backend: Any) -> None:
        for name in GATED:
            fn = getattr(backend, name, None)
            if fn is None:
                continue

            def gated(*args: Any, _fn: Any = fn, **kwargs: Any) -> Any:
                self.passage()
                return _fn(*args, **kwargs)
            setattr(backend, name, gated)


class Ongoing:
    """A request's prefetch on this rank: its operation, what the scheduler took (`hit`: the agreed hit count once it
    was drained; `completed`: the agreed completed tokens), and whether it ended (`done`) or is still owned by the
    controller's threads (`pending`: until the last ack released its host pages)."""

    def __init__(self, rid: str, op: Any) -> None:
        self.rid, self.op = rid, op
        self.hit: int | None = None
        self.completed = 0
        self.host: Any = None
        self.done = False
        self.pending = True
        self.detached = False
        self.terminated = False


class Rank:
    """This rank's controller and the calls the parent makes (see the module docstring)."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.rank, self.world, self.page = a.rank, a.world, a.page
        self.ongoing: dict[str, Ongoing] = {}
        self.by_op: dict[int, Ongoing] = {}
        self.backups: dict[int, Any] = {}
        self.gate = Gate()

    # -- building ------------------------------------------------------------------------------------------------------
    def build(self) -> dict:
        from adapters.sglang_hicache import sgl_stubs
        sgl_stubs.install()
        import torch
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        from sglang.srt.runtime_context import get_context, get_parallel
        get_context().override_server_args(
            tp_size=self.world, device="cpu", page_size=self.page, hicache_io_backend="direct",
            hicache_mem_layout="page_first", hicache_ratio=2.0, hicache_write_policy="write_through").install()
        get_parallel().override_permanently(tp_rank=self.rank, pp_rank=0, attn_tp_rank=self.rank, attn_cp_rank=0,
                                            attn_dcp_rank=0, dcp_rank=0, attn_dp_rank=0, dp_rank=0)
        from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
        from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle
        from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler as hpa
        from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
        from sglang.srt.mem_cache.radix_cache import RadixKey
        from sglang.srt.mem_cache.utils import get_storage_hash_str
        sgl_stubs.cpu_host_pools()
        from runtime.serving import apply_engine_patches
        apply_engine_patches(self.a.patches)  # (before the controller is built: a patch may change its class)
        self.torch, self.handle_cls, self.radix_key, self.hash_str = torch, CacheRequestHandle, RadixKey, \
            get_storage_hash_str

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{self.a.port}", rank=self.rank,
                                world_size=self.world, timeout=datetime.timedelta(seconds=self.a.setup_timeout))
        # SGLang's `_create_sync_groups` builds its two gloo groups with `new_group(backend="gloo")` and no timeout:
        # torch's default (30 min) applies. Ours, far below, so that a rank stuck in them is found within a bound.
        c10d.default_pg_timeout = datetime.timedelta(seconds=self.a.sync_timeout)
        tokens = self.a.tokens
        self.kv = MHATokenToKVPool(size=tokens, page_size=self.page, dtype=torch.float32, head_num=2, head_dim=8,
                                   layer_num=2, device="cpu", enable_memory_saver=False)
        alloc = PagedTokenToKVPoolAllocator(tokens, self.page, torch.float32, "cpu", self.kv, need_sort=False)
        group = hpa.build_kv_only_group(page_size=self.page, kv_pool=self.kv, full_layer_mapping={0: 0, 1: 1},
                                        use_mla=False)
        extra = {"file_storage_path": self.a.dir}
        cls = getattr(self.a, "controller_cls", None) or HybridCacheController
        self.cc = cls(alloc, group, self.page, dist.group.WORLD, load_cache_event=threading.Event(),
                      write_policy="write_through", io_backend="direct", storage_backend=self.a.backend,
                      prefetch_threshold=self.page, model_name="shardcheck", storage_backend_extra_config=extra)
        self.host = self.cc.storage_host_pool
        self.numel = int(self.host.get_dummy_flat_data_page().numel())
        self.gate.wrap(self.cc.storage_backend)
        return {"controller": f"{type(self.cc).__module__}.{type(self.cc).__qualname__}",
                "backend": type(self.cc.storage_backend).__name__, "numel": self.numel,
                "suffix": self.cc.storage_backend.config_suffix, "host_pages": self.host.size // self.page,
                "sync_groups": [len(self.cc.prefetch_hits_sync_groups),
                                len(self.cc.prefetch_completion_sync_groups)],
                "sync_timeout": self.a.sync_timeout, "pid": os.getpid()}

    # -- what the scheduler computes -----------------------------------------------------------------------------------
    def _key(self, tokens: list[int], tenant: str) -> Any:
        return self.radix_key(array("q", tokens), cache_salt=tenant or None)

    def _hashes(self, tokens: list[int], tenant: str) -> list[str]:
        full = len(tokens) // self.page * self.page
        return list(self.hash_str(self._key(tokens[:full], tenant), None, page_size=self.page)) if full else []

    def keys(self, tokens: list[int], tenant: str) -> list[str]:
        """SGLang's own storage key of every full page of the prompt on this rank (the backend's suffixed key; the
        file backend stores it as `<key>.bin`)."""
        backend = self.cc.storage_backend
        return [backend._get_suffixed_key(h) for h in self._hashes(tokens, tenant)]

    # -- a request's prefetch ------------------------------------------------------------------------------------------
    def begin(self, rid: str, tokens: list[int], tenant: str) -> None:
        """Prefetch the page-aligned prefix of the prompt before its last token (SGLang matches at most
        `input_len - 1` tokens: `Req._compute_max_prefix_len`), as `UnifiedRadixCache.prefetch_from_storage` does."""
        span = (len(tokens) - 1) // self.page * self.page
        handle = self.handle_cls(rid=rid, attempt_id=0)
        if span < self.cc.prefetch_threshold:
            ongoing = Ongoing(rid, None)
            ongoing.done, ongoing.pending, ongoing.hit = True, False, 0
            self.ongoing[rid] = ongoing
            return
        op = self.cc.prefetch(handle, self._key(tokens[:span], tenant))
        ongoing = Ongoing(rid, op)
        self.ongoing[rid] = ongoing
        self.by_op[id(op)] = ongoing

    def sizes(self) -> list[int]:
        self._housekeeping()
        return [self.cc.prefetch_hit_queue.qsize(), self.cc.ack_prefetch_queue.qsize()]

    def drain(self, n_hit: int, n_ack: int, terminate: list[str]) -> dict:
        """Drain `n_hit` agreed hits and `n_ack` acks (the MIN over every rank of their queue sizes), then terminate the
        requests named (the scheduler's `check_prefetch_progress` once their deadline passed, agreed by MAX)."""
        for _ in range(n_hit):
            self._hit(self.cc.prefetch_hit_queue.get(timeout=5.0))
        for _ in range(n_ack):
            self._ack(self.cc.ack_prefetch_queue.get(timeout=5.0))
        for rid in terminate:
            self._terminate(rid)
        self._housekeeping()
        return {rid: {"done": o.done, "hit": o.hit, "completed": o.completed}
                for rid, o in self.ongoing.items()}

    def _hit(self, op: Any) -> None:
        ongoing = self.by_op.get(id(op))
        if ongoing is None or ongoing.detached:
            if ongoing is not None:  # (terminated before its hit: revoked, nothing allocated, nothing left in flight)
                ongoing.pending = False
                self.by_op.pop(id(op), None)
            return
        ongoing.hit = op.storage_hit_count
        if op.is_terminated() or op.storage_hit_count < self.cc.prefetch_threshold:
            ongoing.done, ongoing.pending = True, False  # revoked: no transfer, no acks
            self.by_op.pop(id(op), None)
            return
        host, alloc_len = self.cc.allocate_storage_hit(op, op.storage_hit_count, allow_partial=True,
                                                       min_tokens=self.cc.prefetch_threshold,
                                                       evict_host=lambda n: 0)
        if host is None:
            ongoing.done, ongoing.pending = True, False
            self.by_op.pop(id(op), None)
            return
        op.storage_hit_count = alloc_len
        op.hash_value = op.hash_value[:alloc_len // self.page]
        op.host_indices = host
        ongoing.host = host
        self.cc.prefetch_buffer.put(op)

    def _ack(self, ack: Any) -> None:
        ongoing = self.by_op.get(id(ack.operation))
        if ongoing is None:
            return
        if ack.completed_tokens is not None and not ongoing.detached:
            ongoing.op.completed_tokens = ack.completed_tokens
            ongoing.completed = ack.completed_tokens
        if ack.completed_req:
            ongoing.done = True
            ongoing.pending = False
            self.by_op.pop(id(ack.operation), None)
            op = ongoing.op
            # (the tail past what the scheduler took goes back to the host pool, as `_drain_ack_prefetch` does)
            self.cc.append_host_mem_release(op.host_indices[ongoing.completed:])

    def _terminate(self, rid: str) -> None:
        ongoing = self.ongoing.get(rid)
        if ongoing is None or ongoing.done:
            return
        ongoing.terminated = True
        self.cc.terminate_prefetch(ongoing.op)
        ongoing.done = True
        ongoing.detached = True  # (later acks only release the tail; the scheduler took `completed` tokens now)

    def finish(self, rid: str, tokens: list[int], tenant: str, write: bool, backup_wait: float) -> dict:
        """The request ended: the digest of every page the scheduler took (as this rank's host pool holds it), those
        host pages freed; then, unless `write` is false, every full page of the prompt written back through the
        controller (`write_storage`, as SGLang backs up after prefill: the pages after those loaded), waiting up to
        `backup_wait` for its ack."""
        from adapters.sglang_hicache.sgl_kv import digest, page_kv
        ongoing = self.ongoing.pop(rid, None)
        digests: list[str] = []
        hit = completed = None
        if ongoing is not None:
            hit, completed = ongoing.hit, ongoing.completed
            if ongoing.host is not None and completed:
                for i in range(completed // self.page):
                    data = self.host.get_data_page(int(ongoing.host[i * self.page]), flat=True)
                    digests.append(digest(data.contiguous().view(self.torch.uint8).numpy().tobytes()))
                self.cc.mem_pool_host.free(ongoing.host[:completed])
        backed = None
        if write:
            # (only the pages computed: those loaded from storage are already there, as SGLang's tree marks them
            # backed up and writes through only what prefill computed)
            hashes = self._hashes(tokens, tenant)
            first = (completed or 0) // self.page
            n = (len(hashes) - first) * self.page
            if n > 0:
                idx = self.cc.mem_pool_host.alloc(n)
                if idx is None:
                    raise RuntimeError(f"no host pages free for the write-back of {rid} ({n} tokens)")
                for i in range(first, len(hashes)):
                    flat = self.torch.from_numpy(page_kv(tokens[:(i + 1) * self.page], self.rank, self.numel))
                    self.host.set_from_flat_data_page(int(idx[(i - first) * self.page]), flat)
                op_id = self.cc.write_storage(idx, tokens[first * self.page:len(hashes) * self.page],
                                              hash_value=hashes[first:])
                self.backups[op_id] = idx
                deadline = time.monotonic() + backup_wait
                while op_id in self.backups and time.monotonic() < deadline:
                    self._housekeeping(wait=0.01)
                backed = op_id not in self.backups
        return {"hit": hit, "completed": completed, "digests": digests, "backed": backed}

    def _housekeeping(self, wait: float = 0.0) -> None:
        """What the scheduler drains without agreement: backup acks (their host pages freed) and host pages released."""
        try:
            while True:
                op = self.cc.ack_backup_queue.get(timeout=wait) if wait else self.cc.ack_backup_queue.get_nowait()
                idx = self.backups.pop(op.id, None)
                if idx is not None:
                    self.cc.mem_pool_host.free(idx)
                wait = 0.0
        except queue.Empty:
            pass
        released = []
        try:
            while True:
                released.append(self.cc.host_mem_release_queue.get_nowait())
        except queue.Empty:
            pass
        if released:
            self.cc.mem_pool_host.free(self.torch.cat(released, dim=0))

    # -- observations and faults -----------------------------------------------------------------------------------------
    def leaks(self) -> dict:
        self._housekeeping()
        pending = sorted(rid for rid, o in self.ongoing.items() if not o.done)
        # (an operation still owned by the controller's threads pins only once its hit gave it host pages: one the
        # scheduler terminated before its hit holds nothing, as SGLang revokes it, `revoke_pending_prefetch`)
        in_flight = sorted({o.rid for o in self.by_op.values() if o.pending and o.host is not None})
        return {"pins": len(set(pending) | set(in_flight)), "pinned": sorted(set(pending) | set(in_flight)),
                "free": self.host.available_size() // self.page, "total": self.host.size // self.page,
                "backups": len(self.backups),
                "threads": {t: getattr(self.cc, t).is_alive() for t in
                            ("prefetch_thread", "prefetch_io_aux_thread", "prefetch_sync_thread", "backup_thread")}}

    def fault(self, action: str) -> None:
        self.gate.set({"pause": "paused", "kill": "down"}.get(action, "up"))

    def reset(self) -> dict:
        """A fresh case: forget every request; what is still in flight stays (its acks keep draining)."""
        self._housekeeping()
        self.gate.set("up")
        for rid, o in list(self.ongoing.items()):
            if o.done and o.host is not None and o.completed:
                self.cc.mem_pool_host.free(o.host[:o.completed])
            self.ongoing.pop(rid)
        return self.leaks()

    def close(self) -> None:
        with self.gate.cond:
            self.gate.closing = True
            self.gate.cond.notify_all()
        self.gate.set("up")
        self.cc.storage_stop_event.set()

    def handle(self, name: str, args: list, kwargs: dict) -> Any:
        if name not in ("keys", "begin", "sizes", "drain", "finish", "leaks", "fault", "reset", "close", "ping"):
            raise ValueError(f"no call {name!r}")
        if name == "ping":
            return os.getpid()
        return getattr(self, name)(*args, **kwargs)


def main() -> None:
    ap = argparse.ArgumentParser()
    for name, kind in (("rank", int), ("world", int), ("port", int), ("page", int), ("tokens", int),
                       ("sync_timeout", float), ("setup_timeout", float)):
        ap.add_argument(f"--{name.replace('_', '-')}", type=kind, required=True)
    ap.add_argument("--address", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--backend", default="file")
    ap.add_argument("--patches", default="")
    a = ap.parse_args()
    a.patches = [p for p in a.patches.split(",") if p]
    from multiprocessing.connection import Client
    host, port = a.address.rsplit(":", 1)
    conn = Client((host, int(port)), authkey=bytes.fromhex(os.environ.pop("SHARDCHECK_SGL_AUTHKEY")))
    conn.send(("hello", a.rank))
    rank = Rank(a)
    try:
        info = rank.build()
    except BaseException:  # noqa: BLE001 - reported to the parent, then this process ends
        conn.send(("error", traceback.format_exc()))
        sys.exit(3)
    conn.send(("ready", info))
    while True:
        try:
            rid, name, args, kwargs = conn.recv()
        except (EOFError, OSError):
            os._exit(0)
        try:
            conn.send((rid, "ok", rank.handle(name, args, kwargs)))
        except BaseException as exc:  # noqa: BLE001 - every failure of a call goes back to the parent
            conn.send((rid, "err", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"))
        if name == "close":
            conn.close()
            os._exit(0)


if __name__ == "__main__":
    main()
