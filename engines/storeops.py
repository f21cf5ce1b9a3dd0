"""Store-ops runs: a sequence of store-client operations per rank, checked op by op against an in-memory oracle;
their traces replayed on fresh, bounded stores of a client, and minimised by delta debugging. A client call that times out raises `StoreCallTimeout` (the bounding is the
caller's), which becomes the violation `store-hang`."""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import attrs

from engines.faulted import FAULT_OPS, FaultWindow
from engines.minimise import ddmin
from model.calls import DEFAULT_OP_TIMEOUT, wait_future
from model.checks import STORE_PROPERTIES  # noqa: F401  (the properties an op sequence can violate)
from model.contract import RankStore, StoreCallTimeout
from model.outcome import Violation
from model.store import MemoryStore
from model.trace import Trace, decode, encode
from runtime.bounded import BoundedStore
from runtime.registry import Client

__all__ = ["OPS", "run_ops", "OPTION_KEYS", "run", "violation_key", "kept_by_removal", "bounded_factory",
           "minimise_store_ops", "replay"]

OPS = ("put", "get", "contains", "delete", "get_async", "get_batch")


def _call(store: Any, op: dict, wait_bound: float) -> Any:
    name = op["op"]
    if name == "put":
        return store.put(op["key"], op["value"])
    if name in ("get", "contains", "delete"):
        return getattr(store, name)(op["key"])
    if name == "get_async":
        return wait_future(store.get_async(op["key"]), wait_bound, "get_async", op["key"])
    if name == "get_batch":
        if not callable(getattr(store, "get_batch", None)):
            raise AttributeError("this client has no get_batch read path")
        return list(store.get_batch(list(op["keys"])))
    raise ValueError(f"unknown op {name!r} (known: {', '.join(OPS)})")


def run_ops(stores: Sequence[RankStore], ops: Sequence[dict], *, wait_bound: float = DEFAULT_OP_TIMEOUT,
            clock: Any = None, control: Any = None, recovery_seconds: float | None = None
            ) -> tuple[list[dict], list[Violation]]:
    """Run `ops` against `stores` and an oracle; stop at the first violation.

    An op is `{"rank", "op", "key" | "keys", "value"?}`; a value is bytes or a list of byte values; a
    `get_async` with `"wait": false` is fired and not awaited (as an engine's prefetch does). Returns one
    record per op run (`result`, `oracle`, `outcome`, and `seconds` when `clock` is given) and the
    violations. Real-server faults are ops too (`engines.faulted`: `{"op": "fault", "fault": FIELD, "rank",
    "seconds"}` strikes through `control`, `{"op": "recover"}` waits for the servers and probes `recovery`);
    while one lasts, an error or a miss is fine.
    """
    oracle = [MemoryStore() for _ in stores]
    window = FaultWindow(stores, oracle, control=control, op_timeout=wait_bound,
                         recovery_seconds=recovery_seconds)
    records: list[dict] = []
    for i, raw in enumerate(ops):
        op = dict(raw)
        if isinstance(op.get("value"), list):
            op["value"] = bytes(op["value"])
        if op["op"] in FAULT_OPS:
            rec = {"index": i, **op}
            records.append(rec)
            violation = window.fault_op(i, op, rec)
            if violation is not None:
                return records, [violation]
            continue
        r = op["rank"]
        if not 0 <= r < len(stores):
            raise ValueError(f"ops[{i}]: rank {r} is not one of the {len(stores)} stores")
        fire_only = op["op"] == "get_async" and op.get("wait", True) is False
        prior = window.prior(r, op)
        expected = None if fire_only else _call(oracle[r], op, wait_bound)
        start = clock() if clock else None
        rec = {"index": i, **op, "oracle": expected}
        records.append(rec)
        try:
            got = stores[r].get_async(op["key"]) if fire_only else _call(stores[r], op, wait_bound)
        except StoreCallTimeout as exc:
            rec["outcome"] = "hang"
            return records, [window.timed_out(i, r, exc, op)]
        except Exception as exc:  # the client raised instead of answering
            rec["outcome"] = f"{type(exc).__name__}: {exc}"
            violation = window.raised(i, r, op, exc, prior)
            if violation is not None:
                return records, [violation]
            continue
        if clock:
            rec["seconds"] = round(clock() - start, 6)
        if fire_only:
            rec["outcome"] = "not awaited"
            continue
        rec["result"] = got
        if op["op"] not in ("put", "delete") and got != expected:
            violation = window.answered(i, r, op, got, expected)
            if violation is not None:
                rec["outcome"] = "mismatch"
                return records, [violation]
            rec["outcome"] = "allowed under a fault"
            continue
        window.settled(r, op)
        rec["outcome"] = "ok"
    violation = window.close(len(records))
    if violation is not None:
        records.append({"index": len(ops), "op": "recover", "outcome": violation.summary})
        return records, [violation]
    return records, []


def _short(v: Any) -> str:
    if isinstance(v, (bytes, bytearray)):
        return f"{len(v)} bytes"
    if isinstance(v, list):
        return "[" + ", ".join(_short(x) for x in v) + "]"
    return repr(v)


# -- store-ops traces ------------------------------------------------------------------------------
#: The client options a store-ops trace may record in its config.
OPTION_KEYS = ("topology", "use_mla", "op_timeout", "password")


