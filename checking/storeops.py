"""Store-ops runs: a sequence of store-client operations per rank, checked op by op against an in-memory oracle;
their traces replayed on fresh, bounded stores of a client, and minimised by delta debugging. A client call that times out raises `StoreCallTimeout` (the bounding is the
caller's), which becomes the violation `store-hang`."""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import attrs

from checking.faulted import FAULT_OPS, FaultWindow
from checking.minimise import ddmin
from model.calls import DEFAULT_OP_TIMEOUT, wait_future
from model.checks import STORE_PROPERTIES  # noqa: F401  (the properties an op sequence can violate)
from model.codec import preview
from model.cases import CODECS
from model.contract import RankStore, StoreCallTimeout
from model.outcome import Violation
from model.timing import rerun_starved
from model.history import READ_PATHS, answer, read_args, wrong_key
from model.trace import Trace, decode, encode
from model.trace_validate import STORE_OPS
from runtime.bounded import BoundedStore, call_bounded
from runtime.registry import Client
from runtime.tier import NotShared, SharedStores, open_shared

__all__ = ["OPS", "run_ops", "OPTION_KEYS", "run", "violation_key", "kept_by_removal", "bounded_factory",
           "minimise_store_ops", "replay", "needs_shared", "WRITES"]

#: The ops of a store-ops sequence: a client's writes, every read path of `model.history.READ_PATHS`, the server's
#: own eviction and ageing (`model.trace_validate.STORE_OPS`).
OPS = STORE_OPS
#: A client's writes.
WRITES = ("put", "delete")


def _keys(op: dict) -> list[str]:
    return list(op["keys"]) if "keys" in op else [op["key"]]


def _call(store: Any, op: dict, wait_bound: float) -> Any:
    name = op["op"]
    if name == "put":
        return store.put(op["key"], op["value"])
    if name == "delete":
        return store.delete(op["key"])
    if name == "get_async":
        return wait_future(store.get_async(op["key"]), wait_bound, "get_async", op["key"])
    if name not in READ_PATHS:
        raise ValueError(f"unknown op {name!r} (known: {', '.join(OPS)})")
    if not callable(getattr(store, name, None)):
        raise AttributeError(f"this client has no {name} read path")
    got = getattr(store, name)(*read_args(name, _keys(op)))
    return list(got) if isinstance(got, tuple) else got


def _expected(oracle: dict, op: dict) -> Any:
    """The register's answer to a read (None for a write), from `model.history.answer`."""
    if op["op"] in WRITES:
        return None
    if op["op"] not in READ_PATHS:
        raise ValueError(f"unknown op {op['op']!r} (known: {', '.join(OPS)})")
    return answer(op["op"], [oracle.get(k) for k in _keys(op)])


