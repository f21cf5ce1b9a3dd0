"""The mixins of `adapters.patched`'s RESP connector (fixes 2, 4-6, 8-10, 12-14), kept apart from LMCache's classes so
that importing them imports neither torch nor LMCache: `adapters.patched.patched_resp_connector_class` mixes them into
`RESPConnector` and `RESPClient` on first use. Each method says which fix it is (the fixes: `adapters.patched`)."""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from typing import Any, List, Optional

__all__ = ["ResultCheckingClient", "GuardedConnector", "connection_lost"]

_LOG = logging.getLogger(__name__)


def connection_lost(exc: BaseException) -> bool:
    """Whether a native client's failure says its connection is gone ("socket writev failed", "connection closed")."""
    text = str(exc).lower()
    return isinstance(exc, (RuntimeError, OSError)) and ("socket" in text or "connection" in text)


class ResultCheckingClient:
    """Mixed into LMCache's `RESPClient`. Fix 10: `batch_get` hands back the native per-key results (registered as "batch_exists", whose
    completions `_on_ready` delivers with them) instead of dropping them."""

    async def batch_get(self, keys: list, bufs: list) -> list:
        future_id = int(self._client.submit_batch_get(keys, bufs))
        return await self._register_future_async("batch_exists", future_id, (keys, tuple(bufs)))



