"""`--client lmcache-native`: LMCache 0.5.6's native RESP client class (`RESPClient`, the one its connector uses),
called directly, one store per rank (`adapters.lmcache_stores` holds the shared base, keys and factories)."""
from __future__ import annotations

import concurrent.futures as cf
from typing import Any, Sequence

from adapters.lmcache_runtime import _Servers, _then
from adapters.lmcache_stores import CHUNK_BYTES, _make, _StoreBase, decode_frame, encode_frame
from model.calls import DEFAULT_OP_TIMEOUT

__all__ = ["NativeStore", "native_factory"]


class NativeStore(_StoreBase):
    """One rank's store over LMCache's native RESP client class (what RESPConnector wraps)."""

    connections_per_worker = 1

    client_name = "lmcache-native"
    paths = ("get", "get_async", "get_batch", "get_sync", "contains", "contains_batch")

    def __init__(self, rank: int, n_ranks: int, servers: _Servers, *, use_mla: bool = True,
                 op_timeout: float = DEFAULT_OP_TIMEOUT, num_workers: int = 8) -> None:
        super().__init__(rank, n_ranks, servers, use_mla=use_mla, op_timeout=op_timeout,
                         num_workers=num_workers)
        from lmcache.v1.storage_backend.native_clients.resp_client import RESPClient

        try:
            self._connected_after = self._newest_client_id()
            self.client = self.bounded.on_loop(
                lambda: RESPClient(self.host, self.port, self.num_workers, self.bounded.loop,
                                   "", self.password or ""),
                timeout=max(10.0, self.op_timeout))
        except BaseException:
            self.bounded.stop()
            raise

    def put(self, key: str, value: bytes) -> None:
        ks, frame = self.key_string(key), bytearray(encode_frame(value))
        self.bounded.run("put", key, lambda: self.client.set(ks, memoryview(frame)))

    def _read(self, buf: bytearray) -> bytes:
        return decode_frame(buf)

    def get(self, key: str) -> bytes | None:
        ks, buf = self.key_string(key), bytearray(CHUNK_BYTES)

        async def go() -> bytes | None:
            await self.client.get(ks, memoryview(buf))
            return self._read(buf)

        return self.bounded.run("get", key, go)

    def get_sync(self, key: str) -> bytes | None:
        """The client's sync read path (`get_sync`), called from a worker thread."""
        ks, buf = self.key_string(key), bytearray(CHUNK_BYTES)

        def go() -> bytes | None:
            self.client.get_sync(ks, memoryview(buf))
            return self._read(buf)

        return self.bounded.call("get_sync", key, go)

    def get_async(self, key: str) -> cf.Future:
        ks, buf = self.key_string(key), bytearray(CHUNK_BYTES)
        fut = self.bounded.submit(lambda: self.client.get(ks, memoryview(buf)))
        return _then(fut, lambda _: self._read(buf))

    def get_batch(self, keys: Sequence[str]) -> list[bytes | None]:
        kss = [self.key_string(k) for k in keys]
        bufs = [bytearray(CHUNK_BYTES) for _ in keys]
        self.bounded.run("get_batch", ",".join(keys),
                         lambda: self.client.batch_get(kss, [memoryview(b) for b in bufs]))
        return [self._read(b) for b in bufs]

    def contains(self, key: str) -> bool:
        ks = self.key_string(key)
        return bool(self.bounded.run("contains", key, lambda: self.client.exists(ks)))

    def contains_batch(self, keys: Sequence[str]) -> int:
        kss = [self.key_string(k) for k in keys]
        res = self.bounded.run("contains_batch", ",".join(keys), lambda: self.client.batch_exists(kss))
        n = 0
        for r in res:
            if not r:
                break
            n += 1
        return n

    def _shutdown_client(self) -> None:
        # LMCache's native close (`connector_client_base.py:165`, into its C++ client) was seen to hold the GIL for
        # over 5 minutes on servers that stay up (the user's `urls`): no other thread of the process could start.
        # On servers shardcheck owns it returns; on the user's, the native client is left to the process's exit.
        if self.servers is None:
            return
        try:
            self.bounded.on_loop(self.client.close, timeout=1.0)
        except Exception:
            pass


def native_factory(n_ranks: int, **options: Any) -> list[NativeStore]:
    """`--client lmcache-native`: LMCache's native RESP client class, directly."""
    return _make(NativeStore, n_ranks, **options)