class _Register:
    """The oracle of a run: per rank (one server each), every key's value, every value it was ever put (a
    wrong key's), who changed it last (a client index, or "server"), and what each client last wrote or read of
    it (a client-local view: a stale answer equals it)."""

    def __init__(self, n_ranks: int, n_clients: int) -> None:
        self.values: list[dict[str, bytes]] = [{} for _ in range(n_ranks)]
        self.held: list[dict[str, list[bytes]]] = [{} for _ in range(n_ranks)]
        self.by: list[dict[str, Any]] = [{} for _ in range(n_ranks)]
        self.seen: list[list[dict[str, bytes | None]]] = [[{} for _ in range(n_ranks)] for _ in range(n_clients)]
        self.aged: list[dict[str, float]] = [{} for _ in range(n_ranks)]  # keys not written since an `age` op

    def age(self, seconds: float) -> None:
        for r, values in enumerate(self.values):
            for key in values:
                self.aged[r][key] = self.aged[r].get(key, 0.0) + seconds

    def write(self, r: int, op: dict, who: Any) -> None:
        key = op["key"]
        self.aged[r].pop(key, None)
        if op["op"] == "put":
            self.values[r][key] = bytes(op["value"])
            self.held[r].setdefault(key, []).append(bytes(op["value"]))
        else:
            self.values[r].pop(key, None)
        self.by[r][key] = who
        if who != "server":
            self.seen[who][r][key] = self.values[r].get(key)

    def read(self, r: int, c: int, op: dict) -> None:
        """A read by client `c` answered right: it has seen the keys' values now (value reads only)."""
        if op["op"] in ("get", "get_async", "get_sync", "get_batch"):
            for k in _keys(op):
                self.seen[c][r][k] = self.values[r].get(k)

    def judge(self, i: int, r: int, c: int, op: dict, got: Any, expected: Any) -> Violation:
        """The violation of a read that answered `got`: a value put for another key (`wrong-key`), the answer
        this client would give had it not seen another client's or the server's change (`shared-tier`), else
        `store-roundtrip`."""
        call = f"ops[{i}] rank {r}{f' client {c}' if c else ''}: {op['op']}({op.get('key', op.get('keys'))!r})"
        crossed = wrong_key(_keys(op), got, expected, self.held[r])
        if crossed is not None:
            return Violation("wrong-key", f"{call} answered {crossed[0]!r} with a value put for {crossed[1]!r} "
                             f"(returned {preview(got)}, the oracle {preview(expected)})",
                             {"index": i, "key": crossed[0], "from": crossed[1]})
        keys, seen = _keys(op), self.seen[c][r]
        unseen = [k for k in keys if self.by[r].get(k, c) != c and k in seen]
        local = answer(op["op"], [seen[k] if k in unseen else self.values[r].get(k) for k in keys])
        if unseen and got == local:
            who = self.by[r][unseen[0]]
            did = "deleted" if unseen[0] not in self.values[r] else "overwrote"
            whom = "the server evicted it" if who == "server" else f"client {who} {did} it"
            return Violation("shared-tier", f"{call} returned {preview(got)}, the oracle {preview(expected)}: {whom}, "
                             "and this client answered what it had seen before", {"index": i, "key": unseen[0],
                                                                                  "by": who})
        aged = [k for k in keys if k in self.aged[r]]
        if aged:
            return Violation("retention", f"{call} returned {preview(got)}, the oracle {preview(expected)}: put "
                             f"{self.aged[r][aged[0]]:g} s before and never deleted", {"index": i, "key": aged[0]})
        return Violation("store-roundtrip", f"{call} returned {preview(got)}, the oracle {preview(expected)}",
                         {"index": i})


