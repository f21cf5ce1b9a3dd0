"""Replay of `store-ops` traces: a sequence of store-client operations per rank, checked op by op against
an in-memory oracle. A client call that times out raises `StoreCallTimeout` (the bounding is the
caller's), which becomes the violation `store-hang`."""
from __future__ import annotations

import concurrent.futures
from typing import Any, Callable, Sequence

from model.contract import RankStore, StoreCallTimeout
from model.sim import Violation
from model.store import MemoryStore

#: The store-client properties an op sequence can violate.
STORE_PROPERTIES = ("store-hang", "store-roundtrip", "store-error")
OPS = ("put", "get", "contains", "delete", "get_async", "get_batch")


def _call(store: Any, op: dict, wait_bound: float) -> Any:
    name = op["op"]
    if name == "put":
        return store.put(op["key"], op["value"])
    if name in ("get", "contains", "delete"):
        return getattr(store, name)(op["key"])
    if name == "get_async":
        future = store.get_async(op["key"])
        try:
            return future.result(timeout=wait_bound)
        except concurrent.futures.TimeoutError:
            raise StoreCallTimeout("get_async", op["key"], wait_bound) from None
    if name == "get_batch":
        if not callable(getattr(store, "get_batch", None)):
            raise AttributeError("this client has no get_batch read path")
        return list(store.get_batch(list(op["keys"])))
    raise ValueError(f"unknown op {name!r} (known: {', '.join(OPS)})")


def run_ops(stores: Sequence[RankStore], ops: Sequence[dict], *, wait_bound: float = 5.0,
            clock: Any = None) -> tuple[list[dict], list[Violation]]:
    """Run `ops` against `stores` and an oracle; stop at the first violation.

    An op is `{"rank", "op", "key" | "keys", "value"?}`; a value is bytes or a list of byte values; a
    `get_async` with `"wait": false` is fired and not awaited (as an engine's prefetch does). Returns one
    record per op run (`result`, `oracle`, `outcome`, and `seconds` when `clock` is given) and the
    violations.
    """
    oracle = [MemoryStore() for _ in stores]
    records: list[dict] = []
    for i, raw in enumerate(ops):
        op = dict(raw)
        if isinstance(op.get("value"), list):
            op["value"] = bytes(op["value"])
        r = op["rank"]
        if not 0 <= r < len(stores):
            raise ValueError(f"ops[{i}]: rank {r} is not one of the {len(stores)} stores")
        fire_only = op["op"] == "get_async" and op.get("wait", True) is False
        expected = None if fire_only else _call(oracle[r], op, wait_bound)
        start = clock() if clock else None
        rec = {"index": i, **op, "oracle": expected}
        records.append(rec)
        try:
            got = stores[r].get_async(op["key"]) if fire_only else _call(stores[r], op, wait_bound)
        except StoreCallTimeout as exc:
            rec["outcome"] = "hang"
            return records, [Violation("store-hang", f"ops[{i}] rank {r}: {exc}",
                                       {"index": i, "op": exc.op, "key": exc.key, "seconds": exc.seconds})]
        except Exception as exc:  # the client raised instead of answering
            rec["outcome"] = f"{type(exc).__name__}: {exc}"
            return records, [Violation("store-error", f"ops[{i}] rank {r}: {op['op']}({op.get('key', op.get('keys'))!r})"
                                       f" raised {type(exc).__name__}: {exc}", {"index": i})]
        if clock:
            rec["seconds"] = round(clock() - start, 6)
        if fire_only:
            rec["outcome"] = "not awaited"
            continue
        rec["result"] = got
        if op["op"] not in ("put", "delete") and got != expected:
            rec["outcome"] = "mismatch"
            return records, [Violation("store-roundtrip", f"ops[{i}] rank {r}: {op['op']}({op.get('key', op.get('keys'))!r})"
                                       f" returned {_short(got)}, the oracle {_short(expected)}", {"index": i})]
        rec["outcome"] = "ok"
    return records, []


def _short(v: Any) -> str:
    if isinstance(v, (bytes, bytearray)):
        return f"{len(v)} bytes"
    if isinstance(v, list):
        return "[" + ", ".join(_short(x) for x in v) + "]"
    return repr(v)


def minimise_ops(ops: Sequence[dict], still_fails: Callable[[list[dict]], bool], *,
                 should_stop: Callable[[], bool] = lambda: False) -> tuple[list[dict], bool]:
    """Delta debugging over an op sequence: drop chunks of ops (halves, then quarters, ... then single ops)
    while `still_fails(shorter)` holds. Returns the shortest sequence found and whether it is 1-minimal
    (a full pass of single-op removals kept nothing; False when `should_stop()` ended the search first)."""
    ops = list(ops)
    n = 2
    while len(ops) >= 1:
        size = max(1, len(ops) // n)
        starts = range(0, len(ops), size)
        for start in starts:
            if should_stop():
                return ops, False
            shorter = ops[:start] + ops[start + size:]
            if still_fails(shorter):
                ops = shorter
                n = max(n - 1, 2)
                break
        else:
            if size == 1:
                return ops, True
            n = min(n * 2, len(ops))
    return ops, True