class GuardedConnector:
    """Mixed into LMCache's `RESPConnector`: reads never issue a GET for a key the server does not hold, whose every native call
    is bounded (a stuck read is asked once more, then raises; a stuck write fails; either renews the client), whose GETs check the
    per-key result, and which renews its native client when the connection is lost."""

    get_timeout: float = 1.0
    _auth: tuple[str, str] = ("", "")
    recycled: int = 0
    #: The last error a renewal met (the server still down, or the native client not built): None while none did.
    renew_error: BaseException | None = None
    _renewed_at: float = float("-inf")

    def adopt(self, get_timeout: float, auth: tuple[str, str], timeout: float = 10.0) -> None:
        """Finish re-classing a stock connector into this one (every deployment that swaps the class calls it): set
        the GET bound and credentials, and replace the stock native client, which drops the per-key results of a GET
        (fix 10), by `client_class`, on the connector's loop (the native client binds to it), bounded by `timeout`."""
        self.get_timeout, self._auth = get_timeout, auth

        async def renew() -> None:
            self._renew_client()
        asyncio.run_coroutine_threadsafe(renew(), self.loop).result(timeout)
        if not isinstance(self.client, self.client_class):
            raise ConnectionError(f"could not replace the native client of {self.host}:{self.port} (fix 10)")

    def _renew_client(self, failed: Any = None, gone: bool = False) -> None:
        """A new native client in place of `failed` (the current one by default): fix 2 (a stuck GET), fix 9 (a stuck
        call), fix 10 (a lost connection: the native workers never reconnect). After a stuck call at most every half
        GET bound; after a connection gone always (fix 13: the client cannot answer again, whenever it was made)."""
        old = self.client
        if failed is not None and failed is not old:
            return  # another caller renewed it already
        now = self.loop.time()
        if now - self._renewed_at < self.get_timeout / 2 and not gone:
            return
        self._renewed_at = now
        try:
            self.client = self.client_class(self.host, self.port, self.num_threads, self.loop, *self._auth)
        except Exception as exc:  # the server is still down: the next failure tries again
            self.renew_error = exc
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
        # fix 12: stock close awaits `AsyncPQExecutor.shutdown`, a sync method that blocks this very event loop
        # waiting for a coroutine scheduled on it (the engine's close never returns): use its async form
        await self.pq_executor.shutdown_async(wait=False)
        self.client.close()

    async def _call(self, make: Any, late: Any = None) -> tuple[str, Any]:
        """`make(client)` on the current native client, bounded by the GET bound: ("ok", its result),
        ("timeout", None) (the client is renewed; `late(task)` runs when the call ends after all) or
        ("gone", the error) (the connection is gone: the client is renewed)."""
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
            if not connection_lost(exc):
                raise
            self._renew_client(client, gone=True)
            return "gone", exc

    async def _again(self, make: Any, late: Any = None) -> tuple[str, Any]:
        """`_call`, and once more on the renewed client when the connection was lost."""
        status, value = await self._call(make, late)
        return await self._call(make, late) if status == "gone" else (status, value)

    @staticmethod
    def _unanswered(what: str, status: str, value: Any) -> OSError:
        """The error of a call that did not answer (fix 14: never read as a miss, which it may not be): a
        `TimeoutError` when its own bound ran out, else a `ConnectionError`."""
        if status == "timeout":
            return TimeoutError(f"{what} did not answer within its bound")
        return ConnectionError(f"{what} did not answer ({status}: {value})")

    async def _exists(self, key: Any) -> bool:
        status, present = await self._again(lambda c: c.exists(key.to_string()))
        if status != "ok":  # fix 9: an error rather than a wait; fix 14: not a miss, which it may not be
            raise self._unanswered(f"EXISTS {key.to_string()}", status, present)
        return bool(present)

    def _allocate(self) -> Any:
        return self.local_cpu_backend.allocate(self.meta_shapes, self.meta_dtypes, self.meta_fmt)

    async def _read(self, keys: List[Any]) -> tuple[bool, List[Optional[Any]]]:
        """GET `keys` into fresh memory objects: (False, []) when the call did not answer; else each key's object,
        or None for a key the native client reports as failed (fix 10: never the buffer it did not fill). Fix 14: a
        key's failure is no miss (a real chunk's nil reply never answers, fix 2): the native GET answers a lost
        connection with a per-key failure and no error, and its worker never reconnects, so the client that answered
        it is renewed and the caller reads the key again."""
        mos = [self._allocate() for _ in keys]
        bufs = [mo.byte_array if isinstance(mo.byte_array, memoryview) else memoryview(mo.byte_array) for mo in mos]
        used: List[Any] = []

        def free(_: Any = None) -> None:
            for mo in mos:
                mo.ref_count_down()

        def batch_get(client: Any) -> Any:
            used.append(client)
            return client.batch_get([k.to_string() for k in keys], bufs)

        status, flags = await self._again(batch_get, late=free)
        if status != "ok":
            if status == "gone":
                free()
            return False, []
        if not isinstance(flags, list):  # a stock client answers None: its buffers may be unfilled (fix 10)
            free()
            raise TypeError(f"{type(self.client).__name__}.batch_get gave no per-key results: call adopt() first")
        out: List[Optional[Any]] = []
        for mo, ok in zip(mos, flags):
            if ok:
                out.append(mo)
            else:
                mo.ref_count_down()
                out.append(None)
        if not all(flags):
            self._renew_client(used[-1], gone=True)  # fix 14
        return True, out

    async def _get(self, key: Any) -> Optional[Any]:
        # fix 6: a GET that stuck (evicted after EXISTS, or slow under load) is asked again on the renewed
        # client after a fresh EXISTS, rather than answered as a miss while the key is present; fix 14: so is a
        # GET that failed (a lost connection), and a key present at both EXISTS but read by neither GET is an error
        for _ in range(2):
            if not await self._exists(key):
                return None
            ok, mos = await self._read([key])
            if ok and mos[0] is not None:
                return mos[0]
        raise ConnectionError(f"GET {key.to_string()} failed twice, the key present at both EXISTS (fix 14)")

    async def _batched_get(self, keys: List[Any]) -> List[Optional[Any]]:
        status, present = await self._again(lambda c: c.batch_exists([k.to_string() for k in keys]))
        if status != "ok":  # fix 14: not a batch of misses
            raise self._unanswered(f"EXISTS of {len(keys)} keys", status, present)
        out: List[Optional[Any]] = [None] * len(keys)
        idx = [i for i, p in enumerate(present) if p]
        if not idx:
            return out
        ok, objs = await self._read([keys[i] for i in idx])
        for i, mo in zip(idx, objs):
            out[i] = mo
        # fix 6: one stuck key no longer turns the whole batch into misses; fix 14: nor one whose GET failed
        retry = [i for i in idx if out[i] is None]
        again = await asyncio.gather(*(self._get(keys[i]) for i in retry), return_exceptions=True)  # at once: bounded
        for i, mo in zip(retry, again):
            if isinstance(mo, BaseException):  # that key only: the batch's other keys stay read (fix 6)
                _LOG.warning("patched connector: %s; read as a miss in a batch of %d", mo, len(keys))
                mo = None
            out[i] = mo
        return out

    async def _put(self, key: Any, memory_obj: Any) -> None:
        # fix 9/10: bounded, once more after a lost connection; a put that did not land raises. The buffer is
        # held until a late native write ends (freed early, another chunk's bytes could be sent under this key)
        buf = memory_obj.byte_array if isinstance(memory_obj.byte_array, memoryview) else \
            memoryview(memory_obj.byte_array)
        used: List[Any] = []

        def set_on(client: Any) -> Any:
            used.append(client)
            return client.set(key.to_string(), buf)

        for _ in range(2):  # fix 13: a SET that stuck on a client whose connection was dropped (it timed out, and the
            # client was renewed) is sent once more on the renewed one; the same bytes under the same key either way
            memory_obj.ref_count_up()
            status, value = await self._again(set_on, late=lambda t: memory_obj.ref_count_down())
            if status != "timeout":
                memory_obj.ref_count_down()
            if status != "timeout" or self.client is used[-1]:
                break
        if status == "timeout":  # its own bound: a timeout (the harness tells a starved machine from a slow client)
            raise TimeoutError(f"put of {key.to_string()} did not land within its bound")
        if status != "ok":
            raise ConnectionError(f"put of {key.to_string()} did not land ({status}: {value})")

    async def _batched_async_contains(self, keys: List[Any]) -> int:
        status, present = await self._again(lambda c: c.batch_exists([k.to_string() for k in keys]))
        if status != "ok":  # fix 14: no count of 0 it does not know
            raise self._unanswered(f"EXISTS of {len(keys)} keys", status, present)
        count = 0
        for p in present:
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
