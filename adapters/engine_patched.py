"""`--engine lmcache-patched`: the stock LMCache 0.5.6 deployment with shardcheck's fixes to its lookup-and-load path.

Every fix is applied from outside LMCache, to the objects one deployment built (their class is swapped for a
subclass, as `adapters.patched` does for the store client), so a stock deployment in the same process is left alone;
no LMCache code is copied. Each fix is a mixin, and the subclass derives from the class the object was built as,
looked up when the deployment is built (`_derived`): an `--engine-patch` of LMCache's own classes (a method, or a
class a patch put in place of LMCache's, a user's fork) reaches the objects that run, under the fixes. A patch of
the one method a fix replaces without calling it (E5's answer loop, `LMCacheAsyncLookupClient.
process_responses_from_workers`) would not run, and building the deployment says so (`ResolveError`). Each fix
answers a finding of the engine properties (README, "What shardcheck found in LMCache's engine path"):

E1. An async retrieve releases the prefetched memory objects (`retrieve`: unpin and `ref_count_down`), but leaves
    the prefetch's LOADING event in place (`EventManager.get_event_future` does not pop, its docstring says it
    does), so the `lookup_unpin` vLLM calls when the request ends releases them again (`cleanup_memory_objs`): a
    LocalCPU chunk is freed while still cached, the next store reuses its address, and a later lookup of the first
    prompt retrieves freed memory (`engine-integrity`). Its unused prefetched objects lose their reference but keep
    their pin. Fix: the engine's `_async_process_tokens_internal` also unpins what it does not use and pops the
    event it consumed, so every prefetched object is released exactly once.
E2. A prefetch still running when its request ends (a slow rank, a lookup the scheduler timed out) is never
    released: `lookup_unpin` and `cleanup_memory_objs` skip an event that is not DONE yet (`pins`). Fix: they
    release it when its prefetch completes.
E3. A second lookup of one request id (a request looked up again, e.g. after a preemption) loses the first one's
    pins: sync, it replaces `lookup_pins[id]` while the pins add up, so `lookup_unpin` releases one of two; async,
    its prefetch replaces the first one's LOADING event, whose pinned objects nobody releases (`pins`). Fix: the
    engine's `lookup` merges the new pins into the request's ledger; a new prefetch first releases the one it
    supersedes.
E4. A rank that answers a sync lookup after the scheduler gave up (its server waited on a paused Valkey) keeps the
    pins it took: nobody unpins them before the pin monitor's 300 s (`pins`). A scheduler timeout shorter than a
    rank's store bound adds two ways: the request ends while its lookup runs (LocalCPU pinned its hits at once, but
    the lookup records them in `lookup_pins` only when the server's tier answered, after the end found nothing),
    or before the rank even serves it (it waited in the server's queue behind another). Fix: a lookup that takes
    longer than the scheduler's timeout releases its pins at once, so does one whose request ended while it ran,
    and one whose answer cannot be delivered (`ROUTER_MANDATORY`: the scheduler's socket is gone); only that
    lookup's own pins go. Left open: an answer to a queued request sent in the instant between the scheduler's
    timeout and its socket's close reaching the server.
E5. The async client takes the minimum over whatever answers arrive for a lookup id, with no rank identity: two
    lookups of one id in flight, or the late answers of a timed-out lookup, resolve to another minimum than every
    rank's (`engine-soundness`, `engine-completeness`); and `lookup_cache` raises `KeyError` for an id whose
    lookup timed out and is asked again (`engine-returns`). Fix: each rank's server tags its answer with its rank;
    the client counts one answer per rank, keeps one lookup per id in flight, drops the late answers of a lookup
    it gave up (answering 0, recompute, until they are in) and caches the 0 it answered on a timeout.
E6. The remote connector: `adapters.patched`'s fixes 2, 4-6, 8-10, 13 and 14 (a sync prefix count that loses its completion and
    wedges the lookup server thread, misses that hang, ...), and fix 12: `RESPConnector.close` no longer blocks its
    own event loop, so the engine's close returns (`engine-returns`).
E8. A lookup server's close (sync and async) closes the ZMQ socket its own thread is blocked receiving on; a ZMQ
    assertion (`signaler.cpp`) then aborts the rank's process in some closes (`engine-returns`, `--runner processes`),
    and the sync server never terminates its transport's context. Fix: the close stops the receiving thread first
    (wakes it with one harmless message, joins it), then closes; the sync one terminates its context.
E7. Isolation: vLLM's LMCache integration passes no LoRA adapter and LMCache's token database ignores extra keys,
    so requests that differ only by adapter share chunk keys and load each other's KV (`engine-isolation`). Fix
    (the integration's side): the adapter is passed as the `lmcache.tag.adapter` request config.
"""
from __future__ import annotations

