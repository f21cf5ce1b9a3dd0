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
   GET (a key evicted between EXISTS and GET) and, when it is stuck, replaces the native client
   (closing the old one frees its parked worker) and asks once more (fix 6; twice stuck raises, fix 14).

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
   `submit_put_task` first waits (bounded by half the op timeout) for the in-flight put of that key. A store client
   whose put promises the value is stored once it returns (`put_gives_up`) then gives up (`StoreCallTimeout`: the
   put did not happen) when the first put is still in flight, instead of falling through to the stock path that
   drops it (seen once shardcheck stopped cutting such puts short at the bare op timeout: on a loaded machine the
   first put outlived the wait in 1 of 47 runs of the corpus trace); an engine's store after prefill is best effort
   in LMCache (its futures are not awaited), so the engine keeps the stock path there.

8. A buffer shared by two reads (finding `wrong-caller`, found by the concurrent layer): when fix 2 gave up on
   a stuck GET it cancelled it; the cancelled `RESPConnector._get` dropped its memory object, the allocator
   handed that buffer to another read, and the native worker, still holding the raw pointer, wrote the first
   key's bytes into it later: `get_prefix([k5, k1])` answered a value written for k0 (1 of 210 runs). With the
   GET bound forced to 0.1 ms: 3 of 40 runs cancelled, 0 of 40 shielded. Stock LMCache has the same hazard
   whenever RemoteBackend's own `wait_for(blocking_timeout_secs)` cancels a read. Fix: the stuck GET is
   shielded, not cancelled, and what it read is freed when it ends; a retired client is closed no sooner than
   1 s after it was replaced (closing it fails its pending reads, which then free their buffers).

9.-11. The nemesis's fixes (a call on a paused server, a lost connection, glide's request timeout): see
   `adapters.patched_connector` and the README's nemesis findings.

12. The connector's close never returns (finding `engine-returns` of `--engine lmcache`): `RESPConnector.close`
   awaits `AsyncPQExecutor.shutdown`, a synchronous method that schedules `shutdown_async` on the connector's
   event loop and blocks on its result, from a coroutine running on that same loop: the loop thread blocks for
   good, and so does `RemoteBackend.close` (and the engine's close, and an interpreter exit waiting for the
   storage manager's non-daemon loop thread). Fix: the close awaits `shutdown_async(wait=False)` itself.

13. Fix 10 retried on the client that had just lost its connection (finding `store-error`, found by the store
   machine's nemesis in shardcheck's own patch): a renewal was held back for half a GET bound after the last one,
   also after a lost connection, so when the connections were dropped again within 0.2 s of a renewal (or of the
   store's setup) both attempts ran on the dead client: a put raised "did not land (lost: socket recv failed)" and a
   read of a present key answered a miss (19 of 20 rounds of drop, read, drop, put). Fix: a lost connection
   always renews the client (still once per failed client: concurrent callers share one renewal). And a SET sent on
   a connection just dropped may never answer rather than fail (2 of 3 fresh-clone runs of that test: "put, round 0
   raised ... did not land within its bound after 0.636 s; the machine took 0.006 s"): a put that timed out on a
   client since renewed is sent once more on the renewed one (the same bytes under the same key).

14. A failed GET answered a miss (a present key read as missing right after CLIENT KILL, found by
   `test_the_patched_client_writes_and_reads_after_its_connections_are_dropped_twice_in_a_row` under load): the native
   GET answers a lost connection with a per-key failure (`[False]`) and no error, only a line on stderr
   ("[LMCache GET] key ... failed: socket recv failed"); EXISTS and SET fail the call instead. The native workers
   connect on threads of their own after the constructor returns, so a CLIENT KILL right after a renewal leaves a
   client whose late workers live and the others are dead for good: an EXISTS on a live one said present, the GET on
   a dead one "failed", and fix 10 read that as a miss, without renewing the client. Fix: a key whose GET failed is
   no miss: the client that answered it is renewed (as a lost connection) and the key read again after a fresh
   EXISTS (fix 6's second attempt); a key present at both EXISTS and read by neither GET, and an EXISTS that did not
   answer, raise (RemoteBackend, stock, logs that and answers a miss, which the contract allows under a fault); in
   a batch such a key is logged and read as a miss, and the batch's other keys are kept.

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

import threading
import time
from typing import Any

from adapters.lmcache_stores import (
    DEFAULT_OP_TIMEOUT,
    BackendStore,
    ValkeyBackendStore,
    _make,
)
from model.contract import StoreCallTimeout

__all__ = ["patched_factory", "PatchedBackendStore", "patched_resp_connector_class",
           "PATCHED_EXTRA_CONFIG", "patched_valkey_factory", "PatchedValkeyStore",
           "patched_remote_backend_class"]

#: Fix 1: LMCache's switch for the MLA worker-id collapse.
PATCHED_EXTRA_CONFIG = {"remote_enable_mla_worker_id_as0": False}

_connector_class: Any = None


def patched_resp_connector_class() -> type:
    """`RESPConnector` with fixes 2, 4-6, 8-10, 12-14 (`adapters.patched_connector`), built on first use so importing
    this module does not import torch."""
    global _connector_class
    if _connector_class is not None:
        return _connector_class
    from lmcache.v1.storage_backend.connector.redis_connector import RESPConnector
    from lmcache.v1.storage_backend.native_clients.resp_client import RESPClient

    from adapters.patched_connector import GuardedConnector, ResultCheckingClient
    client = type("ResultCheckingRESPClient", (ResultCheckingClient, RESPClient), {"__module__": __name__})
    _connector_class = type("ExistsGuardedRESPConnector", (GuardedConnector, RESPConnector),
                            {"__module__": __name__, "client_class": client})
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
        #: Give up (raise) rather than drop a put whose key is still being put after `put_wait`.
        put_gives_up: bool = False

        def submit_put_task(self, key: Any, memory_obj: Any, on_complete_callback: Any = None) -> Any:
            if getattr(self.loop, "_thread_id", None) != threading.get_ident():  # never block the loop itself
                deadline = time.monotonic() + self.put_wait
                while self.exists_in_put_tasks(key):
                    if time.monotonic() >= deadline:
                        if self.put_gives_up:  # the stock path would drop this put and report it done
                            raise StoreCallTimeout("put", str(key), self.put_wait)
                        break
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
        # a read may take one stuck GET and two more attempts (fix 6): all of it must fit in op_timeout; fix 10: the
        # native client RemoteBackend built (no op is in flight yet) is replaced by one that hands back per-key results
        inner.adopt(max(0.05, min(1.0, self.op_timeout / 5)), ("", self.password or ""),
                    timeout=max(10.0, self.op_timeout))
        # Fix 7: the backend is re-classed the same way (same object); only submit_put_task changes.
        self.backend.__class__ = patched_remote_backend_class()
        self.backend.put_wait = max(0.05, self.op_timeout / 2)
        self.backend.put_gives_up = True


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
        self.backend.put_gives_up = True


def patched_valkey_factory(n_ranks: int, **options: Any) -> list[PatchedValkeyStore]:
    """The `lmcache-valkey` client with shardcheck's fixes 1, 3 and 7."""
    return _make(PatchedValkeyStore, n_ranks, **options)
