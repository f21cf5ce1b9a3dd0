"""The store-client layer as a Hypothesis state machine: `StoreMachine` drives one client's `RankStore`s (put, get,
contains, delete, get_async, wait, get_batch) against an in-memory oracle, every call bounded in time."""
from __future__ import annotations

import concurrent.futures
import itertools
import time
from typing import Any

from hypothesis.stateful import Bundle, RuleBasedStateMachine, precondition, rule

from model.contract import StoreCallTimeout
from model.faults import ServerFault
from model.recovery import default_recovery_seconds, probe
from model.trace import Trace, encode
from properties import config, strategies as s
from runtime.bounded import BoundedStore, call_bounded
from properties.reporting import PATH_CALLS, RULE_STEPS, VIOLATED, event, final_run, note, write_found

__all__ = ["StoreMachine", "Pending", "STRUCK", "DECIDED"]


# == the store-client layer ==============================================================================
class Pending:
    """An outstanding `get_async`: its future and every value it may rightly resolve to."""

    def __init__(self, rank: int, key: str, future: Any, allowed: list) -> None:
        self.rank, self.key, self.future, self.allowed = rank, key, future, allowed

    def __repr__(self) -> str:
        return f"Pending(rank={self.rank}, key={self.key!r})"


def _short(v: Any) -> str:
    if isinstance(v, (bytes, bytearray, memoryview)):
        b = bytes(v)
        return f"{len(b)} bytes {b[:8]!r}{'...' if len(b) > 8 else ''}"
    return repr(v)


_namespaces = itertools.count()
#: The real-fault kinds the store machine has struck in this session: each strikes once per session (a strike costs
#: its fault's length; the concurrent layer and `check`'s nemesis engine strike every kind again). `DECIDED` keeps
#: each decision by the ops before it and the rule's draws, so Hypothesis's replay of a failing example strikes
#: exactly where the failing run did.
STRUCK: set[str] = set()
DECIDED: dict[tuple, bool] = {}


