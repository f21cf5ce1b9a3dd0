"""The concurrent driver: many store-client calls at once, recorded as a history (judged by
`checking.concurrency_judge`).

A `Layout` says which caller thread issues which ops, in order (seeded by `make_layout`, so a run is
reproducible in its op layout). `run_layout` starts every caller at one barrier; a caller issues its sync ops
one after the other and fires its `get_async` ops without waiting, so sync lookups from foreign threads run
while async reads are in flight on the client's own loop, and puts and deletes race the reads. Every wait is
bounded by `bound` seconds for the whole run; an op still pending then (or a call the client bounded itself,
`StoreCallTimeout`) never completed. A fault the machine kept from striking (`model.timing.HarnessOutcome`) ends
the run with it: nothing is judged.

`measure` repeats a layout and counts the runs that show a violation: races are judged by their rate.
"""
from __future__ import annotations

import concurrent.futures as cf
import itertools
import random
import threading
import time
from typing import Any, Callable, Sequence

import attrs

from checking.concurrency_judge import judge
from runtime.bounded import call_bounded
from model.concurrent_case import Layout
from model.contract import StoreCallTimeout
from model.outcome import Violation
from model.history import MULTI_KEY_READS, NEMESIS_CALLER, WRITE_PATHS, History, Op, read_args
from model.recovery import default_recovery_seconds, probe
from model.timing import HarnessOutcome, overran, stolen

__all__ = ["Layout", "Run", "Measurement", "ServerClients", "make_layout", "run_layout", "measure", "tag_value",
           "thread_safe"]

_nonce = itertools.count()


def thread_safe(store: Any) -> bool:
    """Whether the client may be driven concurrently (CONTRACT.md: optional `thread_safe`, default True)."""
    return bool(getattr(store, "thread_safe", True))


@attrs.define
class ServerClients:
    """What a layout runs on: `clients[c]`, client c's store of one server (several clients of the same server
    when the client can share it, `runtime.tier`), and `evict(key)`, the server's own eviction (None: it cannot).
    `close()` closes what was made for it."""

    clients: list
    evict: Callable[[str], None] | None = None
    closer: Callable[[], None] | None = None

    @classmethod
    def of(cls, target: Any) -> "ServerClients":
        """A `ServerClients`, or one store as the target of one client."""
        return target if isinstance(target, ServerClients) else cls([target])

    @classmethod
    def shared(cls, shared: Any, rank: int = 0) -> "ServerClients":
        """Rank `rank`'s server of a `runtime.tier.SharedStores`: its clients there, and its eviction."""
        evict = (lambda key: shared.evict(rank, key)) if shared.can_evict() else None
        return cls([stores[rank] for stores in shared.clients], evict, shared.close)

    def close(self) -> None:
        if self.closer is not None:
            self.closer()
        else:
            for s in self.clients:
                s.close()


def make_layout(seed: int, *, threads: int = 4, ops: int = 8, keys: int = 3, paths: Sequence[str] = ("get", "get_async"),
                writes: float = 0.4, pad: int = 8, clients: int = 1, evictions: bool = False) -> Layout:
    """A seeded layout: `threads` callers of `ops` ops each over `keys` keys; a share `writes` of puts and
    deletes (and, with `evictions`, the server's own evictions), the rest reads spread over `paths` (multi-key
    paths read 2-3 keys). With `clients` > 1 each op goes through one of that many clients of the same server."""
    rng = random.Random(seed)
    names = [f"k{i}" for i in range(keys)]
    reads = [p for p in paths if p not in WRITE_PATHS] or ["get"]
    out = []
    for _ in range(threads):
        mine = []
        for _ in range(ops):
            if rng.random() < writes:
                roll = rng.random()
                path = "put" if roll < 0.75 else "evict" if evictions and roll < 0.85 else "delete"
                op = {"path": path, "keys": [rng.choice(names)], **({"pad": pad} if path == "put" else {})}
            else:
                path = rng.choice(reads)
                width = rng.randint(2, min(3, keys)) if path in MULTI_KEY_READS and keys > 1 else 1
                op = {"path": path, "keys": rng.sample(names, width)}
            if clients > 1 and op["path"] != "evict":
                op["client"] = rng.randrange(clients)
            mine.append(op)
        out.append(mine)
    return Layout(out, seed)