import threading
import time
from typing import Any

from adapters.lmcache_engine.deployment import LMCacheDeployment
from adapters.lmcache_engine.factory import stock_factory
from adapters.mixins import mixed_over
from adapters.patched import patched_remote_backend_class, patched_resp_connector_class

__all__ = ["patched_factory", "apply_fixes", "apply_rank_fixes", "RANK_SEP", "E2_DEFERRED", "E4_ENDED",
           "E4_UNDELIVERED", "E5_DROPPED", "E5_OWED", "E5_GAVE_UP"]

#: Separates the lookup id from the answering rank in a patched async server's answer (E5).
RANK_SEP = "\x1f"
#: The facts (`facts()` of the engine and of the async client: how often a fix's own path ran) a regression test of
#: E2 and E5 asserts on: releases deferred until a prefetch completed (E2), late answers of an abandoned lookup
#: dropped (E5), lookups answered 0 because an abandoned one of the same id still owed answers (E5), lookups the
#: client gave up on at its timeout, keeping the 0 it answered (E5).
E2_DEFERRED, E5_DROPPED, E5_OWED, E5_GAVE_UP = ("E2 releases deferred", "E5 late answers dropped", "E5 lookups owed",
                                                "E5 lookups given up")
#: Sync lookups whose request ended while they ran, and answers a rank could not deliver (the scheduler had given up
#: on them): their pins released (E4).
E4_ENDED, E4_UNDELIVERED = "E4 lookups outlived their request", "E4 undelivered answers released"


class _LookupPins:
    """E3's and E4's ledger of a sync lookup's pins, part of `_EngineFixes` (`super()` here is the class the engine was
    built as: LMCacheEngine, or what a patch put in its place; `_derived`). It uses the engine's `facts`,
    `_pins_lock`, `_answer_pins`, `_looking_up`, `_ended_while_looking`, `lookup_pins`, `transport`,
    `lookup_timeout`, `async_loading`, `storage_manager` and `_release_when_done` (E2)."""

    def lookup_unpin(self, lookup_id: str) -> None:
        if lookup_id not in self.lookup_pins and self.async_loading and self._release_when_done(lookup_id):
            return
        with self._pins_lock:
            if lookup_id == self._looking_up:
                self._ended_while_looking = True  # E4: the pins this lookup is taking are nobody's
            super().lookup_unpin(lookup_id)

    def lookup(self, *args: Any, **kwargs: Any) -> int:
        lookup_id = kwargs.get("lookup_id")
        pinning = bool(kwargs.get("pin") and lookup_id)
        started = time.monotonic()
        with self._pins_lock:
            before = self.lookup_pins.get(lookup_id) if pinning else None
            earlier = {loc: list(keys) for loc, keys in (before or {}).items()}
            if pinning:
                self._looking_up, self._ended_while_looking = lookup_id, False
        try:
            result = super().lookup(*args, **kwargs)  # (stock records its pins only once every tier answered)
        finally:
            with self._pins_lock:
                ended = pinning and self._ended_while_looking
                self._looking_up = None
                now = self.lookup_pins.get(lookup_id) if pinning else None
                wrote = now is not None and now is not before
                taken = {loc: list(keys) for loc, keys in now.items()} if wrote else {}  # this lookup's own
                if ended:  # E4: its request ended while it ran (the end released the earlier pins)
                    self._outlived(lookup_id)
                elif wrote and earlier:  # E3: merge, so that one lookup_unpin releases every pin this id took
                    self.lookup_pins[lookup_id] = {loc: earlier.get(loc, []) + taken.get(loc, [])
                                                   for loc in {*earlier, *taken}}
                self._answer_pins = (lookup_id, {} if ended else taken)
        if pinning and self.transport is not None and time.monotonic() - started > self.lookup_timeout:
            self.release_answer(lookup_id)  # E4: the scheduler gave up on this answer: keep no pins for it
        return result

    def _outlived(self, lookup_id: str) -> None:
        """E4: the lookup of `lookup_id` outlived its request: release the pins it recorded."""
        self.facts[E4_ENDED] += 1
        super().lookup_unpin(lookup_id)  # type: ignore[misc]  (LMCacheEngine's, past PatchedEngine's own)

    def answer_undelivered(self) -> None:
        """E4: the latest sync answer could not be sent (the scheduler's socket is gone): release its pins."""
        last, _ = self._answer_pins
        if last is not None:
            self.release_answer(last, undelivered=True)

    def release_answer(self, lookup_id: str, *, undelivered: bool = False) -> None:
        """E4: release the pins the latest lookup of `lookup_id` took (an answer the scheduler gave up on, or one
        `undelivered`: its socket is gone), only those still in the request's ledger (its end may have released
        them already, and an earlier lookup's stay)."""
        with self._pins_lock:
            last, taken = self._answer_pins
            if last != lookup_id:
                return
            self._answer_pins = (None, {})
            if undelivered:
                self.facts[E4_UNDELIVERED] += 1
            ledger = self.lookup_pins.get(lookup_id)
            if not ledger:
                return
            for loc, keys in taken.items():
                held = ledger.get(loc, [])
                mine = []
                for key in keys:
                    if key in held:
                        held.remove(key)
                        mine.append(key)
                self.storage_manager.batched_unpin(mine, [loc])
                if not held:
                    ledger.pop(loc, None)
            if not ledger:
                self.lookup_pins.pop(lookup_id, None)


