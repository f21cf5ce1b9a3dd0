"""The store client's fixed scenarios: what any KV store client owes its caller, as store-ops sequences.

Every profile of `pytest properties/` (dev included) and `check`'s store layer run them before any random search, so
a client that fails one fails at once: a miss answers `None` promptly on every read path, bytes of every length
round-trip on every path, a delete invalidates every read path (no stale cache), an overwrite wins, each rank has its
own store, a batch answers per key what a single read would (misses before and after hits), and the client still
answers after a burst of unawaited missed reads. A client that can share servers (its factory takes `urls`) also runs
the shared-tier scenarios on two clients of the same servers: what one client writes or deletes, and what the server
evicts, the other sees at once (no client-local cache that only its own writes update). Each runs on fresh bounded
stores and a failure is a `store-ops` trace that `replay` re-runs on fresh stores.
"""
from __future__ import annotations

import itertools
from typing import Any

import attrs

from checking.api import SearchContext
from checking.storeops import run_ops
from model.contract import declared_paths
from model.finding import Finding
from model.history import MULTI_KEY_READS, SINGLE_KEY_READS
from model.trace import Trace, violations_of
from runtime.bounded import BoundedStore
from runtime.registry import Client
from runtime.tier import NotShared, open_shared

__all__ = ["SCENARIOS", "SHARED_SCENARIOS", "TWO_RANKS", "scenario_ops", "shared_scenario_ops", "run_scenarios",
           "LENGTHS", "DEFAULT_READS", "Scenarios", "ScenarioCoverage"]

_runs = itertools.count()

#: Value lengths of the round trip (cut to the client's `max_value_bytes`).
LENGTHS = (0, 1, 7, 100, 1000, 4088)
SCENARIOS = ("miss-prompt", "round-trip", "delete-invalidates", "overwrite", "rank-isolation", "batch-misses",
             "usable-after-misses")
#: Scenarios of two clients of the same servers (`runtime.tier`): another engine's writes and evictions, and the
#: server's own, are seen at once.
SHARED_SCENARIOS = ("seen-by-another-client", "another-client-deletes", "another-client-overwrites", "server-evicts")


