"""Store-client exploration: generic properties of a `RankStore` client, checked against an oracle.

`probe(factory, n_ranks, **options) -> list[Finding]` runs every check below against fresh stores of
`factory` (real servers, real client) and returns one `Finding` per violated check, each with the
ops that ran, what each returned (or that it did not return within `op_timeout`), and timings.
The checks know nothing about LMCache's code; they are what any KV store client owes its caller:

- `miss-prompt`      a read of a key never written answers None (a miss), within `op_timeout`, on
                     every read path (`get`, `get_async`, `get_batch`, any other value read in `paths`);
- `round-trip`       `put(k, v)` then `get(k)` gives `v` exactly, for lengths 0, 1, 7, 100, 1000, max;
- `async-completes`  `get_async(k)` of a written key resolves to its value within `op_timeout`;
- `read-paths-agree` a key written through `put` reads back the same through every read path;
- `contains-get`     `contains` agrees with `get` (written key: True + value; unwritten: False + None);
- `delete-miss`      after `delete(k)`, `get(k)` is a prompt None and `contains(k)` is False;
- `overwrite`        `put(k, v1); put(k, v2)` then `get(k)` gives `v2`;
- `rank-isolation`   each rank reads back its own value for a key every rank wrote (the contract:
                     every rank has its own store);
- `usable-after`     after a burst of misses (more than the client has workers), a fresh
                     `put`/`get` on the same client still round-trips within `op_timeout`;
- `auth-round-trip`  against servers that require a password (`password=` option), the client
                     connects and round-trips.

A timed-out call counts as a violation of the check that made it, and the stores are then closed
and made anew (the harness's recovery), so one hang does not mask the next check.

`python -m adapters.probe [--client NAME ...] [--json]` runs the matrix clients x topologies x MLA.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from model.calls import wait_future
from model.contract import StoreCallTimeout, declared_paths
from model.history import VALUE_READS
from runtime.bounded import call_bounded
from runtime.registry import resolve_client

__all__ = ["CHECKS", "LENGTHS", "TIMEOUT", "Op", "Finding", "check_miss_prompt", "check_round_trip",
           "check_async_completes", "check_read_paths_agree", "check_contains_get", "check_delete_miss",
           "check_overwrite", "check_rank_isolation", "check_usable_after", "CHECK_FUNCS", "probe",
           "AUTH_PASSWORD", "measure_hang", "CLIENTS", "load_factory", "probe_matrix", "main"]

CHECKS = ("miss-prompt", "round-trip", "async-completes", "read-paths-agree", "contains-get",
          "delete-miss", "overwrite", "rank-isolation", "usable-after", "auth-round-trip")
LENGTHS = (0, 1, 7, 100, 1000, 4088)
TIMEOUT = object()


@dataclass
class Op:
    rank: int
    op: str
    key: str | list[str]
    value: bytes | None = None          # put's argument
    expected: Any = None                # the oracle's answer
    observed: Any = None                # the client's answer (TIMEOUT when it did not return)
    outcome: str = "ok"                 # ok | mismatch | timeout | error
    seconds: float = 0.0

    def to_json(self) -> dict:
        def enc(v: Any) -> Any:
            if v is TIMEOUT:
                return {"$timeout": True}
            if isinstance(v, (bytes, bytearray)):
                return {"$bytes_len": len(v), "$hex_head": bytes(v[:16]).hex()}
            if isinstance(v, list):
                return [enc(x) for x in v]
            return v
        d = {"rank": self.rank, "op": self.op, "key": self.key, "expected": enc(self.expected),
             "observed": enc(self.observed), "outcome": self.outcome, "seconds": round(self.seconds, 4)}
        if self.value is not None:
            d["value"] = enc(self.value)
        return d


@dataclass
class Finding:
    client: str
    topology: str
    use_mla: bool
    check: str
    summary: str
    ops: list[Op] = field(default_factory=list)
    op_timeout: float = 0.0
    n_ranks: int = 2
    server_keys: dict = field(default_factory=dict)   # rank -> keys on its server after the check

    @property
    def violating(self) -> Op | None:
        return next((o for o in self.ops if o.outcome != "ok"), None)

    def to_json(self) -> dict:
        d = asdict(self)
        d["ops"] = [o.to_json() for o in self.ops]
        return d

    def __str__(self) -> str:
        return (f"[{self.client} {self.topology} {'MLA' if self.use_mla else 'non-MLA'}] "
                f"{self.check}: {self.summary}")


class _Violation(Exception):
    def __init__(self, summary: str) -> None:
        super().__init__(summary)
        self.summary = summary


def _short(v: Any) -> str:
    if v is TIMEOUT:
        return "no answer"
    if isinstance(v, (bytes, bytearray)):
        head = bytes(v[:8]).hex()
        return f"{len(v)} bytes ({head}{'...' if len(v) > 8 else ''})"
    if isinstance(v, list):
        return "[" + ", ".join(_short(x) for x in v) + "]"
    return repr(v)


class _Run:
    """One check's run: calls stores with timing, records ops, compares with the oracle."""

    def __init__(self, stores: Sequence[Any], op_timeout: float) -> None:
        self.stores = stores
        self.timeout = op_timeout
        self.ops: list[Op] = []
        self.timed_out = False
        self.soft: list[str] = []   # violations recorded without stopping the check

    def soft_call(self, *args: Any, **kwargs: Any) -> Any:
        """Like `call`, but a violation is recorded and the check goes on (to see every path)."""
        try:
            return self.call(*args, **kwargs)
        except _Violation as v:
            self.soft.append(v.summary)
            return None

    def finish(self) -> None:
        if self.soft:
            raise _Violation("; ".join(self.soft))

    def call(self, rank: int, op: str, key: Any, *args: Any, expected: Any = None,
             compare: bool = True, value: bytes | None = None,
             within: float | None = None) -> Any:
        rec = Op(rank, op, key, value=value, expected=expected)
        self.ops.append(rec)
        store = self.stores[rank]
        t0 = time.monotonic()
        try:
            # every call bounded (`runtime.bounded`): a client that blocks is a finding, not a stuck probe
            if op == "get_async":
                fut = call_bounded(self.timeout, op, str(key), store.get_async, key)
                got = wait_future(fut, self.timeout, "get_async", str(key))
            else:
                got = call_bounded(self.timeout, op, str(key), getattr(store, op), key, *args)
        except StoreCallTimeout as e:
            rec.seconds = time.monotonic() - t0
            rec.observed, rec.outcome = TIMEOUT, "timeout"
            self.timed_out = True
            raise _Violation(f"rank {rank}: {op}({key!r}) did not return within {e.seconds:g} s"
                             + (f" (expected {_short(expected)})" if compare else "")) from None
        except Exception as e:
            rec.seconds = time.monotonic() - t0
            rec.observed, rec.outcome = f"{type(e).__name__}: {e}", "error"
            raise _Violation(f"rank {rank}: {op}({key!r}) raised {type(e).__name__}: {e}") from None
        rec.seconds = time.monotonic() - t0
        rec.observed = got
        if compare and got != expected:
            rec.outcome = "mismatch"
            raise _Violation(f"rank {rank}: {op}({key!r}) returned {_short(got)}, expected "
                             f"{_short(expected)}")
        if within is not None and rec.seconds > within:
            rec.outcome = "slow"
            raise _Violation(f"rank {rank}: {op}({key!r}) took {rec.seconds:.3f} s (bound {within:g} s)")
        return got

    def put(self, rank: int, key: str, value: bytes) -> None:
        self.call(rank, "put", key, value, value=value, compare=False)