def tag_value(key: str, caller: str, index: int, pad: int) -> bytes:
    """The value a put writes: it names its key, caller and position, then `pad` filler bytes."""
    return f"{key}|{caller}.{index}|".encode() + b"v" * pad


@attrs.define
class Run:
    """One run: its history and its violations (each about an op: `detail["op"]`, its id; None: the run)."""

    history: History
    violations: list[Violation]
    verdict: dict = attrs.field(factory=dict)
    prefix: str = ""


def _call(target: ServerClients, op: Op) -> Any:
    path = op.path
    if op.server:  # the server's own eviction: a delete no client made
        return target.evict(op.key)
    store = target.clients[op.client]
    if path == "put":
        return store.put(op.key, op.value)
    if path == "delete":
        return store.delete(op.key)
    res = getattr(store, path)(*read_args(path, op.keys))
    return list(res) if isinstance(res, tuple) else res


def _plans(layout: Layout, prefix: str, target: Any) -> tuple[list[Op], list[list[Op]]]:
    """Every op of the layout (ids in thread order, keys under `prefix`, put values tagged), and each caller's plan;
    `ValueError` for a client or a server eviction the target does not have."""
    ops: list[Op] = []
    plans: list[list[Op]] = []
    for t, mine in enumerate(layout.threads):
        caller = f"t{t}"
        plan = []
        for i, spec in enumerate(mine):
            keys = tuple(prefix + k for k in spec["keys"])
            value = tag_value(keys[0], caller, i, int(spec.get("pad", 0))) if spec["path"] == "put" else None
            client, server = int(spec.get("client", 0)), spec["path"] == "evict"
            if not 0 <= client < len(target.clients):
                raise ValueError(f"the layout names client {client}; the target has {len(target.clients)}")
            if server and target.evict is None:
                raise ValueError("the layout has a server eviction, but this server cannot evict by itself")
            plan.append(Op(len(ops) + len(plan), caller, "delete" if server else spec["path"], keys, value,
                           client=client, server=server))
        ops.extend(plan)
        plans.append(plan)
    return ops, plans


