"""`--client lmcache-patched`: the `lmcache` client (RemoteBackend over resp://) with shardcheck's
fixes for what the generic store-client properties find in stock lmcache 0.5.6. Every fix is applied from outside
LMCache (a subclass or a config switch); no LMCache code is copied.

1. MLA worker-id collapse (findings `mla-rank-put-dropped`, `mla-sync-async-key-mismatch`):
   with `use_mla` and world size > 1, RemoteBackend's "remote_enable_mla_worker_id_as0" mode
   (on by default for MLA) silently skips every put of a rank != 0 and rewrites that rank's sync
   reads (get, get_batch, contains) to worker 0's key, while the async read path
   (batched_get_non_blocking) keeps the rank's own key. Under context parallelism each rank
   stores different chunks in its own store, so the collapse loses data and makes read paths
   disagree. Fix: LMCache's own switch, `remote_enable_mla_worker_id_as0 = False`.

2. Missing-key GET never returns (findings `missing-get-hangs`, `client-wedged-after-misses`):
   the native RESP client's GET of an absent key into a buffer of 100 bytes or more (every real
   KV chunk) never completes (measured; consistent with reading a fixed-length "$<size>\r\n"
   header that the 5-byte nil reply "$-1\r\n" never fills), so `get`/`get_async`/`get_batch` of a miss
   hang — RemoteBackend gives up only after `blocking_timeout_secs` (10 s) — and every miss
   parks one native worker for good: after `num_workers` misses every later op (even a put) hangs.
   Only the native code can fix the nil-reply handling itself; the mitigation here is a
   `RESPConnector` subclass that (a) asks EXISTS (a command the native client answers correctly)
   before GET and answers a miss at once without issuing the GET, and (b) bounds the remaining
   GET (a key evicted between EXISTS and GET) and, when it is stuck, answers a miss and replaces
   the native client (closing the old one frees its parked worker).

4. A sync prefix count never returns (finding `lost-completion`, found by the concurrent layer): about
   2-6% of `RemoteBackend.batched_contains` calls (the scheduler's sync lookup) never return, even for a
   present key on an idle client. `ConnectorClientBase.batch_exists_sync` (used by
   `RESPConnector.batched_contains`) submits the request to the native client from the caller's thread and
   only then registers its future in `_pending`; the completion is drained on the event loop thread
   (`_on_ready`), which drops a completion whose future is not registered yet (`entry is None: continue`).
   When the native worker answers before the caller registers, the completion is lost and
   `fut.result()` (no timeout) waits forever. The async forms register on the loop thread itself, where no
   drain can run in between, so they never lose it. Fix: the connector's sync `batched_contains` and
   `exists_sync` run the async form on the loop and wait for it, bounded.

5. Fix 2 under overlap (finding `store-error`, found by the concurrent layer in shardcheck's own patch): a
   delete racing a read lands between fix 2's EXISTS and its GET, the GET sticks and fix 2 renews the native
   client, closing the old one at once; a put another caller had in flight on it then raised
   "socket writev failed". Fix: the old client is closed only after 4 x the GET bound.

6. Fix 2 answered a stuck GET as a miss (finding `linearizability`, found by the concurrent layer): a batch
   read with one key evicted between EXISTS and GET answered every key as missing, present ones included
   (`get_batch -> [None, None, None]` while a key was present throughout). Fix: after a stuck GET the keys are
   read again one by one on the renewed client, each after a fresh EXISTS.

7. A put can be dropped while reported done (finding `linearizability`, found by the concurrent layer):
   `RemoteBackend.submit_put_task` returns an already-completed future without writing when a put of the
   same key is still in flight (`exists_in_put_tasks`). When the key is evicted after the first put lands
   (a DEL racing the re-store of a chunk), the second put "completes" and the key stays absent: a read
   after both puts completed misses (`get_prefix -> []`). Fix: a `RemoteBackend` subclass whose
   `submit_put_task` first waits (bounded by half the op timeout) for the in-flight put of that key.

8. A buffer shared by two reads (finding `wrong-caller`, found by the concurrent layer): when fix 2 gave up on
   a stuck GET it cancelled it; the cancelled `RESPConnector._get` dropped its memory object, the allocator
   handed that buffer to another read, and the native worker, still holding the raw pointer, wrote the first
   key's bytes into it later: `get_prefix([k5, k1])` answered a value written for k0 (1 of 210 runs). With the
   GET bound forced to 0.1 ms: 3 of 40 runs cancelled, 0 of 40 shielded. Stock LMCache has the same hazard
   whenever RemoteBackend's own `wait_for(blocking_timeout_secs)` cancels a read. Fix: the stuck GET is
   shielded, not cancelled, and what it read is freed when it ends; a retired client is closed no sooner than
   1 s after it was replaced (closing it fails its pending reads, which then free their buffers).

`patched_valkey_factory` (not a `--client` name; use it as `adapters.patched:patched_valkey_factory`)
is the `lmcache-valkey` client with fix 1, fix 7, fix 11 and fix 3:

3. Valkey connector cannot authenticate (finding `valkey-auth-swapped`): lmcache 0.5.6's
   ValkeyWorkerPool builds `glide_sync.ServerCredentials(username, password)` positionally, but
   glide's signature is `ServerCredentials(password, username)`: with a password configured, the
   client sends the username as the password and never connects. Workaround from the config
   (clearly a workaround, the real fix is keyword arguments in LMCache): pass the password as
   `valkey_username` and the user name ("default") as `valkey_password`, which the swap puts back.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from typing import Any, List, Optional

from adapters.lmcache_stores import (
    DEFAULT_OP_TIMEOUT,
    BackendStore,
    ValkeyBackendStore,
    _make,
)

__all__ = ["patched_factory", "PatchedBackendStore", "patched_resp_connector_class",
           "PATCHED_EXTRA_CONFIG", "patched_valkey_factory", "PatchedValkeyStore",
           "patched_remote_backend_class"]

#: Fix 1: LMCache's switch for the MLA worker-id collapse.
PATCHED_EXTRA_CONFIG = {"remote_enable_mla_worker_id_as0": False}

_connector_class: Any = None


def _connection_lost(exc: BaseException) -> bool:
    """Whether a native client's failure says its connection is gone ("socket writev failed", "connection closed")."""
    text = str(exc).lower()
    return isinstance(exc, (RuntimeError, OSError)) and ("socket" in text or "connection" in text)


