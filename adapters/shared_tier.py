"""Valkey servers that several clients share (`runtime.tier`): embedded ones, or the user's own `urls`.

`valkey_tier(n_ranks, urls=None, password=None)` starts `n_ranks` embedded servers (stopped by `close()`) unless
`urls` names running ones (left running; only the keys the checks wrote are ever touched). `evict(rank, key,
store)` is the server's own eviction: a `DEL` on an admin connection (valkey-py, every call bounded) of the
server key the client stores `key` under: its `server_key(key)` when it has one, else the server keys that contain
`key` (found by `SCAN MATCH`; keys with CR/LF or glob characters included). `check_naming(store)` tells, before any check, whether that works for a client: a
client whose server keys do not contain its keys and that has no `server_key` gets `evict_note` set, and the
server's own evictions are not run (the output says so) rather than run wrongly.
"""
from __future__ import annotations

import re
import secrets
from typing import Any, Sequence
from urllib.parse import urlparse

from adapters.valkey_servers import ServerSet, start_servers

__all__ = ["ValkeyTier", "valkey_tier", "ADMIN_TIMEOUT"]

#: Seconds one admin call (SCAN, DEL) may take.
ADMIN_TIMEOUT = 2.0
#: Characters a `SCAN MATCH` pattern treats specially.
_GLOB = re.compile(r"([*?\[\]\\])")


class ValkeyTier:
    """`n_ranks` Valkey servers several clients share (see the module doc)."""

    def __init__(self, n_ranks: int, urls: Sequence[str] | None = None, password: str | None = None) -> None:
        self.owned: ServerSet | None = None
        self.evict_note = ""
        self._admins: dict[int, Any] = {}  # rank -> its valkey-py admin connection, made on first use
        if urls is None:
            self.owned = start_servers(n_ranks, password=password)
            self.urls = list(self.owned.urls)
            self.endpoints = [(self.owned.host, p, password) for p in self.owned.ports]
            return
        if isinstance(urls, str) or len(urls) < n_ranks:
            raise ValueError(f"{n_ranks} rank(s) need {n_ranks} server url(s), got {urls!r}")
        self.urls = list(urls[:n_ranks])
        self.endpoints = []
        for u in self.urls:
            p = urlparse(u)
            if p.hostname is None or p.port is None:
                raise ValueError(f"url {u!r} has no host:port")
            self.endpoints.append((p.hostname, p.port, p.password or password))

    def _admin(self, rank: int) -> Any:
        """A valkey-py connection to rank's server (made on first use, every call bounded by `ADMIN_TIMEOUT`)."""
        import valkey
        if rank not in self._admins:
            host, port, password = self.endpoints[rank]
            self._admins[rank] = valkey.Valkey(host=host, port=port, password=password, socket_timeout=ADMIN_TIMEOUT,
                                               socket_connect_timeout=ADMIN_TIMEOUT)
        return self._admins[rank]

    def server_keys_of(self, rank: int, key: str, store: Any) -> list[str]:
        """The server keys `store` keeps `key` under on rank `rank`'s server."""
        named = getattr(store, "server_key", None)
        if callable(named):
            return [named(key)]
        escaped = _GLOB.sub(lambda m: "\\" + m.group(1), key)
        found = set()
        # (bounded: a server holding more than 10 million matching keys stops there)
        for i, name in enumerate(self._admin(rank).scan_iter(match=f"*{escaped}*", count=1000)):
            found.add(name.decode("utf-8", "surrogateescape"))
            if i >= 10_000_000:
                break
        return sorted(found)

    def evict(self, rank: int, key: str, store: Any) -> None:
        """The server of `rank` evicts `key` as `store`'s client names it."""
        names = self.server_keys_of(rank, key, store)
        if names:
            self._admin(rank).delete(*[n.encode("utf-8", "surrogateescape") for n in names])

    def check_naming(self, store: Any) -> str:
        """Whether the server's evictions can name the keys of `store` (rank 0's; a wrapper's `inner` is the
        client): '' or why not (also set as `evict_note`)."""
        client = getattr(store, "inner", store)
        if callable(getattr(client, "server_key", None)):
            return ""
        probe = f"shardcheck-naming-{secrets.token_hex(6)}"
        store.put(probe, b"naming probe")
        try:
            if not self.server_keys_of(0, probe, client):
                self.evict_note = ("the server's own evictions did not run: this client's server keys do not contain "
                                   "its keys, and it has no server_key(key) to name them")
        finally:
            store.delete(probe)
        return self.evict_note

    def close(self) -> None:
        admins, self._admins = self._admins, {}
        for admin in admins.values():
            admin.close()
        if self.owned is not None:
            self.owned.stop()


def valkey_tier(n_ranks: int, *, urls: Sequence[str] | None = None, password: str | None = None) -> ValkeyTier:
    """The shared-tier servers of a real client (`adapters.catalogue.VALKEY_TIER`)."""
    return ValkeyTier(n_ranks, urls, password)