class _EngineFixes(_LookupPins):
    """E1-E4 on one engine (see the module docstring), over the class the engine was built as (`_derived`)."""

    transport: Any = None  # the rank's sync lookup server transport (E4), set by apply_rank_fixes
    lookup_timeout: float = 3.0

    def _setup(self) -> None:
        self.facts: dict[str, int] = {E2_DEFERRED: 0, E4_ENDED: 0, E4_UNDELIVERED: 0}  # how often a fix's path ran
        self._pins_lock = threading.RLock()  # the ledger `lookup_pins`: the server thread's lookups, vLLM's unpins
        self._answer_pins: tuple[str | None, dict] = (None, {})  # E4: the latest lookup's own pins
        self._looking_up: str | None = None  # E4: the id of the lookup running on the server thread
        self._ended_while_looking = False
        self._pending: dict[str, int] = {}  # E2: prefetches scheduled and not yet registered, per lookup id
        self._released_early: set[str] = set()
        sm, engine = self.storage_manager, self
        original = sm.async_lookup_and_prefetch

        async def tracked(lookup_id: str, *args: Any, **kwargs: Any) -> None:
            try:
                return await original(lookup_id, *args, **kwargs)
            finally:
                engine._prefetched(lookup_id)

        sm.async_lookup_and_prefetch = tracked

    def _stock_cleanup(self, lookup_id: str) -> None:
        """The engine's own `cleanup_memory_objs` (LMCache's, or a patched one), past this fix's."""
        super().cleanup_memory_objs(lookup_id)  # type: ignore[misc]

    def _async_process_tokens_internal(self, tokens: Any, mask: Any, ret_mask: Any, **kwargs: Any) -> Any:
        from lmcache.v1.event_manager import EventStatus, EventType
        req_id = kwargs.get("req_id")
        prefetched: list = []
        if self.event_manager.get_event_status(EventType.LOADING, req_id) == EventStatus.DONE:
            future = self.event_manager.get_event_future(EventType.LOADING, req_id)
            try:
                prefetched = [mo for tier in future.result() for _, mo in tier]
            except Exception:  # noqa: BLE001 - stock handles a failed prefetch itself
                prefetched = []
        chunks, size = super()._async_process_tokens_internal(tokens, mask, ret_mask, **kwargs)  # type: ignore[misc]
        used = {id(mo) for _, mo, _, _ in chunks}
        for mo in prefetched:  # E1: stock dropped the reference of the unused ones but kept their pins
            if id(mo) not in used and mo.is_pinned:
                mo.unpin()
        if prefetched:
            self.event_manager.pop_event(EventType.LOADING, req_id)  # E1: consumed, never released again
        return chunks, size

    def _release_when_done(self, lookup_id: str) -> bool:
        """E2: a prefetch not yet started or still running is released when it completes; True when deferred."""
        from lmcache.v1.event_manager import EventStatus, EventType
        if self._pending.get(lookup_id):
            self._released_early.add(lookup_id)
        with self.event_manager.lock:
            future = self.event_manager.events[EventType.LOADING][EventStatus.ONGOING].get(lookup_id)
        if future is None:
            deferred = lookup_id in self._released_early
        else:
            loop = self.storage_manager.loop
            future.add_done_callback(lambda _f: loop.call_soon(self._stock_cleanup, lookup_id))
            deferred = True
        if deferred:
            self.facts[E2_DEFERRED] += 1
        return deferred

    def async_lookup_and_prefetch(self, lookup_id: str, *args: Any, **kwargs: Any) -> None:
        from lmcache.v1.event_manager import EventStatus, EventType
        if self.event_manager.get_event_status(EventType.LOADING, lookup_id) == EventStatus.DONE:
            self._stock_cleanup(lookup_id)  # E3: the new lookup supersedes its prefetch
        self._pending[lookup_id] = self._pending.get(lookup_id, 0) + 1  # E2: from the moment it is scheduled
        super().async_lookup_and_prefetch(lookup_id, *args, **kwargs)  # type: ignore[misc]

    def _prefetched(self, lookup_id: str) -> None:
        """E2: the storage manager's prefetch of `lookup_id` has registered its event (or found nothing)."""
        self._pending[lookup_id] = self._pending.get(lookup_id, 1) - 1
        if not self._pending[lookup_id]:
            del self._pending[lookup_id]
        if lookup_id in self._released_early and not self._pending.get(lookup_id):
            self._released_early.discard(lookup_id)
            self.cleanup_memory_objs(lookup_id)

    def cleanup_memory_objs(self, lookup_id: str) -> None:
        if not self._release_when_done(lookup_id):
            self._stock_cleanup(lookup_id)