def patched_resp_connector_class() -> type:
    """`RESPConnector` with fixes 2, 4-6, 8-10 (built lazily so importing this module does not import torch)."""
    global _connector_class
    if _connector_class is not None:
        return _connector_class
    from lmcache.v1.storage_backend.connector.redis_connector import RESPConnector
    from lmcache.v1.storage_backend.native_clients.resp_client import RESPClient

    class ResultCheckingRESPClient(RESPClient):
        """Fix 10: `batch_get` hands back the native per-key results (registered as "batch_exists", whose
        completions `_on_ready` delivers with them) instead of dropping them."""

        async def batch_get(self, keys: list, bufs: list) -> list:
            future_id = int(self._client.submit_batch_get(keys, bufs))
            return await self._register_future_async("batch_exists", future_id, (keys, tuple(bufs)))

    class ExistsGuardedRESPConnector(RESPConnector):
        """RESPConnector whose reads never issue a GET for a key the server does not hold, whose every native call
        is bounded (a stuck one answers a miss, or fails a write, and renews the client), whose GETs check the
        per-key result, and which renews its native client when the connection is lost."""

        get_timeout: float = 1.0
        _auth: tuple[str, str] = ("", "")
        recycled: int = 0
        _renewed_at: float = float("-inf")

        def _renew_client(self, failed: Any = None) -> None:
            """A new native client in place of `failed` (the current one by default), at most every half GET bound:
            fix 2 (a stuck GET), fix 9 (a stuck call), fix 10 (a lost connection: the native workers never reconnect)."""
            old = self.client
            if failed is not None and failed is not old:
                return  # another caller renewed it already
            now = self.loop.time()
            if now - self._renewed_at < self.get_timeout / 2:
                return
            self._renewed_at = now
            try:
                self.client = ResultCheckingRESPClient(self.host, self.port, self.num_threads, self.loop, *self._auth)
            except Exception:  # the server is still down: the next failure tries again
                return
            self.recycled += 1
            # fix 5: other callers' ops may still be in flight on the old client; closing it at once failed
            # them ("socket writev failed" on a put): close it once they have had time to finish
            self._retired = [*getattr(self, "_retired", []), old]
            self.loop.call_later(max(1.0, 4 * self.get_timeout), self._retire, old)

        def _retire(self, old: Any) -> None:
            retired = getattr(self, "_retired", [])
            if old in retired:
                retired.remove(old)
                try:
                    old.close()  # shuts its sockets: the parked native worker returns
                except Exception:
                    pass

        async def close(self) -> None:
            for old in list(getattr(self, "_retired", [])):
                self._retire(old)
            await super().close()

        async def _call(self, make: Any, late: Any = None) -> tuple[str, Any]:
            """`make(client)` on the current native client, bounded by the GET bound: ("ok", its result),
            ("timeout", None) (the client is renewed; `late(task)` runs when the call ends after all) or
            ("lost", the error) (the connection is gone: the client is renewed)."""
            client = self.client
            # fix 8: a stuck call is shielded, not cancelled: cancelling dropped the memory object of a GET, whose
            # buffer the allocator handed to another read while the native worker still wrote into it
            task = asyncio.ensure_future(make(client))
            try:
                return "ok", await asyncio.wait_for(asyncio.shield(task), self.get_timeout)
            except asyncio.TimeoutError:
                self._renew_client(client)

                def ended(t: Any) -> None:  # (its failure is read, so asyncio does not report it as never retrieved)
                    if not t.cancelled():
                        t.exception()
                    if late is not None:
                        late(t)
                task.add_done_callback(ended)
                return "timeout", None
            except Exception as exc:
                if not _connection_lost(exc):
                    raise
                self._renew_client(client)
                return "lost", exc

        async def _again(self, make: Any, late: Any = None) -> tuple[str, Any]:
            """`_call`, and once more on the renewed client when the connection was lost."""
            status, value = await self._call(make, late)
            return await self._call(make, late) if status == "lost" else (status, value)

        async def _exists(self, key: Any) -> bool:
            status, present = await self._again(lambda c: c.exists(key.to_string()))
            return bool(present) if status == "ok" else False  # fix 9: a miss rather than a wait

        def _allocate(self) -> Any:
            return self.local_cpu_backend.allocate(self.meta_shapes, self.meta_dtypes, self.meta_fmt)

        async def _read(self, keys: List[Any]) -> tuple[bool, List[Optional[Any]]]:
            """GET `keys` into fresh memory objects: (False, []) when the call did not answer; else each key's object,
            or None for a key the native client reports as failed (fix 10: never the buffer it did not fill)."""
            mos = [self._allocate() for _ in keys]
            bufs = [mo.byte_array if isinstance(mo.byte_array, memoryview) else memoryview(mo.byte_array) for mo in mos]

            def free(_: Any = None) -> None:
                for mo in mos:
                    mo.ref_count_down()

            status, flags = await self._again(lambda c: c.batch_get([k.to_string() for k in keys], bufs),
                                              late=free)
            if status != "ok":
                if status == "lost":
                    free()
                return False, []
            out: List[Optional[Any]] = []
            for mo, ok in zip(mos, flags):
                if ok:
                    out.append(mo)
                else:
                    mo.ref_count_down()
                    out.append(None)
            return True, out

        async def _get(self, key: Any) -> Optional[Any]:
            # fix 6: a GET that stuck (evicted after EXISTS, or slow under load) is asked again on the renewed
            # client after a fresh EXISTS, rather than answered as a miss while the key is present
            for _ in range(2):
                if not await self._exists(key):
                    return None
                ok, mos = await self._read([key])
                if ok:
                    return mos[0]
            return None

        async def _batched_get(self, keys: List[Any]) -> List[Optional[Any]]:
            status, present = await self._again(lambda c: c.batch_exists([k.to_string() for k in keys]))
            out: List[Optional[Any]] = [None] * len(keys)
            idx = [i for i, p in enumerate(present or []) if p] if status == "ok" else []
            if idx:
                ok, objs = await self._read([keys[i] for i in idx])
                if ok:
                    for i, mo in zip(idx, objs):
                        out[i] = mo
                else:  # fix 6: one stuck key no longer turns the whole batch into misses
                    again = await asyncio.gather(*(self._get(keys[i]) for i in idx))  # at once: bounded
                    for i, mo in zip(idx, again):
                        out[i] = mo
            return out

        async def _put(self, key: Any, memory_obj: Any) -> None:
            # fix 9/10: bounded, once more after a lost connection; a put that did not land raises. The buffer is
            # held until a late native write ends (freed early, another chunk's bytes could be sent under this key)
            buf = memory_obj.byte_array if isinstance(memory_obj.byte_array, memoryview) else \
                memoryview(memory_obj.byte_array)
            memory_obj.ref_count_up()
            status, value = await self._again(lambda c: c.set(key.to_string(), buf),
                                              late=lambda t: memory_obj.ref_count_down())
            if status != "timeout":
                memory_obj.ref_count_down()
            if status != "ok":
                raise ConnectionError(f"put of {key.to_string()} did not land ({status}: {value})")

        async def _batched_async_contains(self, keys: List[Any]) -> int:
            status, present = await self._again(lambda c: c.batch_exists([k.to_string() for k in keys]))
            count = 0
            for p in (present if status == "ok" else []):
                if not p:
                    break
                count += 1
            return count

        def _on_loop(self, coro: Any) -> Any:
            fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
            try:
                return fut.result(2 * self.get_timeout)
            except concurrent.futures.TimeoutError:
                fut.cancel()
                raise

        def batched_contains(self, keys: List[Any]) -> int:
            # fix 4: the stock sync form registers its future after submitting, racing the loop's drain
            return self._on_loop(self._batched_async_contains(keys))

        def exists_sync(self, key: Any) -> bool:
            # fix 4, for the `use_exists_sync` configuration
            return self._on_loop(self._exists(key))

        async def batched_get_non_blocking(self, lookup_id: str, keys: List[Any]) -> List[Any]:
            # the prefetch path hands back the leading run of hits (RemoteConnector's contract)
            objs = await super().batched_get_non_blocking(lookup_id, keys)
            prefix: List[Any] = []
            for mo in objs:
                if mo is None:
                    break
                prefix.append(mo)
            for mo in objs[len(prefix):]:
                if mo is not None:
                    mo.ref_count_down()
            return prefix

    ExistsGuardedRESPConnector.client_class = ResultCheckingRESPClient
    _connector_class = ExistsGuardedRESPConnector
    return _connector_class


