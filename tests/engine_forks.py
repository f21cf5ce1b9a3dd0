"""`--engine-patch` functions of the kind a user writes against LMCache's own classes, for the tests of hermetic replays
and of patches on `lmcache-patched` (`tests/test_replay_hermetic.py`): each changes LMCache for the whole process it
runs in, so the tests only ever apply them through a replay (a fresh process of its own: `checking.replay_arm`).

- `fork_async_client`: a user's fork of LMCache's async lookup client put in place of LMCache's class (the module's
  `LMCacheAsyncLookupClient`, which LMCache's lookup client factory instantiates): its `lookup_cache` answers one
  chunk more than LMCache's (`engine-soundness`), and it counts its answers in the client's `facts`
  (`FORK_ANSWERS`);
- `max_answer_loop`: the async client's answer loop patched to take the maximum over the ranks' answers (the
  held-out bug of issue 28), a method `lmcache-patched` replaces with its own fix (E5).
"""
from __future__ import annotations

from typing import Any

__all__ = ["fork_async_client", "max_answer_loop", "FORK_ANSWERS"]

#: The fact the fork counts (the deployment's `facts()` sums its client's `facts`).
FORK_ANSWERS = "fork answers one chunk more"


def fork_async_client() -> None:
    from lmcache.v1.lookup_client import lmcache_async_lookup_client as module

    if getattr(module.LMCacheAsyncLookupClient, "forked", False):
        return

    class ForkedAsyncLookupClient(module.LMCacheAsyncLookupClient):  # type: ignore[name-defined,misc]
        forked = True

        def lookup_cache(self, lookup_id: str) -> Any:
            got = super().lookup_cache(lookup_id)
            if isinstance(got, int) and got > 0:
                facts = self.__dict__.setdefault("facts", {})
                facts[FORK_ANSWERS] = facts.get(FORK_ANSWERS, 0) + 1
                return got + self.config.chunk_size
            return got

    module.LMCacheAsyncLookupClient = ForkedAsyncLookupClient


def max_answer_loop() -> None:
    from lmcache.v1.lookup_client.lmcache_async_lookup_client import LMCacheAsyncLookupClient

    if getattr(LMCacheAsyncLookupClient.process_responses_from_workers, "takes_max", False):
        return

    def process_responses_from_workers(self: Any) -> None:
        import msgspec
        from lmcache.v1.lookup_client.async_lookup_message import LookupResponseMsg
        while self.running:
            try:
                msg = msgspec.msgpack.decode(self.pull_socket.recv(copy=False), type=LookupResponseMsg)
                with self.lock:
                    got = self.res_for_each_worker.setdefault(msg.lookup_id, [])
                    got.append(msg.num_hit_tokens)
                    if len(got) == self.world_size:
                        self.reqs_status[msg.lookup_id] = max(self.res_for_each_worker.pop(msg.lookup_id))
            except Exception:  # noqa: BLE001 - as LMCache's: a bad message is dropped
                if not self.running:
                    return

    process_responses_from_workers.takes_max = True  # type: ignore[attr-defined]
    LMCacheAsyncLookupClient.process_responses_from_workers = process_responses_from_workers
