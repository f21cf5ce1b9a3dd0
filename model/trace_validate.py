"""Validating the op-carrying kinds of trace (`store-ops`, `concurrent`) and their shared fields: a trace that
cannot have shown what it records (no ops, a wrong type in any field, a rate that is not a rate, a thread count
that disagrees with its ops) raises `TraceError` naming the file and the field. `model.trace` validates the rest.
"""
from __future__ import annotations

import base64
import binascii
from typing import Any

from model.codec import TraceError
from model.history import MULTI_KEY_READS, READ_PATHS, SINGLE_KEY_READS, WRITE_PATHS

__all__ = ["TraceError", "need", "validate_store_ops", "validate_concurrent", "validate_rate", "rate_problem",
           "STORE_OPS",
           "MAX_RANKS", "MAX_OPS", "MAX_PAD", "MAX_AGE"]

#: Caps on what a trace may claim: a hand-edited or hostile file must not make a replay run for minutes.
MAX_RANKS, MAX_OPS = 64, 100_000
#: The most filler bytes a concurrent put may ask for, and the longest a store-ops `age` op may wait (seconds).
MAX_PAD, MAX_AGE = 1 << 20, 3600.0
#: The ops of a store-ops trace: a client's writes, every read path, the server's own eviction of a key (`evict`),
#: and `age` (wait, so that what was put grows old).
STORE_OPS = ("put", "delete") + READ_PATHS + ("evict", "age")
_STORE_OP_FIELDS = {"rank", "op", "key", "keys", "value", "wait", "client", "seconds", "result", "oracle", "outcome",
                    "index", "fault", "recovered"}
#: A store-ops trace's real-server fault (`{"op": "fault", "fault": FIELD, "rank", "seconds"}`) and its recovery.
FAULT_OPS = ("fault", "recover")
_CONCURRENT_OP_FIELDS = {"thread", "path", "keys", "pad", "client"}
#: The paths of a concurrent trace's ops: every read and write path, and the server's own eviction (`evict`).
CONCURRENT_PATHS = READ_PATHS + WRITE_PATHS + ("evict",)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and v == v and v not in (float("inf"), -float("inf"))


def need(data: dict, name: str, typ: type, path: Any) -> None:
    """`data[name]` exists and is a `typ` (an int is never a bool)."""
    if name not in data:
        raise TraceError(path, name, "missing")
    if not isinstance(data[name], typ) or (typ is int and isinstance(data[name], bool)):
        raise TraceError(path, name, f"expected {typ.__name__}, got {type(data[name]).__name__}")


def _int_in(v: Any, lo: int, hi: int | None, path: Any, field: str) -> int:
    if not _is_int(v) or v < lo or (hi is not None and v > hi):
        shown = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise TraceError(path, field, f"expected an integer {shown}, got {v!r}")
    return v


def _positive(cfg: dict, name: str, path: Any) -> None:
    if name in cfg and not (_is_number(cfg[name]) and cfg[name] > 0):
        raise TraceError(path, f"config.{name}", f"expected a positive number of seconds, got {cfg[name]!r}")


def rate_problem(rate: Any) -> tuple[str, str] | None:
    """What is wrong with a measured rate (`model.finding.Rate`'s JSON: `{"k", "n", "seeds"?, "deterministic"?,
    "load1"?, "cores"?}` with integers 0 < k <= n, integer seeds, deterministic true only when k == n, the 1-minute
    load average when it was measured a number >= 0, the machine's cores an integer >= 1; a rate saved before rates
    carried the load has neither): (the field under the rate, the problem), or None. The one rule, for traces and
    for `Rate.from_json`."""
    if not isinstance(rate, dict):
        return "", f"expected an object {{'k', 'n'}}, got {type(rate).__name__}"
    k, n = rate.get("k"), rate.get("n")
    if not _is_int(k) or not _is_int(n) or not 0 < k <= n:
        return "", f"expected integers with 0 < k <= n, got k={k!r}, n={n!r}"
    seeds = rate.get("seeds", [])
    if not isinstance(seeds, list) or not all(_is_int(s) for s in seeds):
        return ".seeds", f"expected a list of integers, got {seeds!r}"
    flag = rate.get("deterministic", False)
    if not isinstance(flag, bool) or (flag and k != n):
        return ".deterministic", f"must be true or false, and true only when k == n (got {flag!r})"
    load1, cores = rate.get("load1", 0.0), rate.get("cores", 1)
    if not _is_number(load1) or load1 < 0:
        return ".load1", f"expected the 1-minute load average, a number >= 0, got {load1!r}"
    if not _is_int(cores) or cores < 1:
        return ".cores", f"expected the machine's cores, an integer >= 1, got {cores!r}"
    unknown = set(rate) - {"k", "n", "seeds", "deterministic", "load1", "cores"}
    if unknown:
        return f".{sorted(unknown)[0]}", "unknown field"
    return None