def run_ops(stores: Sequence[RankStore], ops: Sequence[dict], *, wait_bound: float = DEFAULT_OP_TIMEOUT,
            clock: Any = None, others: Sequence[Sequence[RankStore]] = (),
            evict: Callable[[int, str], None] | None = None,
            done: Sequence[dict] = (), done_ago: float | None = None, control: Any = None,
            recovery_seconds: float | None = None) -> tuple[list[dict], list[Violation]]:
    """Run `ops` against `stores` and an oracle; stop at the first violation.

    An op is `{"rank", "op", "key" | "keys", "value"?, "client"?}`; a value is bytes or a list of byte values; a
    `get_async` with `"wait": false` is fired and not awaited (as an engine's prefetch does). `others` are more
    clients of the same servers (op `client` c > 0 runs on `others[c - 1]`); an `evict` op is the server's own
    eviction (`evict(rank, key)`), an `age` op waits `seconds` (what was put grows old). `done`: puts and deletes
    that already ran on these stores (the oracle starts from them; `done_ago`: that many seconds ago, as after an
    `age` op). Returns one record per op run (`result`,
    `oracle`, `outcome`, and `seconds` when `clock` is given) and the violations. Real-server faults are ops too
    (`checking.faulted`: `{"op": "fault", "fault": FIELD, "rank", "seconds"}` strikes through `control`, `{"op":
    "recover"}` waits for the servers and probes `recovery`); while one lasts, an error or a miss is fine.
    """
    clients = [stores, *others]
    oracle = _Register(len(stores), len(clients))
    for op in done:
        oracle.write(op["rank"], {**op, "value": bytes(op["value"]) if op.get("value") is not None else None},
                     op.get("client", 0))
    if done_ago is not None:
        oracle.age(done_ago)
    window = FaultWindow(stores, oracle.values, control=control, op_timeout=wait_bound,
                         recovery_seconds=recovery_seconds)
    records: list[dict] = []
    for i, raw in enumerate(ops):
        op = dict(raw)
        if isinstance(op.get("value"), list):
            op["value"] = bytes(op["value"])
        rec = {"index": i, **op}
        if op["op"] in FAULT_OPS:
            records.append(rec)
            violation = window.fault_op(i, op, rec)
            if violation is not None:
                return records, [violation]
            continue
        if op["op"] == "age":
            time.sleep(float(op["seconds"]))
            oracle.age(float(op["seconds"]))
            records.append({**rec, "outcome": "ok"})
            continue
        r, c = op["rank"], op.get("client", 0)
        if not 0 <= r < len(stores):
            raise ValueError(f"ops[{i}]: rank {r} is not one of the {len(stores)} stores")
        if not 0 <= c < len(clients):
            raise ValueError(f"ops[{i}]: client {c} is not one of the {len(clients)} clients of these servers")
        if op["op"] == "evict":
            if evict is None:
                raise ValueError(f"ops[{i}]: a server eviction, but these servers cannot evict by themselves")
            evict(r, op["key"])
            oracle.write(r, op, "server")
            records.append({**rec, "outcome": "ok"})
            continue
        fire_only = op["op"] == "get_async" and op.get("wait", True) is False
        expected = None if fire_only else _expected(oracle.values[r], op)
        start = clock() if clock else None
        rec["oracle"] = expected
        records.append(rec)
        store = clients[c][r]
        try:
            got = store.get_async(op["key"]) if fire_only else _call(store, op, wait_bound)
        except StoreCallTimeout as exc:
            rec["outcome"] = "hang"
            return records, [window.timed_out(i, r, exc, op)]
        except Exception as exc:  # the client raised instead of answering
            rec["outcome"] = f"{type(exc).__name__}: {exc}"
            violation = window.raised(i, r, op, exc)
            if violation is not None:
                return records, [violation]
            continue
        if clock:
            rec["seconds"] = round(clock() - start, 6)
        if fire_only:
            rec["outcome"] = "not awaited"
            continue
        rec["result"] = got
        if op["op"] in WRITES:
            oracle.write(r, op, c)
            window.settled(r, op)
        elif got != expected:
            violation = window.answered(i, r, op, got, expected) if window.faulted else \
                oracle.judge(i, r, c, op, got, expected)
            if violation is not None:
                rec["outcome"] = "mismatch"
                return records, [violation]
            rec["outcome"] = "allowed under a fault"
            continue
        else:
            oracle.read(r, c, op)
        rec["outcome"] = "ok"
    violation = window.close(len(records))
    if violation is not None:
        records.append({"index": len(ops), "op": "recover", "outcome": violation.summary})
        return records, [violation]
    return records, []


# -- store-ops traces ------------------------------------------------------------------------------
#: The client options a store-ops trace may record in its config.
OPTION_KEYS = ("topology", "use_mla", "op_timeout", "password")


class CannotRun(ValueError):
    """A trace that cannot run on this client at all (not a failure of the client)."""


def needs_shared(trace: Trace) -> bool:
    """Whether the trace runs several clients of the same servers, or the server's own evictions."""
    return int(trace.config.get("clients", 1)) > 1 or any(op.get("op") == "evict" for op in trace.ops)


def run(trace: Trace, factory: Callable[..., list],
        control_for: Callable[[list], Any] | None = None) -> tuple[list[dict], list[Violation]]:
    """Run the trace's ops with `checking.storeops.run_ops` on `factory(n_ranks, **options)` (the options the
    trace recorded), or, for a trace of several clients of the same servers (`needs_shared`), on
    `factory.shared(n_ranks, clients, **options)` (`bounded_factory`); returns (records, violations) — at most one
    violation, the first (a factory that raised is `store-error` at op index -1). `CannotRun` when the trace
    cannot run on this factory. Fault ops strike through `control_for(stores)` (closed after). A run the machine
    starved (`model.timing.HarnessOutcome`) runs again on fresh stores; the last one propagates."""
    return rerun_starved(lambda: _run_once(trace, factory, control_for))


