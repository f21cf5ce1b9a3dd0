"""Before any property runs: can the client reach its tier? A factory that cannot connect, or a first call that
cannot, is an unusable tier (exit 2, one line naming the client, the server and the cause), not a client bug.

`reach(client, options)` makes the client's stores and asks each one `contains` of a key nobody wrote, every call
bounded. A connection-level failure there (`OSError` and its kin, an error a client library names a connection
or timeout error) raises `TierUnreachable`; anything else, a call that does not return included, is left for the
properties to judge (a client that raises or hangs on a plain miss has a bug, not a dead tier).
"""
from __future__ import annotations

import uuid

from model.contract import StoreCallTimeout
from runtime.bounded import BoundedStore
from runtime.registry import Client, ResolveError, options_for_ranks

__all__ = ["TierUnreachable", "reach", "is_connection_error"]


class TierUnreachable(ResolveError):
    """The client's servers cannot be reached: the message names the client, the servers and the cause."""


def is_connection_error(exc: BaseException) -> bool:
    """Whether `exc` (or what caused it) says a server could not be reached."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, StoreCallTimeout):  # a call that hangs is judged by the properties (store-hang)
            return False
        if isinstance(exc, (OSError, ConnectionError, TimeoutError)):
            return True
        name = type(exc).__name__.lower()
        if "connection" in name or "timeout" in name or "unreachable" in name:
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def _where(options: dict) -> str:
    urls = options.get("urls")
    return f" (servers {', '.join(map(str, urls))})" if urls else ""


def reach(client: Client, options: dict, *, n_ranks: int = 1, op_timeout: float = 2.0) -> None:
    """Raise `TierUnreachable` when `client`'s stores (made with `options`) cannot reach their servers."""
    try:
        made = client.factory(n_ranks, **client.accepted(options_for_ranks(options, n_ranks)))
    except Exception as exc:  # noqa: BLE001 - any failure to build the stores is an unusable tier or factory
        if is_connection_error(exc):
            raise TierUnreachable(f"client {client.name!r}: its tier cannot be reached{_where(options)}: "
                                  f"factory({n_ranks}) raised {type(exc).__name__}: {_one_line(exc)}") from None
        raise ResolveError(f"client {client.name!r}: factory({n_ranks}) raised {type(exc).__name__}: "
                           f"{_one_line(exc)}") from None
    stores = [BoundedStore(s, op_timeout) for s in made]
    try:
        key = f"shardcheck:preflight:{uuid.uuid4().hex}"
        for rank, store in enumerate(stores):
            try:
                store.contains(key)
            except Exception as exc:  # noqa: BLE001 - only a connection failure is the tier's; the rest is judged later
                if is_connection_error(exc):
                    raise TierUnreachable(f"client {client.name!r}: rank {rank}'s server cannot be reached"
                                          f"{_where(options)}: contains() raised {type(exc).__name__}: "
                                          f"{_one_line(exc)}") from None
    finally:
        for s in stores:
            s.close()


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."
