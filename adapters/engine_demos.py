"""Known-bad `--engine-patch` demos: each breaks one engine property of `lmcache` or `lmcache-patched`, the way a
user's fork would, so that every engine-level check is shown to fail (`model.checks.CATALOG`, layer "engine").

Each is a function with no arguments that patches LMCache's classes process-wide (idempotent; once applied, every
engine built afterwards in this process has the bug):

- `take_max`: the scheduler takes the maximum over the ranks' answers instead of the minimum (`engine-soundness`);
- `one_chunk_short`: the scheduler answers one chunk less than it found (`engine-completeness`);
- `memoise_sync_lookup`: the scheduler's sync lookup client answers a request id it has looked up before from its
  own memo, without asking the ranks again (`engine-completeness`: a request looked up before its prompt was
  stored keeps its miss; looked up again after an eviction it would keep a stale hit, `engine-soundness`);
- `flip_retrieved_byte`: a retrieve corrupts one byte of what it loads (`engine-integrity`);
- `drop_request_tags`: the token database ignores the request configs, so tenants' tags (and the patched
  integration's adapter tag) no longer reach the cache key (`engine-isolation`);
- `drop_lookup_unpin`: `lookup_unpin` does nothing (`pins`);
- `stuck_close`: the engine's close never returns (`engine-returns`).
"""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable

__all__ = ["take_max", "one_chunk_short", "memoise_sync_lookup", "flip_retrieved_byte", "drop_request_tags",
           "drop_lookup_unpin", "stuck_close", "DEMOS"]

_DONE: set[str] = set()
#: Answers each async lookup server sent, per lookup id (in-process: the `take_max` demo's scheduler reads them).
_ANSWERS: dict[str, list[int]] = {}
_LOCK = threading.Lock()
#: The separator a rank-tagged answer carries (`adapters.engine_patched.RANK_SEP`).
_TAG = "\x1f"


def _once(name: str, fn: Callable[[], None]) -> None:
    if name not in _DONE:
        fn()
        _DONE.add(name)


def take_max() -> None:
    """The scheduler's lookup takes the maximum over the ranks: sync, every rank's answer is replaced by the
    largest before LMCache's `min`; async, the answer `lookup_cache` reports is the largest one a rank sent."""
    def apply() -> None:
        from lmcache.v1.lookup_client.lmcache_async_lookup_client import LMCacheAsyncLookupClient, \
            LMCacheAsyncLookupServer
        from lmcache.v1.rpc.zmq_transport import ZmqReqRepClientTransport

        send_and_recv_all = ZmqReqRepClientTransport.send_and_recv_all

        @functools.wraps(send_and_recv_all)
        def largest(self: Any, msg: Any) -> list:
            got = send_and_recv_all(self, msg)
            return [max(got, key=lambda b: int.from_bytes(b, "big"))] * len(got) if got else got

        ZmqReqRepClientTransport.send_and_recv_all = largest
        send = LMCacheAsyncLookupServer.send_response_to_scheduler

        @functools.wraps(send)
        def recorded(self: Any, lookup_id: str, num_hit_tokens: int) -> None:
            with _LOCK:
                _ANSWERS.setdefault(lookup_id.split(_TAG)[0], []).append(num_hit_tokens)
            send(self, lookup_id, num_hit_tokens)

        LMCacheAsyncLookupServer.send_response_to_scheduler = recorded
        lookup_cache = LMCacheAsyncLookupClient.lookup_cache

        @functools.wraps(lookup_cache)
        def largest_answer(self: Any, lookup_id: str) -> Any:
            got = lookup_cache(self, lookup_id)
            if isinstance(got, int) and got >= 0:
                with _LOCK:
                    answers = _ANSWERS.pop(lookup_id, [])
                return max([got, *answers])
            return got

        LMCacheAsyncLookupClient.lookup_cache = largest_answer

    _once("take_max", apply)