def run_layout(store: Any, layout: Layout, *, bound: float = 2.0, prefix: str | None = None,
               clock: Callable[[], float] = time.monotonic, strikes: Sequence[tuple[Any, Any]] = (),
               control: Any = None, recovery_seconds: float | None = None, op_timeout: float | None = None) -> History:
    """Run `layout` on `store` (a store, or a `ServerClients`: several clients of one server; every caller at once); at
    most `bound` seconds for the whole run. Keys are prefixed with `prefix` (default: a fresh one per run, so runs
    on one store never see each other's keys). `strikes`: (kind, `ServerFault` at "run") pairs, each struck through
    `control` by the caller about to invoke op `fault.step`; the run then waits for the servers and probes `recovery`
    (`History.faults`), and a call that took longer than `op_timeout` (default: a third of `bound`) is judged as one
    that did not return within its bound."""
    target = ServerClients.of(store)
    prefix = f"r{next(_nonce)}-{random.randrange(1 << 30):x}-" if prefix is None else prefix
    lock = threading.Lock()
    ops, plans = _plans(layout, prefix, target)
    started: list[Op] = []
    barrier = threading.Barrier(len(plans) + 1)
    deadline = [0.0]
    due = {f.step: (kind, f) for kind, f in strikes}
    struck: list[dict] = []
    harness: list[HarnessOutcome] = []  # (a fault the machine kept from striking: the run judges nothing)

    def strike(op_id: int) -> None:
        kind, f = due.pop(op_id)
        t0 = clock()
        try:
            kind.strike(control, f)
        except HarnessOutcome as exc:  # (the process was resumed: `adapters.process_signals.pause_process`)
            harness.append(exc)
        finally:
            with lock:
                struck.append({"fault": kind.field, "rank": f.rank, "seconds": f.seconds, "step": f.step,
                               "loses": kind.loses, "struck": t0, "struck_end": clock()})

    def complete(op: Op, result: Any = None, error: BaseException | None = None) -> None:
        now = clock()
        with lock:
            op.completions += 1
            if op.completions > 1:
                return
            if isinstance(error, StoreCallTimeout):
                op.error = f"timeout: {error}"
                return  # the client gave up: the op never completed
            op.completed = now
            op.stolen = stolen(op.invoked, now) if clock is time.monotonic else 0.0
            if error is not None:
                op.error = f"{type(error).__name__}: {error}"
            else:
                op.result = bytes(result) if isinstance(result, (bytearray, memoryview)) else result

    def caller(plan: list[Op]) -> None:
        try:
            barrier.wait(bound)
        except threading.BrokenBarrierError:
            return
        for op in plan:
            if clock() > deadline[0]:
                return
            if op.id in due:
                strike(op.id)
            if harness:
                return
            with lock:
                op.invoked = clock()
                started.append(op)
            _invoke(target, op, complete)

    workers = [threading.Thread(target=caller, args=(p,), name=f"shardcheck-caller-t{i}", daemon=True)
               for i, p in enumerate(plans)]
    for w in workers:
        w.start()
    start = clock()
    deadline[0] = start + bound
    try:
        barrier.wait(bound)
    except threading.BrokenBarrierError:
        pass
    for w in workers:
        w.join(max(0.0, deadline[0] - clock()))
    _await_in_flight(started, lock, bound, start, clock)
    if harness:
        raise harness[0]
    with lock:  # ops never invoked (a caller stuck before them) are not part of the history
        ids = {op.id for op in started}
        history = History([attrs.evolve(op) for op in ops if op.id in ids], [dict(f) for f in struck])
    if struck:
        op_timeout = bound / 3 if op_timeout is None else op_timeout
        for f in history.faults:
            f["op_timeout"] = op_timeout
        _after_faults(target.clients[0], history, sorted({k for op in ops for k in op.keys}), control, clock,
                      recovery_seconds if recovery_seconds is not None else default_recovery_seconds(op_timeout))
    return history


def _invoke(target: ServerClients, op: Op, complete: Callable[..., None]) -> None:
    """Call `op` on its client; `complete(op, result)` or `complete(op, error=...)` when it ends (a `get_async`'s
    when its future does)."""
    try:
        if op.path == "get_async":
            target.clients[op.client].get_async(op.key).add_done_callback(lambda f: complete(op, *_outcome(f)))
            return
        result = _call(target, op)
    except BaseException as exc:
        complete(op, error=exc)
        return
    complete(op, None if op.path in WRITE_PATHS else result)


def _await_in_flight(started: list[Op], lock: threading.Lock, bound: float, start: float,
                     clock: Callable[[], float]) -> None:
    """Until every op started has completed, or the run's bound is over: judged as every timing is
    (`model.timing`), in wall time with a fake clock."""
    judged = clock is time.monotonic
    while (overran(bound, start, clock(), "a concurrent run") is None) if judged else clock() < start + bound:
        with lock:
            if all(op.completions for op in started):
                return
        time.sleep(0.001)


