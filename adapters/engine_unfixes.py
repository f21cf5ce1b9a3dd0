"""`--engine-patch` functions that take one of `lmcache-patched`'s fixes back out (`adapters.engine_patched`), every
other fix kept: the regression check that a trace of that fix's race needs the fix itself (not the connector's fix,
E6, answering first). A replay of the trace on `lmcache-patched` with the fix taken out answers `reproduces`.

Each takes the fix out of its mixin in `adapters.engine_patched`, process-wide (idempotent; every deployment built
afterwards in this process lacks the fix; a replay runs a trace with patches in a fresh process of its own):

- `without_e2`: a prefetch still running when its request ends is not released when it completes: `lookup_unpin`
  and `cleanup_memory_objs` skip it, as stock does (`pins`);
- `without_e4`: a sync lookup whose request ended while it ran, or whose answer the rank cannot deliver (the
  scheduler gave up on it while it waited in the rank's queue), keeps the pins it took, as stock does (`pins`);
  E4's release of a lookup that took longer than the scheduler's timeout is kept;
- `without_e5`: the scheduler's async client and the ranks' async servers are stock's: answers carry no rank, the
  client takes the minimum over whatever answers arrive for an id, late ones of a lookup it gave up included
  (`engine-returns`, `engine-soundness`).
"""
from __future__ import annotations

from typing import Any

__all__ = ["without_e2", "without_e4", "without_e5", "UNFIXES"]


def without_e2() -> None:
    """E2 out: a release never waits for the prefetch it finds still running (stock skips it)."""
    from adapters.engine_patched import _EngineFixes

    def never_deferred(self: Any, lookup_id: str) -> bool:
        return False

    _EngineFixes._release_when_done = never_deferred  # type: ignore[method-assign]


def without_e4() -> None:
    """E4's releases of a lookup that outlived its request and of an undelivered answer out: the rank's sync server
    transport sends as its own class does (stock: an answer to a socket that is gone is dropped silently), the pins
    stay."""
    from adapters.engine_patched import _EngineFixes, _ReportingRouter

    def keep_pins(self: Any, lookup_id: str) -> None:
        return None

    _without(_ReportingRouter, "send_response")
    _EngineFixes._outlived = keep_pins  # type: ignore[method-assign]


def without_e5() -> None:
    """E5 out: the patched async client's lookup, `lookup_cache` and answer loop, and the async server's answer,
    are the client's and server's own again (the patched classes stay in place, so E8's close of the server is
    kept)."""
    from adapters.engine_patched import _RankCountingClient, _RankTaggedAsyncServer

    for name in ("lookup", "lookup_cache", "process_responses_from_workers"):
        _without(_RankCountingClient, name)
    _without(_RankTaggedAsyncServer, "send_response_to_scheduler")


def _without(fix: type, name: str) -> None:
    """Take the method `name` out of the fix `fix` (a mixin): the class it is mixed over answers it again."""
    if name in fix.__dict__:
        delattr(fix, name)


#: Each fix taken out: the `--engine-patch` reference, and the fix (`adapters.engine_patched`'s docstring).
UNFIXES: dict[str, str] = {"adapters.engine_unfixes:without_e2": "E2", "adapters.engine_unfixes:without_e4": "E4",
                           "adapters.engine_unfixes:without_e5": "E5"}