def run(trace: Trace, factory: Callable[..., list],
        control_for: Callable[[list], Any] | None = None) -> tuple[list[dict], list[Violation]]:
    """Run the trace's ops with `engines.storeops.run_ops` on `factory(n_ranks, **options)` (the options the
    trace recorded); returns (records, violations) — at most one violation, the first (a factory that raised is
    `store-error` at op index -1). Fault ops strike through `control_for(stores)` (closed after)."""
    cfg = dict(trace.config)
    n = int(cfg.get("n_ranks", 1))
    timeout = float(cfg.get("op_timeout", DEFAULT_OP_TIMEOUT))
    options = {k: cfg[k] for k in OPTION_KEYS if k in cfg}
    t0 = time.monotonic()
    try:
        stores = factory(n, **options)
    except Exception as e:
        return [], [Violation("store-error", f"factory({n}, **{options}) raised {type(e).__name__}: {e}",
                              {"index": -1})]
    control = None
    try:
        if control_for is not None and any(op.get("op") == "fault" for op in trace.ops):
            control = control_for(stores)
        records, violations = run_ops(stores, decode(trace.ops, "ops"), wait_bound=timeout, clock=time.monotonic,
                                      control=control, recovery_seconds=cfg.get("recovery_seconds"))
    finally:
        if control is not None:
            control.close()
        for s in stores:
            if hasattr(s, "close"):
                s.close()
    records = [encode(r) for r in records]
    records.append({"total_seconds": round(time.monotonic() - t0, 3)})
    return records, violations


def violation_key(trace: Trace, violations: list[Violation]) -> tuple:
    """What makes two runs show the same violation: its property and the op that showed it (`factory`
    when building the client failed); None without a violation. Through real-server faults the op's key too, whether
    the server held it, and whether a wrong answer was another key's bytes: a shorter sequence whose violation moved
    to another key (one never written, say) or lost the other key's bytes shows another bug."""
    if not violations:
        return None
    index = violations[0].detail.get("index", -1)
    if not 0 <= index < len(trace.ops):
        return violations[0].property, "factory"
    op = trace.ops[index]
    if any(o.get("op") == "fault" for o in trace.ops):
        detail = violations[0].detail  # (a read of another key's bytes is not one of bytes nobody wrote)
        return (violations[0].property, op["op"], op.get("key", tuple(op.get("keys", ()))), detail.get("present"),
                detail.get("owner") is not None)
    return violations[0].property, op["op"]


def kept_by_removal(trace: Trace, factory: Callable[..., list], control_for: Any = None) -> list[int]:
    """The indexes `i` of ops whose removal keeps the trace's violation on `factory` (empty: 1-minimal)."""
    _, violations = run(trace, factory, control_for)
    want = violation_key(trace, violations)
    if want is None or want[0] != trace.property:
        raise ValueError(f"the trace does not show its {trace.property} violation on this client")
    kept = []
    for i in range(len(trace.ops)):
        shorter = attrs.evolve(trace, ops=trace.ops[:i] + trace.ops[i + 1:])
        if violation_key(shorter, run(shorter, factory, control_for)[1]) == want:
            kept.append(i)
    return kept


def bounded_factory(trace: Any, client: Client, options: dict | None = None) -> Any:
    """Fresh stores from the client factory, with the options the trace recorded and the user's `options` (the
    in-memory model takes none); every call bounded by the trace's op timeout."""
    timeout = float(trace.config.get("op_timeout", DEFAULT_OP_TIMEOUT))
    extra = dict(options or {})

    def make(n: int, **recorded: Any) -> list:
        return [BoundedStore(s, timeout) for s in client.stores(n, **{**client.accepted(recorded), **extra})]
    return make


def minimise_store_ops(trace: Any, client: Client, *, should_stop: Any, progress: Any = None,
                       options: dict | None = None, control_for: Any = None) -> tuple[Any, bool]:
    """The trace with as few ops as still show its violation (the same property at the same kind of op) on
    fresh stores of the client, and whether that is 1-minimal. A trace whose violation does not show again
    (a flaky client) is returned as it is, not minimal. Its fault ops strike through `control_for(stores)`."""
    bounded = bounded_factory(trace, client, options)
    first = run(trace, bounded, control_for)[1]
    want = violation_key(trace, first)
    if want is None or want[0] != trace.property:
        return trace, False
    runs, seen = [0], [first]

    def still_fails(ops: list[dict]) -> bool:
        runs[0] += 1
        shorter = attrs.evolve(trace, ops=ops)
        violations = run(shorter, bounded, control_for)[1]
        if violation_key(shorter, violations) != want:
            return False
        seen[0] = violations  # the violations of the shortest sequence so far
        return True

    ops, minimal = ddmin(trace.ops, still_fails, should_stop=should_stop)
    if progress:
        progress(f"  minimised the store-ops counterexample from {len(trace.ops)} to {len(ops)} ops in {runs[0]} "
                 f"replays{'' if minimal else ' (stopped before it was 1-minimal)'}")
    note = f"minimised from {len(trace.ops)} ops ({'1-minimal' if minimal else 'stopped early'})"
    summary = seen[0][0].summary if ops != list(trace.ops) else trace.summary
    return attrs.evolve(trace, ops=ops, verdict={"violations": [v.to_json() for v in seen[0]]}, summary=summary,
                        notes=f"{trace.notes} | {note}" if trace.notes else note), minimal


def replay(trace: Trace, factory: Callable[..., list]) -> tuple[str, str]:
    """One run of a store-ops trace on `factory`: `reproduces` or `fixed`, and why."""
    _, violations = run(trace, factory)
    props = [v.property for v in violations]
    if trace.property in props:
        return "reproduces", violations[0].summary
    return "fixed", "no violation" if not props else f"other violation: {violations[0].summary}"


