"""The store-client layer as a Hypothesis state machine: `StoreMachine` drives a client's `RankStore`s (put, get,
contains, delete, get_async, wait, get_batch, every declared path) against an in-memory oracle, every call bounded
in time. A client that can share its servers runs as two clients of the same servers (`runtime.tier`), each op from
either, and the servers evict by themselves too: the oracle is one register per key per server."""
from __future__ import annotations

import concurrent.futures
import itertools
import time
from typing import Any

from hypothesis.stateful import Bundle, RuleBasedStateMachine, precondition, rule

from model.codec import preview
from model.contract import StoreCallTimeout, declared_paths
from model.faults import ServerFault
from model.history import VALUE_READS, answer, read_args, wrong_key
from model.recovery import default_recovery_seconds, probe
from model.outcome import Violation
from model.trace import Trace, encode
from properties import config, strategies as s
from runtime.bounded import BoundedStore, call_bounded
from properties.reporting import PATH_CALLS, RULE_STEPS, VIOLATED, event, final_run, note, write_found

__all__ = ["StoreMachine", "Pending", "ANSWER_PROPERTIES", "STRUCK", "DECIDED"]


# == the store-client layer ==============================================================================
class Pending:
    """An outstanding `get_async`: its future and every value it may rightly resolve to."""

    def __init__(self, rank: int, key: str, future: Any, allowed: list, client: int = 0) -> None:
        self.rank, self.key, self.future, self.allowed, self.client = rank, key, future, allowed, client

    def __repr__(self) -> str:
        return f"Pending(rank={self.rank}, key={self.key!r}, client={self.client})"


_namespaces = itertools.count()
#: The real-fault kinds the store machine has struck in this session: each strikes once per session (a strike costs
#: its fault's length; the concurrent layer and `check`'s nemesis engine strike every kind again). `DECIDED` keeps
#: each decision by the ops before it and the rule's draws, so Hypothesis's replay of a failing example strikes
#: exactly where the failing run did.
STRUCK: set[str] = set()
DECIDED: dict[tuple, bool] = {}
#: Violations that are a wrong answer: the client stays usable (the others may have wedged it).
ANSWER_PROPERTIES = ("store-roundtrip", "wrong-key", "shared-tier")


def _has_batch(self: "StoreMachine") -> bool:
    return all("get_batch" in paths for paths in self.paths)


