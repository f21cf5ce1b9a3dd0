"""`--engine vllm --connector mooncake`, the vLLM process's side: vLLM 0.31's `MooncakeStoreConnector` built on CPU,
and what a rank answers the checks (`probe`).

The process runs inside the Mooncake masters' private network namespace (`adapters.vllm_stack.mooncake_stack`
starts it under `nsenter`), so the connector's `MooncakeDistributedStore` reaches its master on 127.0.0.1 and its
transfer-engine listeners (bound on 0.0.0.0 whatever its flags say) never show in the host's namespace. Its glog
lines go to the process's stderr: the child's log, never the user's terminal.

CPU-only stand-in (`install()`, applied when `RecordingConnector` builds the connector, the first moment vLLM's
worker exists): `MooncakeStoreWorker.wait_for_save` (vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/
worker.py:2073-2093) records a `torch.cuda.Event` (:2084) for the sending thread to wait on before it reads the KV
blocks, which raises on a host without CUDA. vLLM-CPU runs the forward synchronously: when `wait_for_save` is called
the step's KV is already in the blocks, so the stand-in hands the same save jobs to the same sending thread with no
event (`current_event = None`, which the sending thread already accepts: worker.py:1010). Nothing else of the
connector is changed; shardcheck's own fault-free runs of the stock connector rest on that one replacement.
"""
from __future__ import annotations

import time
from typing import Any

__all__ = ["connector_class", "install", "probe", "close_lookup_sockets", "stop_lookup_server", "close_lookup_client",
           "TIER", "worker_of"]

#: The tier name the stack's spec carries (`spec["tier"]`).
TIER = "mooncake"
#: Seconds `clear` waits for the sending thread's queued saves before `remove_all`.
_DRAIN_SECONDS = 10.0


def _cpu_wait_for_save(self: Any, metadata: Any) -> None:
    """The CPU stand-in of `MooncakeStoreWorker.wait_for_save` (see the module docstring)."""
    if self._capacity_only or not self.can_put:
        return
    for request in metadata.requests:
        if request.can_save:
            request.current_event = None  # (the forward already ran: nothing to wait for on CPU)
            self.kv_send_thread.add_request(request)


def install() -> None:
    """Put the CPU stand-in in place of `MooncakeStoreWorker.wait_for_save` (idempotent)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.worker import MooncakeStoreWorker

    if getattr(MooncakeStoreWorker.wait_for_save, "_shardcheck_cpu", False):
        return
    _cpu_wait_for_save._shardcheck_cpu = True  # type: ignore[attr-defined]
    MooncakeStoreWorker.wait_for_save = _cpu_wait_for_save  # type: ignore[method-assign]


def connector_class() -> type:
    """vLLM's `MooncakeStoreConnector`, with the CPU stand-in installed."""
    from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.connector import MooncakeStoreConnector

    install()
    return MooncakeStoreConnector


def worker_of(connector: Any) -> Any:
    """The `MooncakeStoreWorker` under a `RecordingConnector` (None on the scheduler side)."""
    return getattr(connector.base, "connector_worker", None)


def _keys(worker: Any, hashes_hex: list[str], n_tokens: int) -> list[str]:
    """The key this rank writes for each full chunk (one vLLM block) of a prompt whose block hashes are `hashes_hex`
    (`MooncakeStoreWorker`'s own token database: `process_tokens`, then its store layout's key of its shard)."""
    from vllm.v1.core.kv_cache_utils import BlockHash

    db = worker.token_dbs[0]
    hashes = [BlockHash(bytes.fromhex(h)) for h in hashes_hex]
    shard = db.store_layout.local_shard_ids[0]
    return [db.store_layout.key_for(shard, block_hash) for _s, _e, block_hash in db.process_tokens(n_tokens, hashes)]


def _exists(store: Any, keys: list[str]) -> list[bool] | None:
    if not keys:
        return []
    try:
        flags = list(store.batch_is_exist(keys))
    except Exception:  # noqa: BLE001 - a master that cannot answer: the holdings are unknown
        return None
    return None if any(f < 0 for f in flags) else [f == 1 for f in flags]