def validate_rate(rate: Any, path: Any, field: str = "config.rate") -> None:
    """A measured rate (`rate_problem`), or `TraceError` naming the field."""
    problem = rate_problem(rate)
    if problem is not None:
        raise TraceError(path, field + problem[0], problem[1])


def _keys(op: dict, path: Any, f: str, *, multi: bool) -> None:
    if multi:
        keys = op.get("keys")
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):  # (an empty batch is a call too)
            raise TraceError(path, f"{f}.keys", f"expected a list of strings, got {keys!r}")
    elif not isinstance(op.get("key"), str):
        raise TraceError(path, f"{f}.key", f"expected a string, got {op.get('key')!r}")


def _value(v: Any, path: Any, f: str) -> None:
    """A put's value: `{"$bytes": base64}` or a list of byte values."""
    if isinstance(v, dict) and set(v) == {"$bytes"} and isinstance(v["$bytes"], str):
        try:
            base64.b64decode(v["$bytes"], validate=True)
            return
        except (binascii.Error, ValueError):
            pass
    elif isinstance(v, list) and all(_is_int(b) and 0 <= b <= 255 for b in v):
        return
    raise TraceError(path, f, f"expected {{'$bytes': base64}} or a list of byte values, got {str(v)[:60]}")


def _factory_failed(data: dict) -> bool:
    """Whether the recorded violation is a store-error of building the client (no op is needed to show it)."""
    vs = data["verdict"].get("violations")
    return data.get("property") == "store-error" and isinstance(vs, list) and bool(vs) and isinstance(vs[0], dict) \
        and isinstance(vs[0].get("detail"), dict) and vs[0]["detail"].get("index") == -1


def validate_store_ops(data: dict, path: Any) -> None:
    """A store-ops trace: `config.n_ranks`, and ops `{"rank", "op", "key" | "keys", "value"?, "wait"?, "client"?,
    "seconds"?}` (plus what a run recorded: `result`, `oracle`, `outcome`, `index`)."""
    need(data, "ops", list, path)
    cfg, ops = data["config"], data["ops"]
    if len(ops) > MAX_OPS:
        raise TraceError(path, "ops", f"{len(ops):,} ops; a trace holds at most {MAX_OPS:,}")
    if not ops and not _factory_failed(data):
        raise TraceError(path, "ops", "no ops: a store-ops trace shows its violation in its ops (only a store-error "
                         "of building the client needs none)")
    n = _int_in(cfg.get("n_ranks", 1), 1, MAX_RANKS, path, "config.n_ranks")
    clients = _int_in(cfg.get("clients", 1), 1, 16, path, "config.clients")
    _positive(cfg, "op_timeout", path)
    if "rate" in cfg:
        validate_rate(cfg["rate"], path)
    for i, op in enumerate(ops):
        f = f"ops[{i}]"
        if not isinstance(op, dict):
            raise TraceError(path, f, f"expected an object, got {type(op).__name__}")
        unknown = set(op) - _STORE_OP_FIELDS
        if unknown:
            raise TraceError(path, f"{f}.{sorted(unknown)[0]}", "unknown field")
        name = op.get("op")
        if name in FAULT_OPS:
            _fault_op(op, n, path, f)
            continue
        if name not in STORE_OPS:
            raise TraceError(path, f"{f}.op", f"expected one of {', '.join(STORE_OPS + FAULT_OPS)}, got {name!r}")
        if name == "age":  # (no rank, no key)
            if not (_is_number(op.get("seconds")) and 0 < op["seconds"] <= MAX_AGE):
                raise TraceError(path, f"{f}.seconds", f"expected seconds in (0, {MAX_AGE:g}], got {op.get('seconds')!r}")
            continue
        _int_in(op.get("rank"), 0, n - 1, path, f"{f}.rank")
        if "client" in op:
            _int_in(op["client"], 0, clients - 1, path, f"{f}.client")
        _keys(op, path, f, multi=name in MULTI_KEY_READS)
        if name == "put":
            if "value" not in op:
                raise TraceError(path, f"{f}.value", "missing (a put writes a value)")
            _value(op["value"], path, f"{f}.value")
        if "wait" in op and (name != "get_async" or not isinstance(op["wait"], bool)):
            raise TraceError(path, f"{f}.wait", "expected true or false, on a get_async only")
        if "seconds" in op and not (_is_number(op["seconds"]) and op["seconds"] >= 0):
            raise TraceError(path, f"{f}.seconds", f"expected a number of seconds >= 0, got {op['seconds']!r}")