def _run_once(trace: Trace, factory: Callable[..., list],
              control_for: Callable[[list], Any] | None) -> tuple[list[dict], list[Violation]]:
    cfg = dict(trace.config)
    n = int(cfg.get("n_ranks", 1))
    timeout = float(cfg.get("op_timeout", DEFAULT_OP_TIMEOUT))
    options = {k: cfg[k] for k in OPTION_KEYS if k in cfg}
    shared = None
    t0 = time.monotonic()
    try:
        if needs_shared(trace):
            opener = getattr(factory, "shared", None)
            if opener is None:
                raise CannotRun("the trace runs several clients of the same servers; this factory makes one")
            try:
                shared = opener(n, int(cfg.get("clients", 2)), **options)
            except NotShared as exc:
                raise CannotRun(f"the trace runs several clients of the same servers: {exc}") from None
            stores = shared.clients[0]
        else:
            stores = factory(n, **options)
    except CannotRun:
        raise
    except Exception as e:
        return [], [Violation("store-error", f"factory({n}, **{options}) raised {type(e).__name__}: {e}",
                              {"index": -1})]
    control = None
    try:
        others = shared.clients[1:] if shared is not None else ()
        evict = shared.evict if shared is not None and shared.can_evict() else None
        if control_for is not None and any(op.get("op") == "fault" for op in trace.ops):
            control = control_for(stores)
        records, violations = run_ops(stores, decode(trace.ops, "ops"), wait_bound=timeout, clock=time.monotonic,
                                      others=others, evict=evict, control=control,
                                      recovery_seconds=cfg.get("recovery_seconds"))
    finally:
        if control is not None:
            control.close()
        _remove_written(stores, trace.ops, timeout)
        if shared is not None:
            shared.close()
        else:
            for s in stores:
                if hasattr(s, "close"):
                    s.close()
    records = [encode(r) for r in records]
    records.append({"total_seconds": round(time.monotonic() - t0, 3)})
    return records, violations


def _remove_written(stores: Sequence[RankStore], ops: Sequence[dict], timeout: float) -> None:
    """Delete every key the run put (bounded, errors ignored): on servers that outlive the run (the user's, a
    minimiser's or a replay's next run) a later run must not read this one's values."""
    written = {(int(op.get("rank", 0)), op["key"]) for op in ops if op.get("op") == "put" and "key" in op}
    for rank, key in sorted(written):
        if 0 <= rank < len(stores):
            try:
                call_bounded(timeout, "delete", key, stores[rank].delete, key)
            except Exception:  # noqa: BLE001 - a client that cannot delete now was already judged by the run
                pass


def violation_key(trace: Trace, violations: list[Violation]) -> tuple | None:
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


class _BoundedFactory:
    """`make(n, **recorded)`: fresh stores of a client with the options a trace recorded (those it accepts) and the
    user's, every call bounded; `make.shared(n, clients, **recorded)`: several clients of the same servers
    (`runtime.tier.open_shared`), bounded the same way."""

    def __init__(self, client: Client, timeout: float, options: dict) -> None:
        self.client, self.timeout, self.options = client, timeout, options

    def _options(self, recorded: dict) -> dict:
        return {**self.client.accepted(recorded), **self.options}

    def __call__(self, n: int, **recorded: Any) -> list:
        return [BoundedStore(s, self.timeout) for s in self.client.stores(n, **self._options(recorded))]

    def shared(self, n: int, clients: int, **recorded: Any) -> SharedStores:
        return open_shared(self.client, n, clients=clients, wrap=lambda s: BoundedStore(s, self.timeout),
                           **self._options(recorded))


def bounded_factory(trace: Any, client: Client, options: dict | None = None) -> Any:
    """Fresh stores from the client factory, with the options the trace recorded and the user's `options` (the
    in-memory model takes none); every call bounded by the trace's op timeout (`_BoundedFactory`: one client, or
    several sharing servers)."""
    return _BoundedFactory(client, float(trace.config.get("op_timeout", DEFAULT_OP_TIMEOUT)), dict(options or {}))


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

    codec = CODECS["store-ops"]

    def still_fails(ops: list[dict]) -> bool:
        runs[0] += 1
        shorter = attrs.evolve(trace, ops=codec.rebuild(trace.case(), ops))
        violations = run(shorter, bounded, control_for)[1]
        if violation_key(shorter, violations) != want:
            return False
        seen[0] = violations  # the violations of the shortest sequence so far
        return True

    ops, minimal = ddmin(codec.parts(trace.case()), still_fails, should_stop=should_stop)
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


