"""Valkey servers that several clients share (`runtime.tier`): embedded ones, or the user's own `urls`.

`valkey_tier(n_ranks, urls=None, password=None)` starts `n_ranks` embedded servers (stopped by `close()`) unless
`urls` names running ones (left running; only the keys the checks wrote are ever touched). `evict(rank, key,
store)` is the server's own eviction: a `DEL` on an admin connection (`adapters.valkey_servers.resp_command`) of the
server key the client stores `key` under: its `server_key(key)` when it has one, else the server keys that contain
`key` (found by `SCAN MATCH`). `check_naming(store)` tells, before any check, whether that works for a client: a
client whose server keys do not contain its keys and that has no `server_key` gets `evict_note` set, and the
server's own evictions are not run (the output says so) rather than run wrongly.
"""
from __future__ import annotations

import re
import secrets
from typing import Any, Sequence
from urllib.parse import urlparse

from adapters.valkey_servers import ServerSet, resp_command, start_servers

__all__ = ["ValkeyTier", "valkey_tier", "parse_scan"]

#: Characters a `SCAN MATCH` pattern treats specially.
_GLOB = re.compile(r"([*?\[\]\\])")


def parse_scan(reply: bytes) -> tuple[int, list[str]]:
    """The cursor and keys of a `SCAN` reply (`*2 $cursor *N $len key ...`)."""
    lines = reply.split(b"\r\n")
    if not lines or not lines[0].startswith(b"*2"):
        raise ValueError(f"not a SCAN reply: {reply[:60]!r}")
    cursor = int(lines[2])
    keys = [lines[i + 1].decode("utf-8", "replace") for i in range(3, len(lines) - 1) if lines[i].startswith(b"$")]
    return cursor, keys


class ValkeyTier:
    """`n_ranks` Valkey servers several clients share (see the module doc)."""

    def __init__(self, n_ranks: int, urls: Sequence[str] | None = None, password: str | None = None) -> None:
        self.owned: ServerSet | None = None
        self.evict_note = ""
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

    def _command(self, rank: int, *args: str) -> bytes:
        host, port, password = self.endpoints[rank]
        return resp_command(host, port, password, *args)

    def server_keys_of(self, rank: int, key: str, store: Any) -> list[str]:
        """The server keys `store` keeps `key` under on rank `rank`'s server."""
        named = getattr(store, "server_key", None)
        if callable(named):
            return [named(key)]
        escaped = _GLOB.sub(lambda m: "\\" + m.group(1), key)
        pattern, cursor, found = f"*{escaped}*", 0, []
        for _ in range(10_000):  # every SCAN step is bounded; a server holding millions of keys stops here
            cursor, keys = parse_scan(self._command(rank, "SCAN", str(cursor), "MATCH", pattern, "COUNT", "1000"))
            found += keys
            if cursor == 0:
                break
        return sorted(set(found))

    def evict(self, rank: int, key: str, store: Any) -> None:
        """The server of `rank` evicts `key` as `store`'s client names it."""
        for name in self.server_keys_of(rank, key, store):
            self._command(rank, "DEL", name)

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
        if self.owned is not None:
            self.owned.stop()


def valkey_tier(n_ranks: int, *, urls: Sequence[str] | None = None, password: str | None = None) -> ValkeyTier:
    """The shared-tier servers of a real client (`runtime.registry.VALKEY_TIER`)."""
    return ValkeyTier(n_ranks, urls, password)