def _value(tag: str, n: int) -> bytes:
    seed = (tag.encode() * (n // max(1, len(tag)) + 1))[:n]
    return bytes((b + i) % 256 for i, b in enumerate(seed))


def _read_paths(store: Any) -> list[str]:
    """The declared paths that answer values (`model.history.VALUE_READS`): the probe compares bytes."""
    return [p for p in declared_paths(store) if p in VALUE_READS and callable(getattr(store, p, None))]


def _read_one(run: _Run, rank: int, path: str, key: str, expected: bytes | None) -> None:
    """Read `key` through `path` and compare with `expected` (list-shaped paths take [key]).
    Every read path is tried (a violation is recorded and the next path still runs)."""
    if path == "get_batch":
        run.soft_call(rank, path, [key], expected=[expected])
    elif path == "get_prefix":
        run.soft_call(rank, path, [key], expected=[] if expected is None else [expected])
    else:
        run.soft_call(rank, path, key, expected=expected)


# --------------------------------------------------------------------------- the checks

def check_miss_prompt(run: _Run, tag: str) -> None:
    for rank, store in enumerate(run.stores):
        for path in _read_paths(store):
            _read_one(run, rank, path, f"{tag}:never-written:{path}:r{rank}", None)
    run.finish()


def check_round_trip(run: _Run, tag: str) -> None:
    for rank in range(len(run.stores)):
        for n in LENGTHS:
            key, v = f"{tag}:len{n}:r{rank}", _value(f"{tag}{rank}", n)
            run.put(rank, key, v)
            run.call(rank, "get", key, expected=v)


def check_async_completes(run: _Run, tag: str) -> None:
    for rank in range(len(run.stores)):
        key, v = f"{tag}:async:r{rank}", _value(f"a{rank}", 64)
        run.put(rank, key, v)
        run.call(rank, "get_async", key, expected=v)


def check_read_paths_agree(run: _Run, tag: str) -> None:
    for rank, store in enumerate(run.stores):
        key, v = f"{tag}:paths:r{rank}", _value(f"p{rank}", 333)
        run.put(rank, key, v)
        for path in _read_paths(store):
            _read_one(run, rank, path, key, v)
    run.finish()


def check_contains_get(run: _Run, tag: str) -> None:
    for rank in range(len(run.stores)):
        key, v = f"{tag}:c:r{rank}", _value(f"c{rank}", 50)
        run.put(rank, key, v)
        run.call(rank, "contains", key, expected=True)
        run.call(rank, "get", key, expected=v)
        miss = f"{tag}:c-miss:r{rank}"
        run.call(rank, "contains", miss, expected=False)
        run.call(rank, "get", miss, expected=None)


def check_delete_miss(run: _Run, tag: str) -> None:
    for rank in range(len(run.stores)):
        key, v = f"{tag}:d:r{rank}", _value(f"d{rank}", 80)
        run.put(rank, key, v)
        run.call(rank, "get", key, expected=v)
        run.call(rank, "delete", key, compare=False)
        run.call(rank, "contains", key, expected=False)
        run.call(rank, "get", key, expected=None)


def check_overwrite(run: _Run, tag: str) -> None:
    for rank in range(len(run.stores)):
        key = f"{tag}:o:r{rank}"
        v1, v2 = _value(f"first{rank}", 40), _value(f"second{rank}", 41)
        run.put(rank, key, v1)
        run.put(rank, key, v2)
        run.call(rank, "get", key, expected=v2)


def check_rank_isolation(run: _Run, tag: str) -> None:
    key = f"{tag}:shared-name"
    values = [_value(f"rank{r}", 60 + r) for r in range(len(run.stores))]
    for rank, v in enumerate(values):
        run.put(rank, key, v)
    for rank, v in enumerate(values):
        for path in _read_paths(run.stores[rank]):
            _read_one(run, rank, path, key, v)
    run.finish()


def check_usable_after(run: _Run, tag: str) -> None:
    for rank, store in enumerate(run.stores):
        burst = int(getattr(store, "num_workers", 8)) + 1
        # fire the misses without waiting for them (async), then expect the client to still work
        rec = Op(rank, "get_async*", [f"{tag}:burst{i}:r{rank}" for i in range(burst)], expected=None,
                 observed="not awaited")
        run.ops.append(rec)
        futures = [store.get_async(k) for k in rec.key]
        try:
            cf.wait(futures, timeout=run.timeout)
            key, v = f"{tag}:after-burst:r{rank}", _value(f"u{rank}", 90)
            run.put(rank, key, v)
            run.call(rank, "get", key, expected=v)
        finally:
            for f in futures:
                f.cancel()


CHECK_FUNCS: dict[str, Callable[[_Run, str], None]] = {
    "miss-prompt": check_miss_prompt, "round-trip": check_round_trip,
    "async-completes": check_async_completes, "read-paths-agree": check_read_paths_agree,
    "contains-get": check_contains_get, "delete-miss": check_delete_miss, "overwrite": check_overwrite,
    "rank-isolation": check_rank_isolation, "usable-after": check_usable_after,
}


# --------------------------------------------------------------------------- driver

def _server_keys(stores: Sequence[Any]) -> dict:
    """Which key names each rank's server holds (evidence of what a client actually wrote)."""
    out: dict = {}
    for rank, st in enumerate(stores):
        fn = getattr(st, "server_keys", None)
        if callable(fn):
            try:
                out[str(rank)] = sorted(fn())
            except Exception as e:  # diagnostics only
                out[str(rank)] = f"unavailable: {type(e).__name__}"
    return out


def probe(factory: Callable[..., list], n_ranks: int = 2, *, client: str | None = None,
          topology: str = "per-rank", use_mla: bool = True, op_timeout: float = 0.5,
          checks: Sequence[str] = CHECKS, **options: Any) -> list[Finding]:
    """Run `checks` against `factory(n_ranks, topology=..., use_mla=..., op_timeout=...)`."""
    client = client or getattr(factory, "__name__", str(factory))
    opts = dict(topology=topology, use_mla=use_mla, op_timeout=op_timeout, **options)
    findings: list[Finding] = []
    stores: list | None = None
    try:
        for i, name in enumerate(checks):
            if name == "auth-round-trip":
                if "urls" in options:
                    continue  # given servers: their password is theirs
                f = _check_auth(factory, n_ranks, client, opts, f"p{i}")
                if f is not None:
                    findings.append(f)
                continue
            if stores is None:
                stores = factory(n_ranks, **opts)
            run = _Run(stores, op_timeout)
            try:
                CHECK_FUNCS[name](run, f"p{int(time.time() * 1000) % 10**8}-{i}-{name}")
            except _Violation as v:
                findings.append(Finding(client, topology, use_mla, name, v.summary, run.ops,
                                        op_timeout, n_ranks, _server_keys(stores)))
            if run.timed_out or name == "usable-after":
                # the harness's recovery after a hang: close (never blocks) and start anew
                for s in stores:
                    s.close()
                stores = None
    finally:
        if stores is not None:
            for s in stores:
                s.close()
    return findings


AUTH_PASSWORD = "shardcheck-probe-pw"


def _check_auth(factory: Callable[..., list], n_ranks: int, client: str, opts: dict,
                tag: str) -> Finding | None:
    rec = Op(-1, "factory", f"password={AUTH_PASSWORD!r}", expected="stores")
    t0 = time.monotonic()
    try:
        stores = factory(n_ranks, **{**opts, "password": AUTH_PASSWORD})
    except Exception as e:
        rec.seconds, rec.observed, rec.outcome = time.monotonic() - t0, f"{type(e).__name__}: {e}", "error"
        return Finding(client, opts["topology"], opts["use_mla"], "auth-round-trip",
                       f"factory(password=...) raised {type(e).__name__}: {e}", [rec],
                       opts["op_timeout"], n_ranks)
    rec.seconds, rec.observed = time.monotonic() - t0, "stores"
    run = _Run(stores, opts["op_timeout"])
    run.ops.append(rec)
    try:
        for rank in range(n_ranks):
            # rank 0 only: what is asked here is authentication, not the MLA behaviour
            if rank > 0:
                break
            key, v = f"{tag}:auth:r{rank}", _value("auth", 20)
            run.put(rank, key, v)
            run.call(rank, "get", key, expected=v)
    except _Violation as v:
        return Finding(client, opts["topology"], opts["use_mla"], "auth-round-trip", v.summary,
                       run.ops, opts["op_timeout"], n_ranks)
    finally:
        for s in stores:
            s.close()
    return None


def measure_hang(factory: Callable[..., list], *, op: str = "get", patience: float = 15.0,
                 **options: Any) -> dict:
    """How long `op` of a never-written key takes to come back at all (LMCache's own bounds)."""
    stores = factory(1, **{**options, "op_timeout": patience})
    try:
        t0 = time.monotonic()
        try:
            if op == "get_async":
                got = stores[0].get_async("never-written").result(patience)
            else:
                got = getattr(stores[0], op)("never-written")
            out = {"op": op, "returned": _short(got), "seconds": round(time.monotonic() - t0, 3)}
        except (StoreCallTimeout, cf.TimeoutError):
            out = {"op": op, "returned": f"nothing within {patience:g} s", "seconds": patience}
    finally:
        for s in stores:
            s.close()
    return out


#: The real clients the probe matrix runs.
CLIENTS = ("lmcache", "lmcache-native", "lmcache-valkey", "lmcache-patched")


def load_factory(name: str) -> Callable[..., list]:
    """`factory(n_ranks, **options)` of the client `name` (`runtime.registry`), validating what it returns."""
    client = resolve_client(name)
    return lambda n_ranks, **options: client.stores(n_ranks, **options)


def probe_matrix(clients: Sequence[str] = tuple(CLIENTS), topologies: Sequence[str] = ("per-rank", "shared"),
                 mlas: Sequence[bool] = (True, False), *, op_timeout: float = 0.5,
                 n_ranks: int = 2, progress: Callable[[str], None] | None = None) -> dict:
    out: dict = {"op_timeout": op_timeout, "n_ranks": n_ranks, "runs": []}
    for c in clients:
        fac = load_factory(c)
        for topo in topologies:
            for mla in mlas:
                t0 = time.monotonic()
                fs = probe(fac, n_ranks, client=c, topology=topo, use_mla=mla, op_timeout=op_timeout)
                row = {"client": c, "topology": topo, "use_mla": mla,
                       "seconds": round(time.monotonic() - t0, 2),
                       "violated": [f.check for f in fs], "findings": [f.to_json() for f in fs]}
                out["runs"].append(row)
                if progress:
                    progress(f"{c:16} {topo:9} {'MLA' if mla else 'non-MLA':8} {row['seconds']:6.2f}s  "
                             f"violated: {', '.join(row['violated']) or '-'}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m adapters.probe", description=__doc__.splitlines()[0])
    ap.add_argument("--client", action="append", help="client name or MOD:ATTR (repeatable; default all)")
    ap.add_argument("--topology", action="append", choices=("per-rank", "shared"))
    ap.add_argument("--mla", action="append", choices=("mla", "non-mla"))
    ap.add_argument("--op-timeout", type=float, default=0.5)
    ap.add_argument("--json", metavar="PATH", help="write the full findings as JSON here")
    a = ap.parse_args(argv)
    res = probe_matrix(a.client or tuple(CLIENTS), a.topology or ("per-rank", "shared"),
                       [m == "mla" for m in (a.mla or ("mla", "non-mla"))], op_timeout=a.op_timeout,
                       progress=lambda s: print(s, flush=True))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    for row in res["runs"]:
        for fd in row["findings"]:
            print(f"- [{row['client']} {row['topology']} {'MLA' if row['use_mla'] else 'non-MLA'}] "
                  f"{fd['check']}: {fd['summary']}")
    return 1 if any(r["violated"] for r in res["runs"]) else 0


if __name__ == "__main__":
    sys.exit(main())
