"""`--client mooncake`: the Mooncake store (`mooncake-transfer-engine-non-cuda` 0.3.13.post1) as a `RankStore`.

One `mooncake_master` per rank (as every rank has its own Valkey under `--client lmcache`), started by the factory in
a private network namespace (`adapters.mooncake_servers`), and per rank one `MooncakeDistributedStore` client over
protocol "tcp", metadata `P2PHANDSHAKE`, that mounts its own memory segment (`segment_mb`) into its master: the rank's
values live in that segment, the master holds where they are. The contract's calls map onto the client's own:

- `put(key, value)`: `put` (its return code: 0, or a `MooncakeError`);
- `get(key)`: `get`, whose `b''` is taken as a miss (the client answers `b''` for a missing key, for an empty value and
  for a master it cannot reach alike: `docs/store-clients.md`); `get_batch(keys)`: `get_batch`, the same per key;
- `contains(key)`: `is_exist` (1 present, 0 absent, < 0 an error: raised); `contains_batch(keys)`: `batch_is_exist`,
  the length of the leading run of 1s (as vLLM's `MooncakeStoreWorker.lookup` counts it);
- `delete(key)`: the eviction: `remove(key, force=True)` (a plain `remove` within a read's lease answers -706: the
  master's own eviction does not wait for leases either); -704 (no such key) is fine;
- `get_async(key)`: a `get` on a thread of its own, a `concurrent.futures.Future`.

The client bounds its own calls: its RPC deadline, `MC_RPC_TIMEOUT_MS`, is set to `op_timeout` unless the environment
sets it (`rpc_timeout_ms` overrides). Every call runs on a fresh daemon thread that joined the masters' namespace and
is waited for at most `model.timing.allowance(op_timeout)` (the bound and the harness's grace), then
`model.contract.StoreCallTimeout`: a call the client did not end within its own deadline is a hang.
Options: `op_timeout`, `rpc_timeout_ms`, `segment_mb` (16), `lease_ttl_ms` (the masters' `--default_kv_lease_ttl`;
None: Mooncake's default, 5000).
"""
from __future__ import annotations

import concurrent.futures as cf
import os
import threading
from typing import Any, Callable, Sequence

from adapters.mooncake_servers import MasterSet, MooncakeMaster, MooncakeNet, start_masters, unavailable
from model.calls import DEFAULT_OP_TIMEOUT
from model.contract import StoreCallTimeout
from model.timing import allowance

__all__ = ["MooncakeStore", "MooncakeError", "mooncake_factory", "ERRORS"]

os.environ.setdefault("GLOG_minloglevel", "2")  # the client's glog: errors only (before the module loads)

#: Mooncake's error codes (mooncake-store/include/types.h) that shardcheck meets.
ERRORS = {-200: "SEGMENT_NOT_FOUND", -600: "INVALID_PARAMS", -704: "OBJECT_NOT_FOUND", -706: "OBJECT_HAS_LEASE",
          -900: "RPC_FAIL", -901: "RPC_TIMEOUT"}
_SETUP_TIMEOUT = 20.0


class MooncakeError(RuntimeError):
    """A Mooncake call answered an error code."""

    def __init__(self, op: str, key: str, code: int) -> None:
        super().__init__(f"mooncake {op}({key!r}) answered {code} ({ERRORS.get(code, 'error')})")
        self.op, self.key, self.code = op, key, code


class _Owned:
    """The masters a factory call started, stopped when the last of its stores closes."""

    def __init__(self, masters: MasterSet, users: int) -> None:
        self.masters, self.users = masters, users
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            self.users -= 1
            last = self.users == 0
        if last:
            self.masters.stop()