def _queued(worker: Any) -> int:
    thread = getattr(worker, "kv_send_thread", None)
    return int(thread.request_queue.unfinished_tasks) if thread is not None else 0


def probe(connector: Any, what: str, *args: Any) -> Any:
    """One rank's answer (`adapters.vllm_stack.recording_connector.worker_probe`): `rank`; `keys(hashes_hex,
    n_tokens)`; `local(keys)` (no local tier: all False); `remote(keys)` (the master's `batch_is_exist` through this
    rank's own store handle; None when it cannot answer); `evict(key)` (`remove(key, force=True)`); `puts` (save jobs
    queued or running on the sending thread); `clear` (those drained, at most `_DRAIN_SECONDS`, then
    `remove_all(force=True)`); `pins` (none: the connector pins no chunk); `use(name)`; the LMCache questions
    (`facts`, `stats`, `stuck`, `unstick`, `has_engine`) answered empty."""
    worker = worker_of(connector)
    if what == "rank":
        return connector.rank
    if what == "use":
        connector.use(args[0])
        return None
    if what in ("facts", "stats"):
        return {}
    if what in ("stuck", "unstick", "lookups"):  # (no LMCache engine, so no lookup of one, runs here)
        return 0
    if what == "has_engine":
        return False
    if what == "pins":
        return 0, []
    if what == "local":
        return [False] * len(args[0])
    if worker is None or worker.store is None:
        raise RuntimeError("no Mooncake store worker in this process")
    if what == "keys":
        return _keys(worker, list(args[0]), int(args[1]))
    if what == "remote":
        return _exists(worker.store, list(args[0]))
    if what == "evict":
        rc = worker.store.remove(args[0], True)
        return int(rc)
    if what == "puts":
        return _queued(worker)
    if what == "clear":
        deadline = time.monotonic() + _DRAIN_SECONDS
        while _queued(worker) and time.monotonic() < deadline:
            time.sleep(0.01)
        return int(worker.store.remove_all(True))
    raise ValueError(f"unknown probe {what!r}")


def stop_lookup_server(server: Any, timeout: float = 2.0) -> bool:
    """Stop a `LookupKeyServer` and close its socket without racing its thread: a ZMQ socket must not be closed while
    another thread is in its `recv_multipart` (libzmq aborts the process). `running` goes False, a request of an
    unknown type wakes the thread (it answers an error, sees `running` and ends), and once it has ended (at most
    `timeout`) its socket and context are closed. A thread still busy then (a lookup waiting on a paused master) is
    left as it is (a daemon); False."""
    import zmq

    server.running = False
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.REQ)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(f"ipc://{server._ipc_path}")
        sock.send(b"shardcheck-stop")
        if sock.poll(int(timeout * 1000)):
            sock.recv()
        sock.close(linger=0)
    finally:
        ctx.term()
    server.thread.join(timeout)
    if server.thread.is_alive():
        return False
    server.close()
    server.ctx.term()
    return True


def close_lookup_client(client: Any) -> bool:
    """Close a `LookupKeyClient`'s socket and context (`LookupKeyClient.close`), unless a lookup is still in flight on
    its thread (closing under it would abort the process); whether it was closed."""
    if any(not f.done() for f in list(client.futures.values())):
        return False
    client.close()
    client.ctx.term()
    return True


def close_lookup_sockets(connectors: list) -> int:
    """Close the ZMQ sockets of the connector's lookup client (scheduler) and lookup server (worker rank 0)
    (`close_lookup_client`, `stop_lookup_server`; vLLM's own shutdown closes neither); how many were closed."""
    closed = 0
    for connector in connectors:
        base = getattr(connector, "base", None)
        sched = getattr(base, "connector_scheduler", None)
        worker = getattr(base, "connector_worker", None)
        for done in ((lambda: close_lookup_client(sched.client)) if getattr(sched, "client", None) else None,
                     (lambda: stop_lookup_server(worker.lookup_server))
                     if getattr(worker, "lookup_server", None) else None):
            if done is None:
                continue
            try:
                closed += bool(done())
            except Exception:  # noqa: BLE001 - best effort at close
                pass
    return closed