class StoreMachine(RuleBasedStateMachine):
    """A client's stores (two ranks; two clients of the same servers when it can share them) against a dict
    oracle, every call bounded in time."""

    futures = Bundle("futures")

    def __init__(self) -> None:
        super().__init__()
        self.cfg = config.current()
        self.clients, self.shared = self.cfg.store_clients(s.STORE_RANKS)
        self.stores = self.clients[0]
        self.timeout = self.cfg.op_timeout
        self.paths = [tuple(p for p in declared_paths(st) if all(p in declared_paths(c[r]) for c in self.clients))
                      for r, st in enumerate(self.stores)]
        self.oracle: list[dict[str, bytes]] = [{} for _ in self.stores]
        self.held: list[dict[str, list[bytes]]] = [{} for _ in self.stores]  # every value each key was put
        self.by: list[dict[str, Any]] = [{} for _ in self.stores]  # who changed each key last: a client, "server"
        # what each client last wrote or read of each key (a client-local view: a stale answer equals it)
        self.seen: list[list[dict[str, bytes | None]]] = [[{} for _ in self.stores] for _ in self.clients]
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
        if prop not in ANSWER_PROPERTIES:
            self.cfg.discard()  # a client that hung or raised may be unusable; a wrong answer leaves it usable
        if final_run() and self.cfg.write_traces:
            clients = {"clients": len(self.clients)} if len(self.clients) > 1 else {}
            trace = Trace.of("store-ops", [Violation(prop, message)], client=self.cfg.client_label(),
                             config={"n_ranks": len(self.stores), "op_timeout": self.timeout, **clients},
                             ops=[{k: encode(v) for k, v in op.items()} for op in self.ops],
                             origin="pytest properties/ (StoreMachine)")
            trace = self._minimised(trace)
            note(f"counterexample trace: {write_found(trace, self.cfg, self.cfg.client_label(), prop)}")
        raise VIOLATED[prop](f"{prop}: {message}")

    def _minimised(self, trace: Trace) -> Trace:
        """The trace with as few ops as still fail on fresh stores (`checking.storeops.minimise_store_ops`),
        within `minimise_seconds`: with a real client Hypothesis does not shrink, so this is what does."""
        if len(trace.ops) < 2 or self.cfg.minimise_seconds <= 0 or self.cfg.in_memory():
            return trace  # (Hypothesis has shrunk a model client's run)
        from checking.storeops import minimise_store_ops

        stop_at = time.monotonic() + self.cfg.minimise_seconds
        trace, _ = minimise_store_ops(trace, self.cfg.resolved_client(),
                                     should_stop=lambda: time.monotonic() >= stop_at, progress=note,
                                     control_for=self.plan.control if self.plan is not None else None)
        return trace

    def _call(self, rank: int, op: str, key: Any, *args: Any, client: int = 0) -> Any:
        PATH_CALLS[op] += 1
        fn = getattr(self.clients[client][rank], op)
        try:
            if self.cfg.in_memory():
                # the reference in-memory store (exactly that class) is a dict and cannot block: no thread hop
                return fn(*args)
            return call_bounded(self.timeout, op, str(key), fn, *args)
        except StoreCallTimeout as exc:
            self._fail("store-hang", f"{self._where(rank, op, key, client)}: {exc}")
        except Exception as exc:
            self._fail("store-error", f"{self._where(rank, op, key, client)} raised {type(exc).__name__}: {exc}")

    def _where(self, rank: int, op: str, key: Any, client: int = 0) -> str:
        where = f"rank {rank}{f' client {client}' if client else ''}: {op}({key!r})"
        if len(self.ops) > 1:
            where += f" after {self.ops[-2]['op']}({self.ops[-2].get('key', self.ops[-2].get('keys'))!r})"
        return where

    def _record(self, op: str, rank: int, client: int = 0, **args: Any) -> None:
        """Log an op, before it runs, in `checking.storeops.run_ops`'s vocabulary (where `get_async` also waits)."""
        self.ops.append({"op": op, "rank": rank, **args, **({"client": client} if client else {})})

    def _client(self, client: int) -> int:
        return client % len(self.clients)

    def _changed(self, rank: int, key: str, value: bytes | None, who: Any) -> None:
        """The oracle after a write (`value`; None: deleted or evicted) by `who`; pending reads may see it too."""
        self.maybe_lost[rank].discard(key)
        if value is None:
            self.oracle[rank].pop(key, None)
        else:
            self.oracle[rank][key] = value
            self.held[rank].setdefault(key, []).append(value)
        self.by[rank][key] = who
        if who != "server":
            self.seen[who][rank][key] = value
        for p in self.pending:
            if p.rank == rank and p.key == key:
                p.allowed.append(value)

    def _expect(self, rank: int, what: str, got: Any, allowed: list, key: str, client: int = 0) -> None:
        """`got` is one of `allowed`; else a value put for another key and never for `key` is `wrong-key`, an
        answer that misses another client's or the server's change `shared-tier`, any other `store-roundtrip`."""
        if got is not None and not isinstance(got, (bytes, bytearray, memoryview)):
            self._fail("store-roundtrip", f"rank {rank}: {what} returned {type(got).__name__}, not bytes or None")
        value = None if got is None else bytes(got)
        if key in self.maybe_lost[rank]:  # a real fault may have lost it: a miss says it did, the value that it did not
            if value is None:
                self._changed(rank, key, None, "server")
                return
            self.maybe_lost[rank].discard(key)
        if value in allowed:
            self.seen[client][rank][key] = value
            return
        shown = " or ".join(preview(a) for a in allowed)
        where = f"rank {rank}{f' client {client}' if client else ''}"
        crossed = wrong_key([key], value, allowed[0], self.held[rank])
        if crossed is not None:
            self._fail("wrong-key", f"{where}: {what} answered {key!r} with a value put for {crossed[1]!r} "
                                    f"({preview(value)}), expected {shown}")
        stale = self._unseen_change(rank, key, client, lambda seen: seen == value)
        if stale:
            self._fail("shared-tier", f"{where}: {what} returned {preview(value)}, expected {shown}: {stale}")
        self._fail("store-roundtrip", f"{where}: {what} returned {preview(value)}, expected {shown}")

    def _unseen_change(self, rank: int, key: str, client: int, stale: Any) -> str:
        """Why a wrong answer is a change this client did not see ('' if it is not): another client or the server
        changed `key` last, and the answer is what this client last wrote or read of it (`stale(seen value)`)."""
        who = self.by[rank].get(key, client)
        if who == client or key not in self.seen[client][rank] or not stale(self.seen[client][rank][key]):
            return ""
        did = "deleted" if key not in self.oracle[rank] else "overwrote"
        whom = "the server evicted it" if who == "server" else f"client {who} {did} it"
        return f"{whom}, and this client answered what it had seen before"

    # -- rules -----------------------------------------------------------------------------------------
    @rule(rank=s.store_rank, key=s.keys, value=s.values, client=s.store_client)
    def put(self, rank: int, key: str, value: bytes, client: int = 0) -> None:
        """Write a value; the oracle records it."""
        RULE_STEPS["store"] += 1
        client = self._client(client)
        limit = getattr(self.clients[client][rank], "max_value_bytes", None)
        value = value if limit is None else value[:limit]  # a client's documented size limit is not a bug
        self._record("put", rank, client, key=key, value=value)
        self._call(rank, "put", key, self.ns + key, value, client=client)
        self._changed(rank, key, value, client)

    @rule(rank=s.store_rank, key=s.keys, client=s.store_client)
    def get(self, rank: int, key: str, client: int = 0) -> None:
        """A GET answers the oracle's value, or None (promptly) on a miss."""
        RULE_STEPS["store"] += 1
        client = self._client(client)
        self._record("get", rank, client, key=key)
        event("get hit" if key in self.oracle[rank] else "get miss")
        got = self._call(rank, "get", key, self.ns + key, client=client)
        self._expect(rank, f"get({key!r})", got, [self.oracle[rank].get(key)], key, client)

    @rule(rank=s.store_rank, key=s.keys, client=s.store_client)
    def contains(self, rank: int, key: str, client: int = 0) -> None:
        """`contains` agrees with the oracle."""
        RULE_STEPS["store"] += 1
        self._read_path(rank, "contains", key, self.oracle[rank].get(key), self._client(client))

    @rule(rank=s.store_rank, key=s.keys, client=s.store_client)
    def delete(self, rank: int, key: str, client: int = 0) -> None:
        """Delete a key (present or not)."""
        RULE_STEPS["store"] += 1
        client = self._client(client)
        self._record("delete", rank, client, key=key)
        self._call(rank, "delete", key, self.ns + key, client=client)
        self._changed(rank, key, None, client)

    @precondition(lambda self: self.shared is not None and self.shared.can_evict())
    @rule(rank=s.store_rank, key=s.keys)
    def server_evicts(self, rank: int, key: str) -> None:
        """The server evicts a key by itself (its LRU, another tenant's flush): no client sees it first."""
        RULE_STEPS["store"] += 1
        self._record("evict", rank, key=key)
        try:
            self.shared.evict(rank, self.ns + key)
        except OSError as exc:  # the admin connection to the server, not the client, failed
            raise RuntimeError(f"the server of rank {rank} could not evict {key!r}: {exc}") from exc
        self._changed(rank, key, None, "server")

    @rule(rank=s.store_rank, key=s.keys, client=s.store_client, deleter=s.store_client)
    def delete_then_read(self, rank: int, key: str, client: int = 0, deleter: int = 0) -> None:
        """A delete (by this client or another of the same servers) is seen at once by every read path, also right
        after the key was read (no stale read cache)."""
        RULE_STEPS["store"] += 1
        self.read_every_path(rank, key, client)
        self.delete(rank, key, deleter)
        self.read_every_path(rank, key, client)

    @rule(target=futures, rank=s.store_rank, key=s.keys, client=s.store_client)
    def get_async(self, rank: int, key: str, client: int = 0) -> Pending:
        """Start an async GET; the call itself returns promptly with a future."""
        RULE_STEPS["store"] += 1
        client = self._client(client)
        self._record("get_async", rank, client, key=key)  # kept in the log only if the call itself fails
        future = self._call(rank, "get_async", key, self.ns + key, client=client)
        self.ops.pop()
        if not isinstance(future, concurrent.futures.Future):
            self._fail("store-error", f"rank {rank}: get_async({key!r}) returned {type(future).__name__}, "
                                      "not a concurrent.futures.Future")
        p = Pending(rank, key, future, [self.oracle[rank].get(key)], client)
        self.pending.append(p)
        return p

    @rule(p=futures)
    def wait(self, p: Pending) -> None:
        """Every async GET completes within the bound, with the value the key had meanwhile."""
        RULE_STEPS["store"] += 1
        self._await(p)

    def _await(self, p: Pending) -> None:
        self._record("get_async", p.rank, p.client, key=p.key)
        try:
            got = p.future.result(timeout=self.timeout)
        except concurrent.futures.TimeoutError:
            self._fail("store-hang", f"rank {p.rank}: the future of get_async({p.key!r}) did not complete within "
                                     f"{self.timeout:g} s")
        except Exception as exc:
            self._fail("store-error", f"rank {p.rank}: the future of get_async({p.key!r}) raised "
                                      f"{type(exc).__name__}: {exc}")
        self._expect(p.rank, f"get_async({p.key!r})", got, p.allowed, p.key, p.client)

    @precondition(_has_batch)
    @rule(rank=s.store_rank, keys=s.batch_keys, client=s.store_client)
    def get_batch(self, rank: int, keys: list[str], client: int = 0) -> None:
        """A batch GET answers, per key, what a single GET would."""
        RULE_STEPS["store"] += 1
        client = self._client(client)
        self._record("get_batch", rank, client, keys=keys)
        got = self._call(rank, "get_batch", keys, [self.ns + k for k in keys], client=client)
        got = list(got) if got is not None else None
        if got is None or len(got) != len(keys):
            self._fail("store-roundtrip", f"rank {rank}: get_batch({keys!r}) returned {got!r:.80}, "
                                          f"not {len(keys)} results")
        for k, g in zip(keys, got):
            self._expect(rank, f"get_batch({keys!r}) for {k!r}", g, [self.oracle[rank].get(k)], k, client)

    @precondition(_has_batch)
    @rule(rank=s.store_rank, keys=s.batch_keys, key=s.keys, value=s.values, client=s.store_client)
    def batch_around_a_write(self, rank: int, keys: list[str], key: str, value: bytes, client: int = 0) -> None:
        """A batch with a fresh write among other keys (misses, mostly) answers per key what a single GET would,
        whether the misses come before or after the hit."""
        self.put(rank, key, value, client)
        self.get_batch(rank, keys + [key] + keys, client)

    @rule(rank=s.store_rank, key=s.keys, client=s.store_client)
    def read_every_path(self, rank: int, key: str, client: int = 0) -> None:
        """A key reads the same through every read path the client declares (`paths`). Each path is held to the
        register as the reads before it left it: of a key a fault may have lost, the first read settles whether it
        survived (`_expect`), and every later path must agree with that, not with the value from before the fault."""
        RULE_STEPS["store"] += 1
        client = self._client(client)
        self._record("get", rank, client, key=key)
        got = self._call(rank, "get", key, self.ns + key, client=client)
        self._expect(rank, f"get({key!r})", got, [self.oracle[rank].get(key)], key, client)
        for path in self.paths[rank]:
            if path == "get":
                continue
            value = self.oracle[rank].get(key)
            if path == "get_async":
                self._record("get_async", rank, client, key=key)
                future = self._call(rank, "get_async", key, self.ns + key, client=client)
                self.ops.pop()
                self._await(Pending(rank, key, future, [value], client))
                continue
            self._read_path(rank, path, key, value, client)

    def _read_path(self, rank: int, path: str, key: str, value: bytes | None, client: int = 0) -> None:
        """One read of `key` through the declared `path` (not get_async), compared with the register's answer."""
        multi = path not in ("get", "get_sync", "contains")
        self._record(path, rank, client, **({"keys": [key]} if multi else {"key": key}))
        got = self._call(rank, path, [key] if multi else key, *read_args(path, [self.ns + key]), client=client)
        want = answer(path, [value])
        if path in VALUE_READS:
            if multi:
                got = list(got) if isinstance(got, (list, tuple)) else got
                if not isinstance(got, list) or len(got) != len(want):
                    self._fail("store-roundtrip", f"rank {rank}: {path}([{key!r}]) returned {got!r:.80}, "
                                                  f"not {len(want)} result(s)")
                for g in got:
                    self._expect(rank, f"{path}([{key!r}])", g, [value], key, client)
            else:
                self._expect(rank, f"{path}({key!r})", got, [value], key, client)
        elif got != want and key in self.maybe_lost[rank] and got == answer(path, [None]):
            self._changed(rank, key, None, "server")  # a real fault lost it
        elif got != want:
            stale = self._unseen_change(rank, key, client, lambda seen: answer(path, [seen]) == got)
            self._fail("shared-tier" if stale else "store-roundtrip",
                       f"rank {rank}{f' client {client}' if client else ''}: {path}({[key] if multi else key!r}) "
                       f"returned {got!r:.80}, expected {want!r}{f': {stale}' if stale else ''}")

    @precondition(lambda self: self.plan is not None)
    @rule(which=s.fault_kind_index, rank=s.store_rank, key=s.keys)
    def strike(self, which: int, rank: int, key: str) -> None:
        """A real fault on rank's server (`--nemesis`): a read while it lasts answers within its bound (the oracle's
        value, a miss or an error; an async read still in flight when it strikes may miss too), and once the server
        is back the client passes the recovery probe."""
        from checking.nemesis_strategy import fault_seconds
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
        in_flight = [p for p in self.pending if p.rank == rank and not p.future.done()]
        try:
            kind.strike(control, fault)
            if kind.loses in ("all", "any"):
                self.maybe_lost[rank] |= set(self.oracle[rank])
            for p in (self.pending if kind.loses in ("all", "any") else in_flight):
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
                                              f"{preview(bytes(got))}, expected {preview(self.oracle[rank].get(key))} or a miss")
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
            self._expect(r, f"get({probe!r}) at the end", self._call(r, "get", probe, self.ns + probe), [None], probe)
            self._record("contains", r, key=probe)
            if self._call(r, "contains", probe, self.ns + probe):
                self._fail("store-roundtrip", f"rank {r}: contains({probe!r}) of a never-written key returned true")
            for key in self.oracle[r]:
                self._call(r, "delete", key, self.ns + key)
