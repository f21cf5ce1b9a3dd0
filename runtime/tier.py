"""A shared tier: several clients of the same servers, as every engine of a deployment shares them.

A factory that accepts `urls` may be called more than once with the same servers (CONTRACT.md). `open_shared`
gets the servers (the client's `tier`: in-memory servers for `model` and the in-memory demos, embedded Valkey
servers for a real client, `adapters.catalogue.VALKEY_TIER`, or the user's own when the client's options name
`urls`), calls the factory
`clients` times with their urls, and hands back a `SharedStores`: `clients[c][rank]` is client c's store of
rank r's server, and `evict(rank, key)` is the server's own eviction of a key (no client sees it first). A
client whose factory takes no `urls` gets `NotShared` with the reason, which the layers report: the shared-tier
checks did not run.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable

import attrs

from runtime.registry import Client, ResolveError, load_attr

__all__ = ["SharedStores", "NotShared", "open_shared", "SHARED_CLIENTS"]

#: Clients per server the shared-tier checks run.
SHARED_CLIENTS = 2


class NotShared(Exception):
    """The client cannot be run several times on the same servers; the message says why (shown to the user)."""

    @staticmethod
    def reason(client: Client) -> str:
        return (f"client {client.name!r}: its factory takes no `urls`, so it cannot be called again on the same "
                "servers (declare factory.options with 'urls', or a `urls` parameter)")


@attrs.define
class SharedStores:
    """`clients[c][rank]`: client c's store of rank r's server; `evict(rank, key)`: the server evicts `key` (None:
    this tier cannot evict by itself, `evict_note` says why); `close()` closes every store, then the servers."""

    clients: list[list]
    tier: Any
    wrap: Callable[[Any], Any] | None = None
    evict_note: str = ""

    def __attrs_post_init__(self) -> None:
        if self.wrap is not None:
            self.clients = [[self.wrap(s) for s in stores] for stores in self.clients]

    @property
    def n_clients(self) -> int:
        return len(self.clients)

    def can_evict(self) -> bool:
        return callable(getattr(self.tier, "evict", None)) and not self.evict_note

    def evict(self, rank: int, key: str) -> None:
        """The server of `rank` evicts `key` (every client's view of it is gone)."""
        store = self.clients[0][rank]
        self.tier.evict(rank, key, getattr(store, "inner", store))

    def close(self) -> None:
        for stores in self.clients:
            for s in stores:
                with contextlib.suppress(Exception):  # closing is best effort; the servers still stop
                    s.close()
        with contextlib.suppress(Exception):
            self.tier.close()


def open_shared(client: Client, n_ranks: int, *, clients: int = SHARED_CLIENTS,
                wrap: Callable[[Any], Any] | None = None, **options: Any) -> SharedStores:
    """`clients` clients of `n_ranks` shared servers (see the module doc); `wrap` wraps every store (e.g.
    `BoundedStore`); `options`: the factory's (the user's `urls` and `password` name the servers to share).
    `NotShared` when the factory takes no `urls`; `ResolveError` when the servers cannot be had."""
    if not client.takes_urls():
        raise NotShared(NotShared.reason(client))
    if client.tier is None:
        raise NotShared(f"client {client.name!r}: no servers are known that several of its clients could share "
                        "(give its factory a `tier`, or name it in a client table that has one)")
    try:
        tier = load_attr(client.tier, "tier")(n_ranks, **{k: v for k, v in options.items()
                                                          if k in ("urls", "password")})
    except ResolveError:
        raise
    except (OSError, RuntimeError, ValueError, TypeError) as exc:
        raise ResolveError(f"client {client.name!r}: its servers ({client.tier}) could not be had: "
                           f"{type(exc).__name__}: {exc}") from None
    made: list[list] = []
    try:
        for _ in range(clients):
            made.append(client.stores(n_ranks, **{**options, "urls": list(tier.urls)}))
    except BaseException:
        SharedStores(made, tier).close()
        raise
    shared = SharedStores(made, tier, wrap=wrap)
    naming = getattr(tier, "check_naming", None)
    if callable(naming):  # can the server's own evictions name this client's keys?
        try:
            shared.evict_note = naming(shared.clients[0][0])
        except Exception as exc:  # noqa: BLE001 - then the server's evictions do not run; the layers say why
            shared.evict_note = f"the server's own evictions did not run: naming the client's keys failed ({exc})"
    return shared
