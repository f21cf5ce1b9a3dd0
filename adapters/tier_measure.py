"""Measuring a KV tier the way the paper did, through LMCache's own RESP client (the one its `resp://`
connector wraps), from N rank processes at once.

`measure_tier(chunk_bytes=..., urls=None, ...)` starts embedded Valkey servers on free 127.0.0.1 ports (one
shared + one per rank; always stopped) unless `urls` names the user's own (one: shared only; several: the
first is also the shared one, and N ranks use the first N as one per rank). It returns a dict of every figure:

- `bandwidth`: aggregate GET bytes/s with N = 1, 2, 4, 8 rank processes, against one shared server and one
  server per rank; every process GETs its own chunks in a loop for `seconds` after a common start;
- `latency`: p50/p99 seconds of one chunk GET under that load, per configuration;
- `t0`: a one-chunk hit end to end through the client (EXISTS, then GET into a buffer), median of repeats;
- `hits`: end-to-end hit time of m chunks (`HIT_CHUNKS`) from one rank: the measured points of T_hit(n).

Every blocking step is bounded: a worker that does not answer within its deadline is killed, and the run
fails with `TierError` (an unreachable server: `Unreachable`, before anything starts).
"""
from __future__ import annotations

import multiprocessing
import multiprocessing.connection as mpc
import os
import statistics
import time
import uuid
from typing import Any, Callable, Sequence
from urllib.parse import urlparse

from adapters.children import die_with_parent, reap
from adapters.valkey_servers import resp_command

__all__ = ["measure_tier", "TierError", "Unreachable", "RANK_COUNTS", "parse_url", "ping"]

RANK_COUNTS = (1, 2, 4, 8)
#: Chunks each rank keeps in the tier and GETs in turn.
KEYS_PER_RANK = 2
#: Chunks per measured hit (the points of T_hit(n)); a hit of more than 8 reads the same 8 stored chunks again.
HIT_CHUNKS = (1, 4, 16, 64)
#: Seconds a worker may take for one command beyond its own measuring time.
STEP_TIMEOUT = 30.0
_CTX: Any = None


class TierError(RuntimeError):
    """The measurement could not complete (a worker failed or did not answer in time)."""


class Unreachable(TierError):
    """A server given with `--url` does not answer PING."""


def parse_url(url: str) -> tuple[str, int, str | None]:
    """(host, port, password) of `redis://`, `valkey://`, `resp://` or `host:port`; ValueError when unusable."""
    p = urlparse(url if "://" in url else f"resp://{url}")
    try:
        port = p.port
    except ValueError:
        port = None
    if not p.hostname or port is None:
        raise ValueError(f"--url {url!r}: expected SCHEME://[:PASSWORD@]HOST:PORT")
    return p.hostname, port, p.password


_resp = resp_command  # (`adapters.valkey_servers.resp_command`)


def ping(host: str, port: int, password: str | None) -> bool:
    """Whether a RESP server answers PING at host:port within 2 s."""
    try:
        return _resp(host, port, password, "PING").startswith(b"+PONG")
    except OSError:
        return False