def _value(tag: str, n: int) -> list[int]:
    seed = (tag.encode() * (n // max(1, len(tag)) + 1))[:n]
    return [(b + i) % 256 for i, b in enumerate(seed)]


#: The read paths of the scenarios when the client's are not given.
DEFAULT_READS = ("get", "get_async", "get_batch", "contains")


def _reads(rank: int, key: str, paths: tuple[str, ...] = DEFAULT_READS) -> list[dict]:
    """A key read through every read path in `paths` (the client's declared ones, `get` first)."""
    return [{"rank": rank, "op": p, **({"key": key} if p in SINGLE_KEY_READS else {"keys": [key]})}
            for p in dict.fromkeys(("get", *paths))]


def scenario_ops(name: str, *, max_value: int | None = None, paths: tuple[str, ...] = DEFAULT_READS) -> list[dict]:
    """The op sequence of scenario `name` over two ranks, reading through every path of `paths`."""
    def cut(n: int) -> int:
        return n if max_value is None else min(n, max_value)

    if name == "miss-prompt":
        ops = _reads(0, "sc:never-written", paths)
    elif name == "round-trip":
        ops = []
        for n in dict.fromkeys(cut(n) for n in LENGTHS):
            ops += [{"rank": 0, "op": "put", "key": f"sc:len{n}", "value": _value("rt", n)}, *_reads(0, f"sc:len{n}", paths)]
    elif name == "delete-invalidates":
        ops = [{"rank": 0, "op": "put", "key": "sc:del", "value": _value("del", cut(64))}, *_reads(0, "sc:del", paths),
               {"rank": 0, "op": "delete", "key": "sc:del"}, *_reads(0, "sc:del", paths)]
    elif name == "overwrite":
        ops = [{"rank": 0, "op": "put", "key": "sc:ow", "value": _value("first", cut(64))}, *_reads(0, "sc:ow", paths),
               {"rank": 0, "op": "put", "key": "sc:ow", "value": _value("second", cut(80))}, *_reads(0, "sc:ow", paths)]
    elif name == "rank-isolation":
        ops = [{"rank": 0, "op": "put", "key": "sc:iso", "value": _value("rank0", cut(48))},
               {"rank": 1, "op": "put", "key": "sc:iso", "value": _value("rank1", cut(56))},
               *_reads(0, "sc:iso", paths), *_reads(1, "sc:iso", paths)]
    elif name == "batch-misses":  # a batch answers per key what a single read would, misses before and after hits
        ops = [{"rank": 0, "op": "put", "key": "sc:b1", "value": _value("b1", cut(24))},
               {"rank": 0, "op": "put", "key": "sc:b3", "value": _value("b3", cut(40))}]
        ops += [{"rank": 0, "op": p, "keys": ["sc:b0", "sc:b1", "sc:b2", "sc:b3", "sc:b4"]}
                for p in paths if p in MULTI_KEY_READS]
    elif name == "usable-after-misses":
        ops = [{"rank": 0, "op": "get_async", "key": f"sc:miss{i}", "wait": False} for i in range(16)]
        ops += [{"rank": 0, "op": "put", "key": "sc:after", "value": _value("after", cut(32))}, *_reads(0, "sc:after", paths)]
    else:
        raise ValueError(f"unknown scenario {name!r} (known: {', '.join(SCENARIOS)})")
    return ops


def shared_scenario_ops(name: str, *, max_value: int | None = None,
                        paths: tuple[str, ...] = DEFAULT_READS) -> list[dict]:
    """The op sequence of shared-tier scenario `name`: two clients (`client` 0 and 1) of the same two servers, and
    the server's own eviction (`evict`); client 0 reads every key first, so a client-local cache is filled."""
    def cut(n: int) -> int:
        return n if max_value is None else min(n, max_value)

    def reads(key: str, client: int) -> list[dict]:
        return [{**op, "client": client} if client else op for op in _reads(0, key, paths)]

    put = {"rank": 0, "op": "put", "key": "sc:sh", "value": _value("shared", cut(64))}
    if name == "seen-by-another-client":
        return [put, *reads("sc:sh", 1)]
    if name == "another-client-deletes":
        return [put, *reads("sc:sh", 0), {"rank": 0, "op": "delete", "key": "sc:sh", "client": 1}, *reads("sc:sh", 0)]
    if name == "another-client-overwrites":
        again = {"rank": 0, "op": "put", "key": "sc:sh", "value": _value("other", cut(72)), "client": 1}
        return [put, *reads("sc:sh", 0), again, *reads("sc:sh", 0)]
    if name == "server-evicts":
        return [put, *reads("sc:sh", 0), *reads("sc:sh", 1), {"rank": 0, "op": "evict", "key": "sc:sh"},
                *reads("sc:sh", 0), *reads("sc:sh", 1)]
    raise ValueError(f"unknown shared-tier scenario {name!r} (known: {', '.join(SHARED_SCENARIOS)})")


def _tagged(ops: list[dict], tag: str) -> list[dict]:
    """The ops under their own keys (`tag` + key): scenarios on one set of stores never see each other's keys."""
    return [{**op, **({"key": tag + op["key"]} if "key" in op else {"keys": [tag + k for k in op["keys"]]})}
            for op in ops]


def _trace(client: Client, name: str, ops: list[dict], v: Any, op_timeout: float, n_ranks: int,
           clients: int = 1) -> Trace:
    return Trace.of("store-ops", [v], summary=f"scenario {name}: {v.summary}", client=client.name,
                    config={"n_ranks": n_ranks, "op_timeout": op_timeout, **({"clients": clients} if clients > 1 else {})},
                    ops=ops, expect={client.name: "reproduces"}, origin=f"scenario:{name}")


def _remove(stores: list, ops: list[dict]) -> None:
    """Delete the keys `ops` put (bounded stores: a client that hung is not waited on), so that the scenarios leave
    nothing on a user's servers; best effort."""
    for rank, key in sorted({(op["rank"], op["key"]) for op in ops if op["op"] == "put"}):
        if stores[rank].broken:
            return
        try:
            stores[rank].delete(key)
        except Exception:  # noqa: BLE001 - cleaning up is best effort; the scenario's verdict is already taken
            return


def _common_paths(stores: list) -> tuple[str, ...]:
    return tuple(p for p in declared_paths(stores[0].inner) if all(p in s.paths for s in stores))


#: The scenarios that need two ranks' stores.
TWO_RANKS = ("rank-isolation",)


def run_scenarios(client: Client, *, op_timeout: float, names: tuple[str, ...] = SCENARIOS + SHARED_SCENARIOS,
                  options: dict | None = None, coverage: "ScenarioCoverage | None" = None,
                  n_ranks: int = 2, first_only: bool = False) -> list[Trace]:
    """Run every scenario on bounded stores of `client` (one set, made anew after a call hung, each scenario under
    its own keys; `options`: the factory's, besides `op_timeout`): the store-ops trace of each one that fails
    (`replay` re-runs it on fresh stores), or of the first one with `first_only`. With `n_ranks=1` the scenarios
    that need two ranks do not run. The shared-tier scenarios run on two clients of the same servers
    (`runtime.tier.open_shared`); when the client cannot share servers (or its servers cannot evict by themselves)
    the coverage says why they did not run."""
    cov = coverage if coverage is not None else ScenarioCoverage()
    stores: list = []
    found: list[Trace] = []
    factory_options = {**client.accepted({"op_timeout": op_timeout}), **(options or {})}
    try:
        for name in (n for n in names if n in SCENARIOS):
            if n_ranks < 2 and name in TWO_RANKS:
                cov.not_run.append(name)
                continue
            if not stores or any(s.broken for s in stores):
                for s in stores:
                    s.close()
                stores = [BoundedStore(s, op_timeout) for s in client.stores(n_ranks, **factory_options)]
            max_value = min((s.max_value_bytes or 1 << 30) for s in stores)
            ops = scenario_ops(name, max_value=max_value, paths=_common_paths(stores))
            tagged = _tagged(ops, f"{name}:{next(_runs)}:")
            _, violations = run_ops(stores, tagged, wait_bound=op_timeout)
            _remove(stores, tagged)
            cov.scenarios.append(name)
            cov.ops += len(ops)
            if violations:
                found.append(_trace(client, name, ops, violations[0], op_timeout, n_ranks))
                if first_only:
                    return found
    finally:
        for s in stores:
            s.close()
    shared_names = tuple(n for n in names if n in SHARED_SCENARIOS)
    if shared_names:
        found += _run_shared(client, shared_names, op_timeout, factory_options, cov, first_only)
    return found


def _run_shared(client: Client, names: tuple[str, ...], op_timeout: float, options: dict, cov: "ScenarioCoverage",
                first_only: bool) -> list[Trace]:
    """The shared-tier scenarios on two clients of the same servers (one rank each), made anew after a call hung."""
    found: list[Trace] = []
    shared = None
    try:
        for name in names:
            if shared is None or any(s.broken for stores in shared.clients for s in stores):
                if shared is not None:
                    shared.close()
                try:
                    shared = open_shared(client, 1, wrap=lambda s: BoundedStore(s, op_timeout), **options)
                except NotShared as exc:
                    cov.shared_not_run = str(exc)
                    return found
            if name == "server-evicts" and not shared.can_evict():
                cov.not_run.append(name)
                cov.shared_not_run = shared.evict_note
                continue
            every = [s for stores in shared.clients for s in stores]
            ops = shared_scenario_ops(name, max_value=min((s.max_value_bytes or 1 << 30) for s in every),
                                      paths=_common_paths(every))
            tagged = _tagged(ops, f"{name}:{next(_runs)}:")
            _, violations = run_ops(shared.clients[0], tagged, wait_bound=op_timeout, others=shared.clients[1:],
                                    evict=shared.evict)
            _remove(shared.clients[0], tagged)
            cov.scenarios.append(name)
            cov.ops += len(ops)
            cov.clients = shared.n_clients
            if violations:
                found.append(_trace(client, name, ops, violations[0], op_timeout, 1, clients=shared.n_clients))
                if first_only:
                    break
    finally:
        if shared is not None:
            shared.close()
    return found


@attrs.define
class ScenarioCoverage:
    """The fixed scenarios that ran, their ops, and those that could not run; the clients per server the
    shared-tier ones ran with (0: they did not run, `shared_not_run` says why)."""

    scenarios: list[str] = attrs.field(factory=list)
    ops: int = 0
    not_run: list[str] = attrs.field(factory=list)
    clients: int = 0
    shared_not_run: str = ""

    def text(self) -> str:
        total = len(SCENARIOS) + len(SHARED_SCENARIOS)
        skipped = f" ({', '.join(self.not_run)} not run)" if self.not_run else ""
        if self.clients:
            shared = f"; the shared-tier ones with {self.clients} clients per server"
        else:
            shared = f"; the shared-tier ones did not run: {self.shared_not_run or 'not asked'}"
        if self.clients and self.shared_not_run:
            shared += f" ({self.shared_not_run})"
        return f"{len(self.scenarios)} of {total} fixed scenarios, {self.ops:,} ops{skipped}{shared}"

    def to_json(self) -> dict:
        return attrs.asdict(self)


class Scenarios:
    """`check`'s first strategy: the client's fixed scenarios (a client that fails one fails at once)."""

    name = "scenarios"

    def search(self, ctx: SearchContext) -> Finding | None:
        t = ctx.target
        failed = run_scenarios(t.client, op_timeout=ctx.op_timeout, options=dict(t.client_options),
                               coverage=ctx.coverage.of(self.name, ScenarioCoverage), n_ranks=t.rank_cap(2),
                               first_only=True)
        if not failed:
            return None
        trace = failed[0]
        return Finding(strategy=f"scenario:{trace.origin.partition(':')[2]}", violations=violations_of(trace),
                       trace=trace)