_backend_class: Any = None


def patched_remote_backend_class() -> type:
    """`RemoteBackend` with fix 7 (built lazily, like the connector)."""
    global _backend_class
    if _backend_class is not None:
        return _backend_class
    from lmcache.v1.storage_backend.remote_backend import RemoteBackend

    class NoDroppedPutRemoteBackend(RemoteBackend):
        """RemoteBackend whose put of a key with a put already in flight waits for it, bounded, and then
        writes, instead of returning at once without writing."""

        put_wait: float = 1.0

        def submit_put_task(self, key: Any, memory_obj: Any, on_complete_callback: Any = None) -> Any:
            if getattr(self.loop, "_thread_id", None) != threading.get_ident():  # never block the loop itself
                deadline = time.monotonic() + self.put_wait
                while self.exists_in_put_tasks(key) and time.monotonic() < deadline:
                    time.sleep(0.0005)
            return super().submit_put_task(key, memory_obj, on_complete_callback)

    _backend_class = NoDroppedPutRemoteBackend
    return _backend_class


class PatchedBackendStore(BackendStore):
    """The `lmcache` store with both fixes: RemoteBackend over resp://, MLA collapse off, and
    the exists-guarded, bounded RESP connector in place of the stock one."""

    client_name = "lmcache-patched"

    def __init__(self, rank: int, n_ranks: int, servers: Any, *, use_mla: bool = True,
                 op_timeout: float = DEFAULT_OP_TIMEOUT, num_workers: int = 8,
                 extra_config: dict | None = None) -> None:
        super().__init__(rank, n_ranks, servers, use_mla=use_mla, op_timeout=op_timeout,
                         num_workers=num_workers,
                         extra_config={**PATCHED_EXTRA_CONFIG, **(extra_config or {})})
        cls = patched_resp_connector_class()
        conn = self.backend.connection
        inner = getattr(conn, "_connector", conn)
        # Fix 2: the connector RemoteBackend built is re-classed to the guarded subclass (same
        # object, same native client and executor); only its read methods change.
        inner.__class__ = cls
        # a read may take one stuck GET and two more attempts (fix 6): all of it must fit in op_timeout
        inner.get_timeout = max(0.05, min(1.0, self.op_timeout / 5))
        inner._auth = ("", self.password or "")
        # fix 10: the native client RemoteBackend built drops the per-key results of a GET: replace it (no op is in
        # flight yet) by one that hands them back
        self.bounded.on_loop(lambda: inner._renew_client(), timeout=max(10.0, self.op_timeout))
        # Fix 7: the backend is re-classed the same way (same object); only submit_put_task changes.
        self.backend.__class__ = patched_remote_backend_class()
        self.backend.put_wait = max(0.05, self.op_timeout / 2)