def one_chunk_short() -> None:
    """The scheduler answers one chunk less than the minimum it found (sync and async)."""
    def apply() -> None:
        from lmcache.v1.lookup_client.lmcache_async_lookup_client import LMCacheAsyncLookupClient
        from lmcache.v1.lookup_client.lmcache_lookup_client import LMCacheLookupClient

        for cls, name in ((LMCacheLookupClient, "lookup"), (LMCacheAsyncLookupClient, "lookup_cache")):
            original = getattr(cls, name)

            @functools.wraps(original)
            def short(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
                got = _original(self, *args, **kwargs)
                if isinstance(got, int) and got > 0:
                    return max(0, got - self.config.chunk_size)
                return got

            setattr(cls, name, short)

    _once("one_chunk_short", apply)


def memoise_sync_lookup() -> None:
    """The sync lookup client keeps each request id's first answer and hands it back whenever that id is looked up
    again (vLLM asks about a waiting request at every scheduler step), whatever was stored or evicted since."""
    def apply() -> None:
        from lmcache.v1.lookup_client.lmcache_lookup_client import LMCacheLookupClient

        lookup = LMCacheLookupClient.lookup

        @functools.wraps(lookup)
        def memoised(self: Any, token_ids: Any, lookup_id: str, *args: Any, **kwargs: Any) -> Any:
            memo = self.__dict__.setdefault("_shardcheck_demo_memo", {})
            if lookup_id not in memo:
                memo[lookup_id] = lookup(self, token_ids, lookup_id, *args, **kwargs)
            return memo[lookup_id]

        LMCacheLookupClient.lookup = memoised

    _once("memoise_sync_lookup", apply)


def flip_retrieved_byte() -> None:
    """A retrieve flips the first byte it loaded into the request's KV buffer."""
    def apply() -> None:
        from lmcache.v1.cache_engine import LMCacheEngine

        retrieve = LMCacheEngine.retrieve

        @functools.wraps(retrieve)
        def corrupting(self: Any, tokens: Any, mask: Any = None, **kwargs: Any) -> Any:
            got = retrieve(self, tokens, mask, **kwargs)
            kv = kwargs.get("kvcaches")
            if kv is not None and bool(got.any()) and kv.numel():
                kv.view(-1)[0] ^= 0xFF
            return got

        LMCacheEngine.retrieve = corrupting

    _once("flip_retrieved_byte", apply)


def drop_request_tags() -> None:
    """The token database ignores the request configs: no tag (tenant, adapter) reaches a chunk key."""
    def apply() -> None:
        from lmcache.v1.token_database import ChunkedTokenDatabase

        process_tokens = ChunkedTokenDatabase.process_tokens

        @functools.wraps(process_tokens)
        def untagged(self: Any, *args: Any, **kwargs: Any) -> Any:
            kwargs["request_configs"] = None
            return process_tokens(self, *args, **kwargs)

        ChunkedTokenDatabase.process_tokens = untagged

    _once("drop_request_tags", apply)


def drop_lookup_unpin() -> None:
    """`LMCacheEngine.lookup_unpin` does nothing."""
    def apply() -> None:
        from lmcache.v1.cache_engine import LMCacheEngine

        LMCacheEngine.lookup_unpin = lambda self, lookup_id: None  # type: ignore[method-assign]

    _once("drop_lookup_unpin", apply)


def stuck_close() -> None:
    """`LMCacheEngine.close` never returns."""
    def apply() -> None:
        from lmcache.v1.cache_engine import LMCacheEngine

        LMCacheEngine.close = lambda self: threading.Event().wait()  # type: ignore[method-assign]

    _once("stuck_close", apply)


#: Every demo and the engine property it is built to violate (from `model.checks.CATALOG`).
def _demos() -> dict[str, str]:
    from model.checks import CATALOG

    return {f"adapters.engine_demos:{name}": p.name for p in CATALOG if p.layer == "engine" for name in p.demos}


DEMOS: dict[str, str] = _demos()