def _fault_op(op: dict, n_ranks: int, path: Any, field: str) -> None:
    """A real-server fault op, validated by its kind's codec (`model.faults`), or a `recover` op."""
    from model.faults import kind_of
    if op["op"] == "recover":
        return
    try:
        kind = kind_of(str(op.get("fault")))
    except KeyError:
        raise TraceError(path, f"{field}.fault", f"unknown fault kind {op.get('fault')!r}") from None
    if kind.family != "server":
        raise TraceError(path, f"{field}.fault", f"{kind.field} is not a real-server fault")
    try:
        fault = kind.from_json({"rank": op.get("rank"), "at": "op", "seconds": op.get("seconds", 0.0)})
    except ValueError as exc:
        raise TraceError(path, field, str(exc)) from None
    if not 0 <= fault.rank < n_ranks:
        raise TraceError(path, f"{field}.rank", f"rank {fault.rank} is not one of the {n_ranks} ranks")


def validate_concurrent(data: dict, path: Any) -> None:
    """A concurrent trace: ops `{"thread", "path", "keys", "pad"?, "client"?}`, `config.threads` the number of
    caller threads the ops name (0..threads-1), `config.rate` a measured rate, `config.bound` seconds."""
    need(data, "ops", list, path)
    cfg, ops = data["config"], data["ops"]
    if not ops:
        raise TraceError(path, "ops", "no ops: a concurrent trace shows its violation in the ops it runs")
    if len(ops) > MAX_OPS:
        raise TraceError(path, "ops", f"{len(ops):,} ops; a trace holds at most {MAX_OPS:,}")
    clients = _int_in(cfg.get("clients", 1), 1, 16, path, "config.clients")
    threads = set()
    for i, op in enumerate(ops):
        f = f"ops[{i}]"
        if not isinstance(op, dict):
            raise TraceError(path, f, f"expected an object, got {type(op).__name__}")
        unknown = set(op) - _CONCURRENT_OP_FIELDS
        if unknown:
            raise TraceError(path, f"{f}.{sorted(unknown)[0]}", "unknown field")
        threads.add(_int_in(op.get("thread"), 0, MAX_OPS, path, f"{f}.thread"))
        if op.get("path") not in CONCURRENT_PATHS:
            raise TraceError(path, f"{f}.path", f"unknown path {op.get('path')!r} (known: "
                             f"{', '.join(CONCURRENT_PATHS)})")
        _keys(op, path, f, multi=True)
        if op["path"] not in MULTI_KEY_READS and len(op["keys"]) != 1:
            single = "a write" if op["path"] in WRITE_PATHS + ("evict",) else "a read of one key" if op["path"] in SINGLE_KEY_READS \
                else "this path"
            raise TraceError(path, f"{f}.keys", f"{single} names exactly one key, got {len(op['keys'])}")
        if "pad" in op:
            _int_in(op["pad"], 0, MAX_PAD, path, f"{f}.pad")
        if "client" in op:
            _int_in(op["client"], 0, clients - 1, path, f"{f}.client")
    count = cfg.get("threads")
    if not _is_int(count) or count < 1:
        raise TraceError(path, "config.threads", f"expected a positive integer, got {count!r}")
    if threads != set(range(count)):
        raise TraceError(path, "config.threads", f"{count} thread(s), but the ops name thread(s) {sorted(threads)}")
    if cfg.get("n_ranks", 1) != 1:
        raise TraceError(path, "config.n_ranks", f"a concurrent trace runs on one store, got {cfg.get('n_ranks')!r}")
    validate_rate(cfg.get("rate"), path)
    _positive(cfg, "bound", path)
    _positive(cfg, "op_timeout", path)