# -- the worker (one rank process) ----------------------------------------------------------------------
def _worker(conn: Any, parent_pid: int) -> None:
    """Serve commands from the parent: connect, fill, get (timed loop), hit (m-chunk hits), close.

    Every client call runs as a coroutine on the client's own event loop (`Bounded.run`): LMCache 0.5.6's
    `*_sync` calls register their completion after submitting it, from another thread, and one was lost
    here (a fill that never returned) when the completion won that race."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops and reaps us

    die_with_parent(parent_pid)
    from adapters.lmcache_stores import Bounded, _quiet_lmcache_logs
    from lmcache.v1.storage_backend.native_clients.resp_client import RESPClient
    _quiet_lmcache_logs(force=True)
    bounded, client = Bounded(STEP_TIMEOUT, "shardcheck-tier"), None
    try:
        while True:
            msg = conn.recv()
            try:
                if msg[0] == "connect":
                    if client is not None:
                        bounded.on_loop(client.close, timeout=2.0)
                    host, port, password = msg[1:]
                    client = bounded.on_loop(lambda: RESPClient(host, port, 4, bounded.loop, "", password or ""),
                                             timeout=10.0)
                    conn.send(("ok",))
                elif msg[0] == "fill":
                    keys, size = msg[1], msg[2]
                    data = memoryview(os.urandom(min(size, 1 << 16)) * (size // (1 << 16) + 1))[:size]
                    for k in keys:
                        bounded.run("set", k, lambda k=k: client.set(k, data))
                    conn.send(("ok",))
                elif msg[0] == "get":
                    conn.send(("ok", _get_loop(bounded, client, *msg[1:])))
                elif msg[0] == "hit":
                    conn.send(("ok", _hit(bounded, client, *msg[1:])))
                elif msg[0] == "close":
                    break
            except Exception as exc:
                conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        if client is not None:
            try:
                bounded.on_loop(client.close, timeout=2.0)
            except Exception:
                pass
        bounded.stop()


def _get_loop(bounded: Any, client: Any, keys: list[str], size: int, start_at: float, seconds: float) -> dict:
    buf = memoryview(bytearray(size))
    lat: list[float] = []
    while time.time() < start_at:
        time.sleep(0.001)
    t0 = time.time()
    i = 0
    while time.time() - t0 < seconds:
        a = time.perf_counter()
        key = keys[i % len(keys)]
        bounded.run("get", key, lambda: client.get(key, buf))
        lat.append(time.perf_counter() - a)
        i += 1
    return {"start": t0, "end": time.time(), "gets": len(lat), "bytes": len(lat) * size, "latencies": lat}


def _hit(bounded: Any, client: Any, keys: list[str], size: int, repeats: int) -> list[float]:
    """Seconds of one end-to-end hit of `keys` (EXISTS of each, then a GET of each), `repeats` times."""
    bufs = [memoryview(bytearray(size)) for _ in keys]
    out = []
    for _ in range(repeats):
        a = time.perf_counter()
        if not all(bounded.run("exists", keys[0], lambda: client.batch_exists(sorted(set(keys))))):
            raise TierError("a chunk that was just stored is missing")
        for k, b in zip(keys, bufs):
            bounded.run("get", k, lambda k=k, b=b: client.get(k, b))
        out.append(time.perf_counter() - a)
    return out


# -- the parent -----------------------------------------------------------------------------------------
class _Workers:
    """Up to 8 long-lived rank processes (a forkserver that imported LMCache once forks them)."""

    def __init__(self, n: int) -> None:
        global _CTX
        if _CTX is None:
            _CTX = multiprocessing.get_context("forkserver")
            _CTX.set_forkserver_preload(["adapters.tier_measure", "adapters.lmcache_stores",
                                         "lmcache.v1.storage_backend.native_clients.resp_client"])
        self.procs, self.conns = [], []
        for r in range(n):
            mine, theirs = _CTX.Pipe()
            p = _CTX.Process(target=_worker, args=(theirs, os.getpid()), name=f"shardcheck-tier{r}", daemon=True)
            p.start()
            theirs.close()
            self.procs.append(p)
            self.conns.append(mine)

    def ask(self, ranks: Sequence[int], msgs: Sequence[tuple], seconds: float = STEP_TIMEOUT) -> list[Any]:
        for r, m in zip(ranks, msgs):
            self.conns[r].send(m)
        deadline, out = time.monotonic() + seconds, {}
        while len(out) < len(ranks):
            left = deadline - time.monotonic()
            waiting = [self.conns[r] for r in ranks if r not in out]
            if left <= 0 or not mpc.wait(waiting, timeout=left):
                raise TierError(f"rank processes {[r for r in ranks if r not in out]} did not answer within "
                                f"{seconds:g} s")
            for r in ranks:
                if r not in out and self.conns[r] in mpc.wait([self.conns[r]], timeout=0):
                    try:
                        reply = self.conns[r].recv()
                    except EOFError:
                        raise TierError(f"rank process {r} died (exit code {self.procs[r].exitcode})") from None
                    if reply[0] == "error":
                        raise TierError(f"rank process {r}: {reply[1]}")
                    out[r] = reply[1] if len(reply) > 1 else None
        return [out[r] for r in ranks]

    def close(self) -> None:
        for c in self.conns:
            try:
                c.send(("close",))
            except OSError:
                pass
        reap(self.procs, seconds=3.0)
        for c in self.conns:
            c.close()


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))]


def measure_tier(*, chunk_bytes: int, urls: Sequence[str] | None = None, seconds: float = 1.5,
                 rank_counts: Sequence[int] = RANK_COUNTS, t0_repeats: int = 15,
                 progress: Callable[[str], None] | None = None) -> dict:
    """Every figure of one tier measurement (see the module docstring); servers it started are stopped."""
    step = progress or (lambda text: None)
    endpoints = [parse_url(u) for u in urls] if urls else None
    for host, port, pw in endpoints or ():
        if not ping(host, port, pw):
            raise Unreachable(f"server {host}:{port} does not answer PING")
    owned = None
    workers = None
    source = "url" if endpoints is not None else "embedded"
    prefix = f"shardcheck-tier-{uuid.uuid4().hex[:8]}"
    top = max(rank_counts)
    try:
        if endpoints is None:
            from adapters.valkey_servers import ServerStartError, start_servers
            step("starting Valkey servers")
            try:
                owned = start_servers(1 + top)
            except (ServerStartError, OSError) as exc:
                raise TierError(f"could not start the embedded Valkey servers: {exc}") from None
            endpoints = [("127.0.0.1", p, None) for p in owned.ports]
            shared, per_rank = endpoints[0], endpoints[1:]
            source = "embedded"
        else:
            shared, per_rank = endpoints[0], list(endpoints) if len(endpoints) > 1 else []
            source = "url"
        step("starting rank processes")
        workers = _Workers(top)
        keys = {r: [f"{prefix}:r{r}:c{i}" for i in range(KEYS_PER_RANK)] for r in range(top)}
        result: dict[str, Any] = {"source": source, "chunk_bytes": chunk_bytes, "seconds_per_point": seconds,
                                  "cores": os.cpu_count(), "bandwidth": {"shared": {}, "per_rank": {}},
                                  "latency": {"shared": {}, "per_rank": {}}}
        topologies = {"shared": lambda r: shared}
        if per_rank:
            topologies["per_rank"] = lambda r: per_rank[r]
        for name, where in topologies.items():
            counts = [n for n in rank_counts if name == "shared" or n <= len(per_rank)]
            ranks = list(range(max(counts)))
            step(f"{name}: filling {len(ranks)} ranks x {KEYS_PER_RANK} chunks of {chunk_bytes / 1e6:.1f} MB")
            workers.ask(ranks, [("connect", *where(r)) for r in ranks])
            workers.ask(ranks, [("fill", keys[r], chunk_bytes) for r in ranks], STEP_TIMEOUT * 2)
            for n in counts:
                step(f"{name}: {n} rank process{'es' if n > 1 else ''} GET for {seconds:g} s")
                start_at = time.time() + 0.2
                runs = workers.ask(list(range(n)), [("get", keys[r], chunk_bytes, start_at, seconds)
                                                    for r in range(n)], STEP_TIMEOUT + seconds)
                span = max(x["end"] for x in runs) - min(x["start"] for x in runs)
                lat = [v for x in runs for v in x["latencies"]]
                result["bandwidth"][name][str(n)] = sum(x["bytes"] for x in runs) / span
                result["latency"][name][str(n)] = {"p50": _percentile(lat, 0.5), "p99": _percentile(lat, 0.99),
                                                   "gets": len(lat)}
            if name == "shared" or not per_rank:
                step("T0: one-chunk hits end to end")
                workers.ask([0], [("connect", *(per_rank[0] if per_rank else shared))])
                workers.ask([0], [("fill", [f"{prefix}:hit{i}" for i in range(8)], chunk_bytes)])
                t0 = workers.ask([0], [("hit", [f"{prefix}:hit0"], chunk_bytes, t0_repeats)])[0]
                result["t0"] = statistics.median(t0)
                result["t0_samples"] = t0
                result["hits"] = {}
                for m in HIT_CHUNKS:
                    hit = [f"{prefix}:hit{i % 8}" for i in range(m)]
                    xs = workers.ask([0], [("hit", hit, chunk_bytes, 3)])[0]
                    result["hits"][str(m)] = statistics.median(xs)
        return result
    finally:
        if workers is not None:
            workers.close()
        if source == "url":  # a user's servers keep nothing of ours, whatever happened
            step("removing the measurement's keys")
            for host, port, pw in {tuple(e) for e in endpoints}:
                _delete_prefix(host, port, pw, prefix)
        if owned is not None:
            owned.stop()


def _delete_prefix(host: str, port: int, password: str | None, prefix: str) -> None:
    """DEL every key this measurement wrote on a user's server (best effort, bounded)."""
    try:
        reply = _resp(host, port, password, "KEYS", f"{prefix}*")
        names = [line.decode() for line in reply.split(b"\r\n") if line and line[:1] not in b"*$"]
        if names:
            _resp(host, port, password, "DEL", *names)
    except OSError:
        pass