class _ReportingRouter:
    """E4: an answer the rank's sync server transport cannot deliver (the scheduler's socket is gone: it gave up, and
    the request may have waited in the queue behind another) is reported to the rank's engine, which releases that
    lookup's pins."""

    engine: Any = None  # the rank's engine, set by apply_rank_fixes
    _mandatory = False

    def send_response(self, identity: bytes, response: bytes) -> None:
        import zmq
        if not self._mandatory:  # (on the server's own thread, as every use of the socket)
            self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # type: ignore[attr-defined]
            self._mandatory = True
        try:
            super().send_response(identity, response)  # type: ignore[misc]
        except zmq.ZMQError:  # no such peer (EHOSTUNREACH) or no room: nobody reads this answer
            if self.engine is not None:
                self.engine.answer_undelivered()


def _stop_receiver(server: Any, path: str, mode: str) -> None:
    """E8: a lookup server's close closes the socket its own thread is blocked receiving on (a ZMQ assertion can
    abort the process): stop that thread first (clear `running`, wake its receive, join it)."""
    import msgspec
    import zmq
    from lmcache.v1.lookup_client.async_lookup_message import LookupCleanupMsg

    from adapters.lmcache_engine.closing import WAKE_ID, wake

    server.running = False
    if path:
        frames = [msgspec.msgpack.encode(LookupCleanupMsg(lookup_id=WAKE_ID))] if mode == "async" else [b"", b"wake"]
        wake(path, frames, zmq.PUSH if mode == "async" else zmq.DEALER)
    server.thread.join(2.0)


class _SafeCloseSyncServer:
    """E8: the sync lookup server's close stops its receiving thread first, and terminates its transport's ZMQ
    context (stock leaves the context and its I/O thread behind)."""

    wake_path: str = ""

    def close(self) -> None:
        _stop_receiver(self, self.wake_path, "sync")
        super().close()  # type: ignore[misc]
        if not self.transport.ctx.closed:  # type: ignore[attr-defined]
            self.transport.ctx.term()  # type: ignore[attr-defined]


class _RankTaggedAsyncServer:
    """E5: every answer of the async lookup server names the rank that gives it. E8: its close stops its receiving
    thread first."""

    rank: int = 0
    wake_path: str = ""

    def send_response_to_scheduler(self, lookup_id: str, num_hit_tokens: int) -> None:
        super().send_response_to_scheduler(f"{lookup_id}{RANK_SEP}{self.rank}", num_hit_tokens)  # type: ignore[misc]

    def close(self) -> None:
        _stop_receiver(self, self.wake_path, "async")
        super().close()  # type: ignore[misc]


