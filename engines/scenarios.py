"""The store client's fixed scenarios: what any KV store client owes its caller, as store-ops sequences.

Every profile of `pytest properties/` (dev included) and `check`'s store layer run them before any random search, so
a client that fails one fails at once: a miss answers `None` promptly on every read path, bytes of every length
round-trip on every path, a delete invalidates every read path (no stale cache), an overwrite wins, each rank has its
own store, and the client still answers after a burst of unawaited missed reads. Each runs on fresh bounded stores
and a failure is a `store-ops` trace that `replay` re-runs on fresh stores.
"""
from __future__ import annotations

import itertools

import attrs

from engines.api import SearchContext
from engines.storeops import run_ops
from model.finding import Finding
from model.trace import Trace, violations_of
from runtime.bounded import BoundedStore
from runtime.registry import Client

__all__ = ["SCENARIOS", "TWO_RANKS", "scenario_ops", "run_scenarios", "LENGTHS", "Scenarios", "ScenarioCoverage"]

_runs = itertools.count()

#: Value lengths of the round trip (cut to the client's `max_value_bytes`).
LENGTHS = (0, 1, 7, 100, 1000, 4088)
SCENARIOS = ("miss-prompt", "round-trip", "delete-invalidates", "overwrite", "rank-isolation", "usable-after-misses")


def _value(tag: str, n: int) -> list[int]:
    seed = (tag.encode() * (n // max(1, len(tag)) + 1))[:n]
    return [(b + i) % 256 for i, b in enumerate(seed)]


def _reads(rank: int, key: str) -> list[dict]:
    """A key read through every read path the contract has (`get_batch` where the client offers it)."""
    return [{"rank": rank, "op": "get", "key": key}, {"rank": rank, "op": "get_async", "key": key},
            {"rank": rank, "op": "get_batch", "keys": [key]}, {"rank": rank, "op": "contains", "key": key}]


def scenario_ops(name: str, *, max_value: int | None = None, batch: bool = True) -> list[dict]:
    """The op sequence of scenario `name` over two ranks (`batch`: the client has a `get_batch` read path)."""
    def cut(n: int) -> int:
        return n if max_value is None else min(n, max_value)

    if name == "miss-prompt":
        ops = _reads(0, "sc:never-written")
    elif name == "round-trip":
        ops = []
        for n in dict.fromkeys(cut(n) for n in LENGTHS):
            ops += [{"rank": 0, "op": "put", "key": f"sc:len{n}", "value": _value("rt", n)}, *_reads(0, f"sc:len{n}")]
    elif name == "delete-invalidates":
        ops = [{"rank": 0, "op": "put", "key": "sc:del", "value": _value("del", cut(64))}, *_reads(0, "sc:del"),
               {"rank": 0, "op": "delete", "key": "sc:del"}, *_reads(0, "sc:del")]
    elif name == "overwrite":
        ops = [{"rank": 0, "op": "put", "key": "sc:ow", "value": _value("first", cut(64))}, *_reads(0, "sc:ow"),
               {"rank": 0, "op": "put", "key": "sc:ow", "value": _value("second", cut(80))}, *_reads(0, "sc:ow")]
    elif name == "rank-isolation":
        ops = [{"rank": 0, "op": "put", "key": "sc:iso", "value": _value("rank0", cut(48))},
               {"rank": 1, "op": "put", "key": "sc:iso", "value": _value("rank1", cut(56))},
               *_reads(0, "sc:iso"), *_reads(1, "sc:iso")]
    elif name == "usable-after-misses":
        ops = [{"rank": 0, "op": "get_async", "key": f"sc:miss{i}", "wait": False} for i in range(16)]
        ops += [{"rank": 0, "op": "put", "key": "sc:after", "value": _value("after", cut(32))}, *_reads(0, "sc:after")]
    else:
        raise ValueError(f"unknown scenario {name!r} (known: {', '.join(SCENARIOS)})")
    return [op for op in ops if batch or op["op"] != "get_batch"]


def run_scenarios(client: Client, *, op_timeout: float, names: tuple[str, ...] = SCENARIOS,
                  options: dict | None = None, coverage: "ScenarioCoverage | None" = None,
                  n_ranks: int = 2, first_only: bool = False) -> list[Trace]:
    """Run every scenario on bounded stores of `client` (one set, made anew after a call hung, each scenario under
    its own keys; `options`: the factory's, besides `op_timeout`): the store-ops trace of each one that fails
    (`replay` re-runs it on fresh stores), or of the first one with `first_only`. With `n_ranks=1` the scenarios
    that need two ranks do not run."""
    cov = coverage if coverage is not None else ScenarioCoverage()
    stores: list = []
    found = []
    factory_options = {**client.accepted({"op_timeout": op_timeout}), **(options or {})}
    try:
        for name in names:
            if n_ranks < 2 and name in TWO_RANKS:
                cov.not_run.append(name)
                continue
            if not stores or any(s.broken for s in stores):
                for s in stores:
                    s.close()
                stores = [BoundedStore(s, op_timeout) for s in client.stores(n_ranks, **factory_options)]
            max_value = min((s.max_value_bytes or 1 << 30) for s in stores)
            batch = all(callable(getattr(s.inner, "get_batch", None)) for s in stores)
            ops = scenario_ops(name, max_value=max_value, batch=batch)
            tag = f"{name}:{next(_runs)}:"
            tagged = [{**op, **({"key": tag + op["key"]} if "key" in op else {"keys": [tag + k for k in op["keys"]]})}
                      for op in ops]
            _, violations = run_ops(stores, tagged, wait_bound=op_timeout)
            cov.scenarios.append(name)
            cov.ops += len(ops)
            if violations:
                v = violations[0]
                found.append(Trace(kind="store-ops", property=v.property, summary=f"scenario {name}: {v.summary}",
                                   protocol={"name": "-", "ref": None}, client=client.name,
                                   config={"n_ranks": n_ranks, "op_timeout": op_timeout}, ops=ops,
                                   verdict={"violations": [v.to_json()]},
                                   expect={client.name: "reproduces"}, origin=f"scenario:{name}"))
                if first_only:
                    break
    finally:
        for s in stores:
            s.close()
    return found


#: The scenarios that need two ranks' stores.
TWO_RANKS = ("rank-isolation",)


@attrs.define
class ScenarioCoverage:
    """The fixed scenarios that ran, their ops, and those that could not run."""

    scenarios: list[str] = attrs.field(factory=list)
    ops: int = 0
    not_run: list[str] = attrs.field(factory=list)

    def text(self) -> str:
        skipped = f" ({', '.join(self.not_run)} not run: it needs 2 ranks)" if self.not_run else ""
        return f"{len(self.scenarios)} of {len(SCENARIOS)} fixed scenarios, {self.ops:,} ops{skipped}"

    def to_json(self) -> dict:
        return attrs.asdict(self)


class Scenarios:
    """`check`'s first engine: the client's fixed scenarios (a client that fails one fails at once)."""

    name = "scenarios"

    def search(self, ctx: SearchContext) -> Finding | None:
        t = ctx.target
        failed = run_scenarios(t.client, op_timeout=ctx.op_timeout, options=dict(t.client_options),
                               coverage=ctx.coverage.of(self.name, ScenarioCoverage), n_ranks=t.rank_cap(2),
                               first_only=True)
        if not failed:
            return None
        trace = failed[0]
        return Finding(engine=f"scenario:{trace.origin.partition(':')[2]}", violations=violations_of(trace),
                       trace=trace)