class MooncakeStore:
    """One rank's Mooncake client (see the module doc)."""

    paths = ("get", "get_async", "get_batch", "contains", "contains_batch")
    thread_safe = True

    def __init__(self, rank: int, n_ranks: int, master: MooncakeMaster, net: MooncakeNet, *,
                 op_timeout: float = DEFAULT_OP_TIMEOUT, segment_mb: int = 16, owned: _Owned | None = None) -> None:
        from mooncake.store import MooncakeDistributedStore

        self.rank, self.n_ranks = rank, n_ranks
        self.server_process, self.net = master, net
        self.host, self.port = "127.0.0.1", int(master.port)  # type: ignore[arg-type]
        self.op_timeout = float(op_timeout)
        self._owned = owned
        self._closed = False
        self.client = MooncakeDistributedStore()
        seg = int(segment_mb) << 20
        rc = self._call("setup", master.address, lambda: self.client.setup(
            "127.0.0.1", "P2PHANDSHAKE", seg, seg, "tcp", "", master.address), timeout=_SETUP_TIMEOUT)
        if rc != 0:
            raise MooncakeError("setup", master.address, rc)

    # -- bounded calls on the namespace's threads ----------------------------------------------------------------------
    def _call(self, op: str, key: str, fn: Callable[[], Any], timeout: float | None = None) -> Any:
        timeout = allowance(self.op_timeout) if timeout is None else timeout
        fut = self._start(fn, op)
        try:
            return fut.result(timeout)
        except cf.TimeoutError:
            if fut.done():
                raise
            raise StoreCallTimeout(op, key, timeout) from None

    def _start(self, fn: Callable[[], Any], op: str) -> cf.Future:
        fut: cf.Future = cf.Future()
        net = self.net

        def run() -> None:
            if not fut.set_running_or_notify_cancel():
                return
            try:
                net.enter()
                fut.set_result(fn())
            except BaseException as exc:  # handed to the caller
                fut.set_exception(exc)

        threading.Thread(target=run, name=f"shardcheck-mooncake-{op}-r{self.rank}", daemon=True).start()
        return fut

    # -- the contract --------------------------------------------------------------------------------------------------
    def put(self, key: str, value: bytes) -> None:
        data = bytes(value)
        rc = self._call("put", key, lambda: self.client.put(key, data))
        if rc != 0:
            raise MooncakeError("put", key, rc)

    def get(self, key: str) -> bytes | None:
        data = self._call("get", key, lambda: self.client.get(key))
        return bytes(data) or None

    def get_batch(self, keys: Sequence[str]) -> list[bytes | None]:
        keys = list(keys)
        got = self._call("get_batch", ",".join(keys), lambda: self.client.get_batch(keys))
        return [bytes(v) or None for v in got]

    def get_async(self, key: str) -> cf.Future:
        inner = self._start(lambda: self.client.get(key), "get_async")
        out: cf.Future = cf.Future()

        def done(f: cf.Future) -> None:
            exc = f.exception()
            if exc is not None:
                out.set_exception(exc)
            else:
                out.set_result(bytes(f.result()) or None)
        inner.add_done_callback(done)
        return out

    def contains(self, key: str) -> bool:
        rc = self._call("contains", key, lambda: self.client.is_exist(key))
        if rc < 0:
            raise MooncakeError("is_exist", key, rc)
        return rc == 1

    def contains_batch(self, keys: Sequence[str]) -> int:
        keys = list(keys)
        flags = self._call("contains_batch", ",".join(keys), lambda: self.client.batch_is_exist(keys))
        bad = [rc for rc in flags if rc < 0]
        if bad:
            raise MooncakeError("batch_is_exist", ",".join(keys), bad[0])
        run = 0
        for rc in flags:
            if rc != 1:
                break
            run += 1
        return run

    def delete(self, key: str) -> None:
        rc = self._call("delete", key, lambda: self.client.remove(key, True))
        if rc not in (0, -704):
            raise MooncakeError("remove", key, rc)

    def close(self) -> None:
        """Bounded: the client's close runs on a daemon thread, waited for at most 2 s; then the masters stop with the
        last store of the factory call that started them."""
        if self._closed:
            return
        self._closed = True
        try:
            self._call("close", "", self.client.close, timeout=2.0)
        except Exception:  # noqa: BLE001 - closing is best effort: the masters stop all the same
            pass
        finally:
            if self._owned is not None:
                self._owned.release()

    def __repr__(self) -> str:
        return f"MooncakeStore(rank={self.rank}/{self.n_ranks}, master {self.host}:{self.port})"


def _rpc_timeout(op_timeout: float, rpc_timeout_ms: int | None) -> None:
    if rpc_timeout_ms is not None:
        os.environ["MC_RPC_TIMEOUT_MS"] = str(int(rpc_timeout_ms))
    elif "MC_RPC_TIMEOUT_MS" not in _USER_ENV:
        os.environ["MC_RPC_TIMEOUT_MS"] = str(max(1, int(op_timeout * 1000)))


#: The Mooncake variables the user set before shardcheck ran (theirs win over shardcheck's defaults).
_USER_ENV = {k for k in os.environ if k.startswith("MC_")}


def mooncake_factory(n_ranks: int, *, op_timeout: float = DEFAULT_OP_TIMEOUT, rpc_timeout_ms: int | None = None,
                     segment_mb: int = 16, lease_ttl_ms: int | None = None) -> list[MooncakeStore]:
    """`--client mooncake`: one master per rank (started here) and one client per rank; closing every store stops
    the masters."""
    reason = unavailable()
    if reason:
        raise RuntimeError(reason)
    _rpc_timeout(op_timeout, rpc_timeout_ms)
    masters = start_masters(n_ranks, lease_ttl_ms=lease_ttl_ms)
    owned = _Owned(masters, n_ranks)
    stores: list[MooncakeStore] = []
    try:
        for rank, master in enumerate(masters.masters):
            stores.append(MooncakeStore(rank, n_ranks, master, masters.net, op_timeout=op_timeout,
                                        segment_mb=segment_mb, owned=owned))
    except BaseException:
        for s in stores:
            s.close()
        masters.stop()
        raise
    return stores


mooncake_factory.options = ("op_timeout", "rpc_timeout_ms", "segment_mb", "lease_ttl_ms")  # type: ignore[attr-defined]