class _RankCountingClient:
    """E5 on the scheduler's async lookup client: one answer per rank, one lookup per id in flight, late answers of
    an abandoned lookup dropped. `lookup` goes on to the client's own (LMCache's, or a patched one), and so does
    `lookup_cache` for every answer (E5 answers itself only the 0 of a lookup it gives up on, and `None` while one
    is in flight); the answer loop is E5's own (`REPLACES`): it reads the ranks' tags."""

    #: The methods this fix replaces without calling the client's own: a patch of one of them would not run here.
    REPLACES = ("process_responses_from_workers",)

    def _setup(self) -> None:
        self._answers: dict[str, dict[int, int]] = {}
        self._owed: dict[str, set[int]] = {}
        self.facts: dict[str, int] = {E5_DROPPED: 0, E5_OWED: 0, E5_GAVE_UP: 0}  # how often E5's own paths ran

    def lookup(self, token_ids: Any, lookup_id: str, request_configs: Any = None) -> Any:
        with self.lock:
            if self._owed.get(lookup_id):  # an abandoned lookup of this id still owes answers: recompute
                self.facts[E5_OWED] += 1
                self.reqs_status[lookup_id] = 0
                return 0
            self._answers[lookup_id] = {}
        return super().lookup(token_ids, lookup_id, request_configs)  # type: ignore[misc]

    def lookup_cache(self, lookup_id: str) -> Any:
        with self.lock:
            status = self.reqs_status.get(lookup_id, -1)
            started = self.first_lookup_time.get(lookup_id)
        if status is not None or started is None:
            return super().lookup_cache(lookup_id)  # type: ignore[misc]  (an answer, or no lookup yet: it starts one)
        self._cleanup_finished_aborted_lookups()
        time.sleep(self.lookup_backoff_time)
        with self.lock:
            now = self.reqs_status.get(lookup_id, -1)
            if now is None:
                if (time.time() - started) * 1000 <= self.config.lookup_timeout_ms:
                    return None
                # give up on it: its missing answers are owed (dropped when they come), the 0 answered is kept,
                # and the workers are told to release its prefetch once it is done (stock's cleanup message)
                got = self._answers.pop(lookup_id, {})
                self._owed[lookup_id] = {r for r in range(self.world_size) if r not in got}
                self.facts[E5_GAVE_UP] += 1
                self.reqs_status[lookup_id] = 0
                self.first_lookup_time.pop(lookup_id, None)
                self.cancel_lookup(lookup_id)
                return 0
        if now == -1:
            return -1  # (its status was cleared meanwhile)
        return super().lookup_cache(lookup_id)  # type: ignore[misc]  (answered meanwhile: the client's own answers)

    def process_responses_from_workers(self) -> None:
        import msgspec
        from lmcache.v1.lookup_client.async_lookup_message import LookupResponseMsg
        while self.running:
            try:
                msg = msgspec.msgpack.decode(self.pull_socket.recv(copy=False), type=LookupResponseMsg)
                lookup_id, sep, rank_text = msg.lookup_id.rpartition(RANK_SEP)
                if not sep:
                    continue  # not a rank-tagged answer (the harness's wake-up)
                rank = int(rank_text)
                with self.lock:
                    owed = self._owed.get(lookup_id)
                    if owed and rank in owed:
                        self.facts[E5_DROPPED] += 1
                        owed.discard(rank)
                        if not owed:
                            del self._owed[lookup_id]
                        continue
                    answers = self._answers.get(lookup_id)
                    if answers is None:
                        continue
                    answers[rank] = msg.num_hit_tokens
                    if len(answers) == self.world_size:
                        del self._answers[lookup_id]
                        self.reqs_status[lookup_id] = min(answers.values())
            except Exception:  # noqa: BLE001 - as stock: a bad message is dropped, the loop goes on
                if not self.running:
                    return


def _derived(fix: type, base: type) -> type:
    """The class of an object fixed by `fix`: `fix`'s methods over `base`, the class the object was built as, looked
    up when the deployment is built (after every `--engine-patch`): LMCache's own class, patched or not, or whatever
    class a patch put in its place (a user's fork), so that a user's patch reaches the objects that run, under the
    fix (`adapters.mixins.mixed_over`). A patch of a method the fix replaces without calling it (`REPLACES`) would not
    run: `ResolveError` says so."""
    if getattr(base, "_shardcheck_fix", None) is not fix:
        _check_not_replaced(fix, base)
    return mixed_over(fix, base)


def _check_not_replaced(fix: type, base: type) -> None:
    """`ResolveError` when a method `fix` replaces (and still does: an unfix may have taken it out) is no longer
    LMCache's own on `base`: an `--engine-patch` changed it, and the fix would silently drop that change."""
    import os

    import lmcache
    from runtime.registry import ResolveError
    home = os.path.dirname(lmcache.__file__)
    for name in getattr(fix, "REPLACES", ()):
        if name not in fix.__dict__:
            continue
        code = getattr(getattr(base, name, None), "__code__", None)
        if code is not None and not os.path.abspath(code.co_filename).startswith(home + os.sep):
            raise ResolveError(
                f"an engine patch changed {base.__name__}.{name} ({code.co_filename}:{code.co_firstlineno}), which "
                f"lmcache-patched replaces with its own fix ({fix.__doc__.split(':')[0].strip()}): the patch would not "
                f"run there; patch it on --engine lmcache, or take the fix out first "
                f"(adapters.engine_unfixes:without_e5) to run it under the other fixes")

