"""The store client's fixed scenarios: what any KV store client owes its caller, as store-ops sequences.

Every profile of `pytest properties/` (dev included) and `check`'s store layer run them before any random search, so
a client that fails one fails at once: a miss answers `None` promptly on every read path, bytes of every length
round-trip on every path, a delete invalidates every read path (no stale cache), an overwrite wins, each rank has its
own store, and the client still answers after a burst of unawaited missed reads. Each runs on fresh bounded stores
and a failure is a `store-ops` trace that `replay` re-runs on fresh stores.
"""
from __future__ import annotations

import itertools
from typing import Any

from engines.faulted import fault_op
from engines.storeops import run_ops
from model.faults import FAULT_OP_TIMEOUTS, SERVER_KINDS, FaultKind
from model.trace import Trace, encode
from runtime.bounded import BoundedStore
from runtime.registry import Client

__all__ = ["SCENARIOS", "scenario_ops", "run_scenarios", "LENGTHS", "nemesis_ops", "run_nemesis_scenarios",
           "fault_seconds"]

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


def run_scenarios(client: Client, *, op_timeout: float, names: tuple[str, ...] = SCENARIOS) -> list[Trace]:
    """Run every scenario on bounded stores of `client` (one set, made anew after a call hung, each scenario under
    its own keys): the store-ops trace of each one that fails (`replay` re-runs it on fresh stores)."""
    stores: list = []
    found = []
    try:
        for name in names:
            if not stores or any(s.broken for s in stores):
                for s in stores:
                    s.close()
                stores = [BoundedStore(s, op_timeout) for s in client.stores(2, op_timeout=op_timeout)]
            max_value = min((s.max_value_bytes or 1 << 30) for s in stores)
            batch = all(callable(getattr(s.inner, "get_batch", None)) for s in stores)
            ops = scenario_ops(name, max_value=max_value, batch=batch)
            tag = f"{name}:{next(_runs)}:"
            tagged = [{**op, **({"key": tag + op["key"]} if "key" in op else {"keys": [tag + k for k in op["keys"]]})}
                      for op in ops]
            _, violations = run_ops(stores, tagged, wait_bound=op_timeout)
            if violations:
                v = violations[0]
                found.append(Trace(kind="store-ops", property=v.property, summary=f"scenario {name}: {v.summary}",
                                   protocol={"name": "-", "ref": None}, client=client.name,
                                   config={"n_ranks": 2, "op_timeout": op_timeout}, ops=ops,
                                   verdict={"violations": [{"property": v.property, "summary": v.summary,
                                                            "detail": encode(v.detail)}]},
                                   expect={client.name: "reproduces"}, origin=f"scenario:{name}"))
    finally:
        for s in stores:
            s.close()
    return found


# -- through real faults on the servers (the nemesis) ------------------------------------------------------
def fault_seconds(kind: FaultKind, op_timeout: float) -> float:
    """How long `kind` lasts in a scenario: a lasting fault longer than one call's bound (`FAULT_OP_TIMEOUTS`), a
    restart's down time a tenth of it; 0 for the instantaneous ones."""
    default = next(kind.singles(1, 1)).seconds
    if not default:
        return 0.0
    return round(FAULT_OP_TIMEOUTS * op_timeout if default >= 1.0 else 0.2 * op_timeout, 3)


def nemesis_ops(kind: FaultKind, *, op_timeout: float, batch: bool = True, max_value: int | None = None) -> list[dict]:
    """Keys written (one deleted), `kind` struck on rank 0's server, every read path while it lasts, the recovery,
    and every path again after it, with a write and a delete (rank 1's server is never struck)."""
    def v(tag: str) -> list[int]:
        return _value(tag, 40 if max_value is None else min(40, max_value))

    reads = [{"rank": 0, "op": "get", "key": "sc:n0"}, {"rank": 0, "op": "get", "key": "sc:ndel"},
             {"rank": 0, "op": "contains", "key": "sc:n1"}, {"rank": 0, "op": "get_async", "key": "sc:n0"},
             {"rank": 0, "op": "get_batch", "keys": ["sc:n0", "sc:n1", "sc:ndel"]}]
    ops = [{"rank": 0, "op": "put", "key": "sc:n0", "value": v("n0")},
           {"rank": 0, "op": "put", "key": "sc:n1", "value": v("n1")},
           {"rank": 0, "op": "put", "key": "sc:ndel", "value": v("ndel")},
           {"rank": 0, "op": "delete", "key": "sc:ndel"},
           {"rank": 1, "op": "put", "key": "sc:other", "value": v("other")},
           fault_op(kind.field, 0, fault_seconds(kind, op_timeout)), *reads,
           {"rank": 1, "op": "get", "key": "sc:other"},
           {"op": "recover"}, *reads,
           {"rank": 0, "op": "put", "key": "sc:n2", "value": v("n2")}, {"rank": 0, "op": "get", "key": "sc:n2"},
           {"rank": 0, "op": "delete", "key": "sc:n0"}, {"rank": 0, "op": "get", "key": "sc:n0"}]
    return [op for op in ops if batch or op.get("op") != "get_batch"]


def run_nemesis_scenarios(client: Client, *, op_timeout: float, kinds: tuple[FaultKind, ...] = SERVER_KINDS,
                          control_for: Any, recovery_seconds: float | None = None,
                          should_stop: Any = lambda: False) -> list[Trace]:
    """`nemesis_ops` of every kind on fresh bounded stores of `client`, struck through `control_for(stores)` (a
    `ServerControl`, closed after each, or None: the kind is skipped); the store-ops trace of each that fails."""
    found = []
    for kind in kinds:
        if should_stop():
            break
        stores = [BoundedStore(s, op_timeout) for s in client.stores(2, op_timeout=op_timeout)]
        control = None
        try:
            control = control_for(stores, kind)
            if control is None:
                continue
            max_value = min((s.max_value_bytes or 1 << 30) for s in stores)
            batch = all(callable(getattr(s.inner, "get_batch", None)) for s in stores)
            ops = nemesis_ops(kind, op_timeout=op_timeout, batch=batch, max_value=max_value)
            tag = f"nemesis:{next(_runs)}:"
            tagged = [{**op, **({"key": tag + op["key"]} if "key" in op else
                                {"keys": [tag + k for k in op["keys"]]} if "keys" in op else {})} for op in ops]
            _, violations = run_ops(stores, tagged, wait_bound=op_timeout, control=control,
                                    recovery_seconds=recovery_seconds)
        finally:
            if control is not None:
                control.close()
            for s in stores:
                s.close()
        if violations:
            v = violations[0]
            config = {"n_ranks": 2, "op_timeout": op_timeout,
                      **({"recovery_seconds": recovery_seconds} if recovery_seconds is not None else {})}
            found.append(Trace(kind="store-ops", property=v.property, summary=f"{kind.field}: {v.summary}",
                               protocol={"name": "-", "ref": None}, client=client.name, config=config, ops=ops,
                               verdict={"violations": [{"property": v.property, "summary": v.summary,
                                                        "detail": encode(v.detail)}]},
                               expect={client.name: "reproduces"}, origin=f"nemesis:{kind.field}"))
    return found
