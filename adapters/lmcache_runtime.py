"""What the LMCache store adapters run on: `Bounded` (LMCache calls on a daemon thread or the store's own event loop,
every wait bounded), chained futures, the admin connection that evicts, and the servers a factory call uses (given
`urls`, or its own, stopped when its last store closes)."""
from __future__ import annotations

import asyncio
import concurrent.futures as cf
import threading
from typing import Any, Callable, Sequence

from adapters.valkey_servers import ServerSet, resp_command, start_servers
from model.contract import StoreCallTimeout

__all__ = ["Bounded"]


# --------------------------------------------------------------------------- bounded execution

class Bounded:
    """Runs LMCache calls so that a stuck call cannot hang the caller.

    Sync calls run on a fresh daemon thread; coroutines run on the store's own event loop thread
    (daemon). Waiting is bounded by `timeout`; a stuck call is abandoned (its thread stays parked
    on LMCache's side, never joined).
    """

    def __init__(self, timeout: float, name: str) -> None:
        self.timeout = float(timeout)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name=f"{name}-loop", daemon=True)
        self._thread.start()
        self.timeouts = 0

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            # stopped by `stop()`: drop what is still pending (a stuck LMCache call) and close
            try:
                for task in asyncio.all_tasks(self.loop):
                    task.cancel()
                self.loop.run_until_complete(asyncio.sleep(0))
            except Exception:
                pass
            self.loop.close()

    def call(self, op: str, key: str, fn: Callable[[], Any], timeout: float | None = None) -> Any:
        timeout = self.timeout if timeout is None else timeout
        fut: cf.Future = cf.Future()

        def run() -> None:
            if not fut.set_running_or_notify_cancel():
                return
            try:
                fut.set_result(fn())
            except BaseException as e:  # handed to the caller
                fut.set_exception(e)

        threading.Thread(target=run, name=f"lmcache-{op}", daemon=True).start()
        try:
            return fut.result(timeout)
        except cf.TimeoutError:
            if fut.done():  # the call itself raised a TimeoutError (a socket timeout): an error, not our bound
                raise
            self.timeouts += 1
            raise StoreCallTimeout(op, key, timeout) from None

    def submit(self, coro_fn: Callable[[], Any]) -> cf.Future:
        """Schedule `coro_fn()` on the loop; returns the concurrent future (unbounded)."""
        async def runner() -> Any:
            return await coro_fn()

        return asyncio.run_coroutine_threadsafe(runner(), self.loop)

    def run(self, op: str, key: str, coro_fn: Callable[[], Any], timeout: float | None = None) -> Any:
        timeout = self.timeout if timeout is None else timeout
        fut = self.submit(coro_fn)
        try:
            return fut.result(timeout)
        except cf.TimeoutError:
            if fut.done():  # the coroutine itself raised a TimeoutError: an error, not our bound
                raise
            fut.cancel()
            self.timeouts += 1
            raise StoreCallTimeout(op, key, timeout) from None

    def on_loop(self, fn: Callable[[], Any], timeout: float) -> Any:
        """Run a plain function on the loop thread (LMCache objects that bind to the running loop)."""
        async def runner() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(runner(), self.loop).result(timeout)

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        try:
            self.loop.call_soon_threadsafe(self.loop.stop)
        except RuntimeError:
            pass


def _then(fut: cf.Future, fn: Callable[[Any], Any]) -> cf.Future:
    """A concurrent future resolving to fn(result of fut) (or fut's exception)."""
    out: cf.Future = cf.Future()

    def done(f: cf.Future) -> None:
        if out.done():
            return
        if f.cancelled():
            out.cancel()
            return
        exc = f.exception()
        if exc is not None:
            out.set_exception(exc)
            return
        try:
            value = fn(f.result())
        except BaseException as e:
            if not out.done():
                out.set_exception(e)
            return
        if not out.done():
            out.set_result(value)

    def cancel_source(o: cf.Future) -> None:
        if o.cancelled():
            fut.cancel()

    out.add_done_callback(cancel_source)
    fut.add_done_callback(done)
    return out


# --------------------------------------------------------------------------- admin (eviction)

_resp_command = resp_command  # (the admin connection that evicts: `adapters.valkey_servers.resp_command`)


# --------------------------------------------------------------------------- server ownership

def _reachable(host: str, port: int, timeout: float = 2.0) -> None:
    """`ConnectionError` naming host:port when nothing accepts a connection there."""
    import socket
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        raise ConnectionError(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from None


class _Servers:
    """The servers a factory call uses: given `urls`, or its own (stopped when all stores close)."""

    def __init__(self, n_ranks: int, topology: str, urls: Sequence[str] | None,
                 password: str | None) -> None:
        if topology not in ("per-rank", "shared"):
            raise ValueError(f"topology must be 'per-rank' or 'shared', got {topology!r}")
        n_servers = n_ranks if topology == "per-rank" else 1
        self.topology = topology
        self.owned: ServerSet | None = None
        self.password = password
        if urls is None:
            self.owned = start_servers(n_servers, password=password)
            self.endpoints = [("127.0.0.1", p) for p in self.owned.ports]
        else:
            from urllib.parse import urlparse

            if len(urls) < n_servers:
                raise ValueError(f"topology {topology!r} with {n_ranks} ranks needs {n_servers} "
                                 f"url(s), got {len(urls)}")
            self.endpoints = []
            for u in urls[:n_servers]:  # (a user's tier may have more servers than this call's ranks)
                p = urlparse(u)
                if p.hostname is None or p.port is None:
                    raise ValueError(f"url {u!r} has no host:port")
                self.endpoints.append((p.hostname, p.port))
                if p.password and self.password is None:
                    self.password = p.password
            for host, port in self.endpoints:  # LMCache's native client only logs a failed connect, then hangs
                _reachable(host, port)
        self._refs = n_ranks
        self._lock = threading.Lock()

    def endpoint(self, rank: int) -> tuple[str, int]:
        return self.endpoints[rank if self.topology == "per-rank" else 0]

    def release(self) -> None:
        with self._lock:
            self._refs -= 1
            last = self._refs == 0
        if last and self.owned is not None:
            self.owned.stop()


def stores_over(servers: _Servers, n_ranks: int, make: Callable[[int], Any]) -> list:
    """`make(rank)` for every rank over `servers`; when one raises, the stores made are closed and the servers the
    rest would have held are released."""
    stores: list = []
    try:
        for rank in range(n_ranks):
            stores.append(make(rank))
    except BaseException:
        for s in stores:
            s.close()
        for _ in range(n_ranks - len(stores)):
            servers.release()
        raise
    return stores