def patched_factory(n_ranks: int, **options: Any) -> list[PatchedBackendStore]:
    """`--client lmcache-patched`: the `lmcache` client with shardcheck's fixes."""
    return _make(PatchedBackendStore, n_ranks, **options)


class PatchedValkeyStore(ValkeyBackendStore):
    """The `lmcache-valkey` store with fix 1 (MLA collapse off), fix 3 (credentials order), fix 7 (no dropped put) and
    fix 11 (a request timeout within the op timeout)."""

    client_name = "lmcache-valkey-patched"

    def __init__(self, rank: int, n_ranks: int, servers: Any, *, use_mla: bool = True,
                 op_timeout: float = DEFAULT_OP_TIMEOUT, num_workers: int = 8,
                 extra_config: dict | None = None) -> None:
        extra = dict(PATCHED_EXTRA_CONFIG)
        # fix 11: glide's request timeout defaults to blocking_timeout_secs (10 s): a call on a paused server waited
        # that long, beyond the caller's bound
        extra["request_timeout"] = max(0.05, op_timeout / 4)
        if servers.password is not None:
            # fix 3: LMCache passes (username, password) where glide expects (password, username)
            extra.update(valkey_username=servers.password, valkey_password="default")
        super().__init__(rank, n_ranks, servers, use_mla=use_mla, op_timeout=op_timeout,
                         num_workers=num_workers, extra_config={**extra, **(extra_config or {})})
        self.backend.__class__ = patched_remote_backend_class()  # fix 7
        self.backend.put_wait = max(0.05, self.op_timeout / 2)


def patched_valkey_factory(n_ranks: int, **options: Any) -> list[PatchedValkeyStore]:
    """The `lmcache-valkey` client with shardcheck's fixes 1, 3 and 7."""
    return _make(PatchedValkeyStore, n_ranks, **options)