def _restart_client_thread(client: Any, deployment: LMCacheDeployment, d: int, fixed: type) -> None:
    """Swap the stock async client's response thread for the patched one (E5): stop it (wake its receive), re-class
    the client as `fixed`, start the new thread."""
    import msgspec
    import zmq
    from lmcache.v1.lookup_client import factory
    from lmcache.v1.lookup_client.async_lookup_message import LookupResponseMsg

    from adapters.lmcache_engine.closing import WAKE_ID, wake

    client.running = False
    wake(factory.get_zmq_rpc_path_lmcache(deployment.engine_ids[d], "lookup_scheduler", 0, 0),
         [msgspec.msgpack.encode(LookupResponseMsg(lookup_id=WAKE_ID, num_hit_tokens=0))], zmq.PUSH)
    client.thread.join(2.0)
    client.__class__ = fixed
    client._setup()
    client.running = True
    client.thread = threading.Thread(target=client.process_responses_from_workers, daemon=True,
                                     name="async-lookup-client-thread")
    client.thread.start()


def apply_rank_fixes(side: Any, lookup_timeout: float) -> None:
    """E1-E4, E6 and E8 on one rank's objects (`adapters.lmcache_engine.rank_side.RankSide`), in its own process."""
    connector_cls, backend_cls = patched_resp_connector_class(), patched_remote_backend_class()
    for rank in side.ranks:
        engine = rank.engine
        engine.__class__ = _derived(_EngineFixes, type(engine))
        engine._setup()
        engine.lookup_timeout = lookup_timeout
        from lmcache.v1.lookup_client import factory
        if side.lookup_mode == "sync" and rank.server is not None:
            rank.server.transport.__class__ = _derived(_ReportingRouter, type(rank.server.transport))
            engine.transport = rank.server.transport
            rank.server.transport.engine = engine
            rank.server.__class__ = _derived(_SafeCloseSyncServer, type(rank.server))
            rank.server.wake_path = factory.get_zmq_rpc_path_lmcache(rank.metadata.engine_id, "lookup", 0,
                                                                     rank.metadata.worker_id)
        elif rank.server is not None:
            rank.server.__class__ = _derived(_RankTaggedAsyncServer, type(rank.server))
            rank.server.rank = rank.metadata.worker_id
            rank.server.wake_path = factory.get_zmq_rpc_path_lmcache(rank.metadata.engine_id, "lookup_worker", 0,
                                                                     rank.metadata.worker_id)
        backend = engine.storage_manager.storage_backends["RemoteBackend"]
        inner = getattr(backend.connection, "_connector", backend.connection)
        inner.__class__ = connector_cls
        inner.adopt(0.5, ("", ""))  # also the per-key-result native client (fix 10): the stock one answers None
        backend.__class__ = backend_cls
        backend.put_wait = 0.5


def apply_fixes(deployment: LMCacheDeployment) -> LMCacheDeployment:
    """Apply E1-E7 to a freshly built stock deployment: the rank-side fixes in each rank's process, E5's client in
    this one (E7 is the deployment's `adapter_tag`). Each fix's class derives from the class its object was built as
    (`_derived`); a patch the fixes would drop is a `ResolveError` (the deployment closed first)."""
    try:
        fixed = [_derived(_RankCountingClient, type(c)) for c in deployment.clients] \
            if deployment.lookup_mode == "async" else []
    except BaseException:
        deployment.close()
        raise
    for side in deployment.rank_sides:
        side.apply("adapters.engine_patched:apply_rank_fixes", lookup_timeout=deployment.lookup_timeout)
    for d, (client, cls) in enumerate(zip(deployment.clients, fixed)):
        _restart_client_thread(client, deployment, d, cls)
    return deployment


def patched_factory(n_ranks: int, **options: Any) -> LMCacheDeployment:
    """`--engine lmcache-patched`: the stock deployment with E1-E7 (E7: the adapter reaches the cache key);
    `runner="processes"`: one OS process per rank."""
    return apply_fixes(stock_factory(n_ranks, adapter_tag=True, name="lmcache-patched", **options))