class StoreMachine(RuleBasedStateMachine):
    """One client's stores (two ranks) against a dict oracle, every call bounded in time."""

    futures = Bundle("futures")

    def __init__(self) -> None:
        super().__init__()
        self.cfg = config.current()
        self.stores = self.cfg.stores(s.STORE_RANKS)
        self.timeout = self.cfg.op_timeout
        self.read_paths = [tuple(getattr(st, "read_paths", ("get", "get_async"))) for st in self.stores]
        self.oracle: list[dict[str, bytes]] = [{} for _ in self.stores]
        self.pending: list[Pending] = []
        self.ns = f"sc{next(_namespaces)}:"  # keys of earlier examples on a reused store never collide
        self.ops: list[dict] = []
        self.failed = False
        self.plan = self.cfg.nemesis()  # real faults on the servers (`--nemesis`), or None
        #: Keys a real fault may have lost (the server restarted empty, or evicted by its policy), per rank.
        self.maybe_lost: list[set[str]] = [set() for _ in self.stores]

    # -- calling the client -----------------------------------------------------------------------------
    def _fail(self, prop: str, message: str) -> None:
        self.failed = True
        if prop != "store-roundtrip":
            self.cfg.discard()  # a client that hung or raised may be unusable; a wrong answer leaves it usable
        if final_run() and self.cfg.write_traces:
            trace = Trace(kind="store-ops", property=prop, summary=message, protocol={"name": "-", "ref": None},
                          client=self.cfg.client_label(),
                          config={"n_ranks": len(self.stores), "op_timeout": self.timeout},
                          ops=[{k: encode(v) for k, v in op.items()} for op in self.ops],
                          verdict={"violations": [{"property": prop, "summary": message, "detail": {}}]},
                          origin="pytest properties/ (StoreMachine)")
            trace = self._minimised(trace)
            note(f"counterexample trace: {write_found(trace, self.cfg, self.cfg.client_label(), prop)}")
        raise VIOLATED[prop](f"{prop}: {message}")

    def _minimised(self, trace: Trace) -> Trace:
        """The trace with as few ops as still fail on fresh stores (`engines.storeops.minimise_store_ops`),
        within `minimise_seconds`: with a real client Hypothesis does not shrink, so this is what does."""
        if len(trace.ops) < 2 or self.cfg.minimise_seconds <= 0 or self.cfg.in_memory():
            return trace  # (Hypothesis has shrunk a model client's run)
        from engines.storeops import minimise_store_ops

        stop_at = time.monotonic() + self.cfg.minimise_seconds
        trace, _ = minimise_store_ops(trace, self.cfg.resolved_client(), options=self.cfg.client_options,
                                     should_stop=lambda: time.monotonic() >= stop_at, progress=note,
                                     control_for=self.plan.control if self.plan is not None else None)
        return trace

    def _call(self, rank: int, op: str, key: Any, *args: Any) -> Any:
        PATH_CALLS[op] += 1
        fn = getattr(self.stores[rank], op)
        try:
            if self.cfg.in_memory():
                # the reference in-memory store (exactly that class) is a dict and cannot block: no thread hop
                return fn(*args)
            return call_bounded(self.timeout, op, str(key), fn, *args)
        except StoreCallTimeout as exc:
            self._fail("store-hang", f"{self._where(rank, op, key)}: {exc}")
        except Exception as exc:
            self._fail("store-error", f"{self._where(rank, op, key)} raised {type(exc).__name__}: {exc}")

    def _where(self, rank: int, op: str, key: Any) -> str:
        where = f"rank {rank}: {op}({key!r})"
        if len(self.ops) > 1:
            where += f" after {self.ops[-2]['op']}({self.ops[-2].get('key', self.ops[-2].get('keys'))!r})"
        return where

    def _record(self, op: str, rank: int, **args: Any) -> None:
        """Log an op, before it runs, in `engines.storeops.run_ops`'s vocabulary (where `get_async` also waits)."""
        self.ops.append({"op": op, "rank": rank, **args})

    def _allowed(self, rank: int, key: str) -> list:
        """What a read of `key` may answer: the oracle's value, or a miss too when a real fault may have lost it."""
        return [self.oracle[rank].get(key)] + ([None] if key in self.maybe_lost[rank] else [])

    def _saw(self, rank: int, key: str, got: Any) -> None:
        """A read of a key a fault may have lost answered: a miss says it is gone, a value that it was kept."""
        if key in self.maybe_lost[rank]:
            self.maybe_lost[rank].discard(key)
            if got is None or got is False:
                self.oracle[rank].pop(key, None)

    def _expect(self, rank: int, what: str, got: Any, allowed: list) -> None:
        if got is not None and not isinstance(got, (bytes, bytearray, memoryview)):
            self._fail("store-roundtrip", f"rank {rank}: {what} returned {type(got).__name__}, not bytes or None")
        value = None if got is None else bytes(got)
        if value not in allowed:
            shown = " or ".join(_short(a) for a in allowed)
            self._fail("store-roundtrip", f"rank {rank}: {what} returned {_short(value)}, expected {shown}")

    # -- rules -----------------------------------------------------------------------------------------
    @rule(rank=s.store_rank, key=s.keys, value=s.values)
    def put(self, rank: int, key: str, value: bytes) -> None:
        """Write a value; the oracle records it."""
        RULE_STEPS["store"] += 1
        limit = getattr(self.stores[rank], "max_value_bytes", None)
        value = value if limit is None else value[:limit]  # a client's documented size limit is not a bug
        self._record("put", rank, key=key, value=value)
        self._call(rank, "put", key, self.ns + key, value)
        self.oracle[rank][key] = value
        self.maybe_lost[rank].discard(key)
        for p in self.pending:
            if p.rank == rank and p.key == key:
                p.allowed.append(value)

    @rule(rank=s.store_rank, key=s.keys)
    def get(self, rank: int, key: str) -> None:
        """A GET answers the oracle's value, or None (promptly) on a miss."""
        RULE_STEPS["store"] += 1
        self._record("get", rank, key=key)
        event("get hit" if key in self.oracle[rank] else "get miss")
        got = self._call(rank, "get", key, self.ns + key)
        self._expect(rank, f"get({key!r})", got, self._allowed(rank, key))
        self._saw(rank, key, got)

    @rule(rank=s.store_rank, key=s.keys)
    def contains(self, rank: int, key: str) -> None:
        """`contains` agrees with the oracle."""
        RULE_STEPS["store"] += 1
        self._record("contains", rank, key=key)
        got = self._call(rank, "contains", key, self.ns + key)
        if key in self.maybe_lost[rank] and got is False:
            self._saw(rank, key, got)
        elif got is not (key in self.oracle[rank]) and got != (key in self.oracle[rank]):
            self._fail("store-roundtrip", f"rank {rank}: contains({key!r}) returned {got!r}, "
                                          f"expected {key in self.oracle[rank]}")

    @rule(rank=s.store_rank, key=s.keys)
    def delete(self, rank: int, key: str) -> None:
        """Delete a key (present or not)."""
        RULE_STEPS["store"] += 1
        self._record("delete", rank, key=key)
        self._call(rank, "delete", key, self.ns + key)
        self.oracle[rank].pop(key, None)
        self.maybe_lost[rank].discard(key)
        for p in self.pending:
            if p.rank == rank and p.key == key:
                p.allowed.append(None)

    @rule(rank=s.store_rank, key=s.keys)
    def delete_then_read(self, rank: int, key: str) -> None:
        """A delete is seen at once by every read path, also right after the key was read (no stale read cache)."""
        RULE_STEPS["store"] += 1
        self.read_every_path(rank, key)
        self.delete(rank, key)
        self.read_every_path(rank, key)

    @rule(target=futures, rank=s.store_rank, key=s.keys)
    def get_async(self, rank: int, key: str) -> Pending:
        """Start an async GET; the call itself returns promptly with a future."""
        RULE_STEPS["store"] += 1
        self._record("get_async", rank, key=key)  # kept in the log only if the call itself fails
        future = self._call(rank, "get_async", key, self.ns + key)
        self.ops.pop()
        if not isinstance(future, concurrent.futures.Future):
            self._fail("store-error", f"rank {rank}: get_async({key!r}) returned {type(future).__name__}, "
                                      "not a concurrent.futures.Future")
        p = Pending(rank, key, future, self._allowed(rank, key))
        self.pending.append(p)
        return p

    @rule(p=futures)
    def wait(self, p: Pending) -> None:
        """Every async GET completes within the bound, with the value the key had meanwhile."""
        RULE_STEPS["store"] += 1
        self._await(p)

    def _await(self, p: Pending) -> None:
        self._record("get_async", p.rank, key=p.key)
        try:
            got = p.future.result(timeout=self.timeout)
        except concurrent.futures.TimeoutError:
            self._fail("store-hang", f"rank {p.rank}: the future of get_async({p.key!r}) did not complete within "
                                     f"{self.timeout:g} s")
        except Exception as exc:
            self._fail("store-error", f"rank {p.rank}: the future of get_async({p.key!r}) raised "
                                      f"{type(exc).__name__}: {exc}")
        self._expect(p.rank, f"get_async({p.key!r})", got, p.allowed)

    @precondition(lambda self: all("get_batch" in paths for paths in self.read_paths))
    @rule(rank=s.store_rank, keys=s.batch_keys)
    def get_batch(self, rank: int, keys: list[str]) -> None:
        """A batch GET answers, per key, what a single GET would."""
        RULE_STEPS["store"] += 1
        self._record("get_batch", rank, keys=keys)
        got = self._call(rank, "get_batch", keys, [self.ns + k for k in keys])
        got = list(got) if got is not None else None
        if got is None or len(got) != len(keys):
            self._fail("store-roundtrip", f"rank {rank}: get_batch({keys!r}) returned {got!r:.80}, "
                                          f"not {len(keys)} results")
        for k, g in zip(keys, got):
            self._expect(rank, f"get_batch(...{k!r}...)", g, self._allowed(rank, k))
            self._saw(rank, k, g)

    @rule(rank=s.store_rank, key=s.keys)
    def read_every_path(self, rank: int, key: str) -> None:
        """A key (written through `put`) reads the same through every read path the client has."""
        RULE_STEPS["store"] += 1
        expected = self._allowed(rank, key)
        self._record("get", rank, key=key)
        self._expect(rank, f"get({key!r})", self._call(rank, "get", key, self.ns + key), expected)
        if "get_async" in self.read_paths[rank]:
            self._record("get_async", rank, key=key)
            future = self._call(rank, "get_async", key, self.ns + key)
            self.ops.pop()
            self._await(Pending(rank, key, future, expected))
        if "get_batch" in self.read_paths[rank]:
            self._record("get_batch", rank, keys=[key])
            got = self._call(rank, "get_batch", [key], [self.ns + key])
            self._expect(rank, f"get_batch([{key!r}])", (list(got) or [b""])[0] if got else got, expected)

    @precondition(lambda self: self.plan is not None)
    @rule(which=s.fault_kind_index, rank=s.store_rank, key=s.keys)
    def strike(self, which: int, rank: int, key: str) -> None:
        """A real fault on rank's server (`--nemesis`): a read while it lasts answers within its bound (the oracle's
        value, a miss or an error), and once the server is back the client passes the recovery probe."""
        from engines.nemesis import fault_seconds
        RULE_STEPS["store"] += 1
        kind = self.plan.kinds[which % len(self.plan.kinds)]
        decision = (repr(self.ops), which, rank, key)
        if not DECIDED.setdefault(decision, kind.field not in STRUCK):
            return  # (struck once this session already)
        STRUCK.add(kind.field)
        control = self.plan.control_for(self.stores, kind)
        if control is None:  # these servers cannot take this kind (a process fault on a user's server)
            return
        fault = ServerFault(rank, "op", None, fault_seconds(kind, self.timeout))
        event(f"strike {kind.field}")
        self.ops.append({"op": "fault", "fault": kind.field, "rank": rank, "seconds": fault.seconds})
        try:
            kind.strike(control, fault)
            if kind.loses in ("all", "any"):
                self.maybe_lost[rank] |= set(self.oracle[rank])
                for p in self.pending:
                    if p.rank == rank:
                        p.allowed.append(None)
            self._record("get", rank, key=key)
            try:
                got = call_bounded(self.timeout, "get", key, self.stores[rank].get, self.ns + key)
            except StoreCallTimeout as exc:
                self._fail("fault-hang", f"{self._where(rank, 'get', key)} while {kind.text(fault)}: {exc}")
            except Exception:  # noqa: BLE001 - an error while a fault lasts is fine
                got = ...
            if got is not ... and got is not None and bytes(got) != self.oracle[rank].get(key):
                self._fail("fault-integrity", f"rank {rank}: get({key!r}) while {kind.text(fault)} returned "
                                              f"{_short(bytes(got))}, expected {_short(self.oracle[rank].get(key))} or a miss")
            healed = control.healed(fault.seconds + 10.0)
            self.ops.append({"op": "recover", "rank": rank})
            bound = self.plan.recovery_seconds or default_recovery_seconds(self.timeout)
            got = probe(BoundedStore(self.stores[rank], self.timeout), healed_at=healed, recovery_seconds=bound,
                        op_timeout=self.timeout)
            if not got.ok:
                self._fail("recovery", f"rank {rank}: {bound:g} s after its server was back from {kind.field} the "
                                       f"client still fails ({got.attempts} attempts): {got.why}")
        finally:
            control.close()

    # -- the end ---------------------------------------------------------------------------------------
    def teardown(self) -> None:
        """Every outstanding async GET completes; the client still answers; the keys written are removed."""
        if self.failed:
            return
        for p in self.pending:
            self._await(p)
        probe = "probe absent"  # a space: no drawn key has one
        for r in range(len(self.stores)):
            # a miss, then one more call: the client must still answer after its last op and after a miss
            self._record("get", r, key=probe)
            self._expect(r, f"get({probe!r}) at the end", self._call(r, "get", probe, self.ns + probe), [None])
            self._record("contains", r, key=probe)
            if self._call(r, "contains", probe, self.ns + probe):
                self._fail("store-roundtrip", f"rank {r}: contains({probe!r}) of a never-written key returned true")
            for key in self.oracle[r]:
                self._call(r, "delete", key, self.ns + key)