def _after_faults(store: Any, history: History, keys: list[str], control: Any, clock: Callable[[], float],
                  recovery_seconds: float) -> None:
    """Wait for the servers, probe `recovery`, and add what each fault did to every key of the run as nemesis ops."""
    healed = control.healed(max(f["seconds"] for f in history.faults) + 10.0)
    if healed is None:
        raise RuntimeError("the nemesis could not end the faults of the run")
    result = probe(store, healed_at=healed, recovery_seconds=recovery_seconds, clock=clock)
    n = max((op.id for op in history.ops), default=-1) + 1
    for f in history.faults:
        f.update(healed=healed, recovered=result.seconds, recovery_seconds=recovery_seconds,
                 **({"not_recovered": result.why} if not result.ok else {}))
        paths = {"all": [("fault-wipe", f["struck"], f["struck_end"])],
                 "snapshot": [("fault-save", f["struck"], f["struck_end"]),
                              ("fault-restore", f["struck_end"], healed)],
                 "any": [("fault-lose", f["struck"], f["struck_end"])]}.get(f["loses"], [])
        for path, start, end in paths:
            for key in keys:
                history.ops.append(Op(n, NEMESIS_CALLER, path, (key,), invoked=start, completed=end, completions=1))
                n += 1


def _outcome(fut: cf.Future) -> tuple[Any, BaseException | None]:
    if fut.cancelled():
        return None, cf.CancelledError("the future was cancelled")
    exc = fut.exception()
    return (None, exc) if exc is not None else (fut.result(), None)


@attrs.define
class Measurement:
    """What runs of a layout showed: a violation in `k` of `n` runs; `first` is the first failing run (its rate, as
    every finding's, is `model.finding.Rate`)."""

    k: int
    n: int
    first: Run | None = None
    properties: dict[str, int] = attrs.field(factory=dict)
    seconds: float = 0.0

    @property
    def rate(self) -> float:
        return self.k / self.n if self.n else 0.0


#: Seconds the removal of a run's keys may take in all (a client that hung is not waited on).
CLEANUP_SECONDS = 2.0


def remove_keys(store: Any, history: History, bound: float = CLEANUP_SECONDS) -> None:
    """Delete the keys a run put (through client 0), so that runs leave nothing on a user's servers; skipped when
    an op of the run never completed (the client may be wedged), bounded in all by `CLEANUP_SECONDS`."""
    if any(op.pending for op in history.ops):
        return
    target = ServerClients.of(store)
    keys = sorted({op.key for op in history.ops if op.path == "put"})
    if not keys:
        return
    end = time.monotonic() + min(bound, CLEANUP_SECONDS)
    for key in keys:
        left = end - time.monotonic()
        if left <= 0:
            return
        try:
            call_bounded(left, "delete", key, target.clients[0].delete, key)
        except Exception:  # noqa: BLE001 - cleaning up is best effort; the run's verdict is already taken
            return


def measure(store: Any, layout: Layout, *, runs: int, bound: float = 2.0, want: str | None = None,
            should_stop: Callable[[], bool] = lambda: False, first_only: bool = False,
            strikes: Sequence[tuple[Any, Any]] = (), control: Any = None, op_timeout: float | None = None,
            recovery_seconds: float | None = None) -> Measurement:
    """Run `layout` up to `runs` times on `store` (each run striking `strikes` through `control`); count the runs with
    a violation (of property `want`, when given). Stops early when `should_stop()`, or after the first failing run
    with `first_only`; `n` counts the runs made."""
    t0 = time.monotonic()
    rate = Measurement(0, 0)
    for _ in range(runs):
        if should_stop():
            break
        history = run_layout(store, layout, bound=bound, strikes=strikes, control=control, op_timeout=op_timeout,
                             recovery_seconds=recovery_seconds)
        violations, verdict = judge(history)
        remove_keys(store, history, bound)
        if want is not None:
            violations = [v for v in violations if v.property == want]
        rate.n += 1
        if violations:
            rate.k += 1
            prop = violations[0].property
            rate.properties[prop] = rate.properties.get(prop, 0) + 1
            if rate.first is None:
                rate.first = Run(history, violations, verdict)
            if first_only:
                break
    rate.seconds = time.monotonic() - t0
    return rate
