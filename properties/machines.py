"""The two property layers as Hypothesis state machines.

- `ProtocolMachine`: stores prompts, evicts, looks up, starts loads, moves one rank at a time and injects
  faults; every finished episode is checked with `model.checks.check_outcome` (all the contract's properties);
  with the in-memory client a failing episode must also replay under `model.harness.run_case` to the same
  verdict (else the failure is `replay`: the stepping is wrong).
- `StoreMachine`: drives one client's `RankStore`s (put, get, contains, delete, get_async, wait, get_batch)
  against an in-memory oracle, every call bounded in time.

Both read their protocol and client from `properties.config.current()` (set by the pytest plugin's
`--protocol` / `--client`). A failure raises one `<Property>Violated` exception per violated property (an
`ExceptionGroup` of them when several are), so Hypothesis shrinks each distinct failure on its own; the final
(minimal) failing run also writes a `model.trace.Trace` under the configured `found_dir`.

The program Hypothesis prints for a failure runs as-is after `from properties.machines import *`.
"""
from __future__ import annotations

import collections
import concurrent.futures
import itertools
import re
import time
from pathlib import Path
from typing import Any

from hypothesis import event as _hyp_event, note as _hyp_note
from hypothesis.control import current_build_context
from hypothesis.errors import InvalidArgument
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, precondition, rule

from model.checks import PROPERTIES, STORE_PROPERTIES
from model.contract import StoreCallTimeout
from model.harness import run_case
from model.outcome import Violation
from model.trace import Trace, encode
from runtime.watchdog import forget
from properties import config, strategies as s
from runtime.bounded import BoundedStore, call_bounded
from properties.stepping import DONE, LOADING, LOOKED_UP, STORED, Episode

__all__ = ["ProtocolMachine", "StoreMachine", "PropertyViolated", "STORE_PROPERTIES", "RULE_STEPS", "PATH_CALLS",
           "violated_properties", "write_found"]

#: Rule executions per layer (`properties.bench` reads it).
RULE_STEPS: collections.Counter = collections.Counter()
#: Store-client calls per path (`get`, `get_async`, `get_batch`, ...) the store layer made (check's coverage).
PATH_CALLS: collections.Counter = collections.Counter()



class PropertyViolated(AssertionError):
    """A property of the contract did not hold; `property` names it."""

    property: str = ""


def _class_name(prop: str) -> str:
    return "".join(part.capitalize() for part in re.split(r"[^a-zA-Z0-9]+", prop)) + "Violated"


#: One exception class per property, so that Hypothesis tells distinct failures apart.
VIOLATED: dict[str, type[PropertyViolated]] = {}
for _prop in (*PROPERTIES, *STORE_PROPERTIES, "replay"):
    _cls = type(_class_name(_prop), (PropertyViolated,), {"property": _prop, "__module__": __name__})
    VIOLATED[_prop] = globals()[_cls.__name__] = _cls
    __all__.append(_cls.__name__)


def _violation_error(v: Violation) -> PropertyViolated:
    cls = VIOLATED.get(v.property) or type(_class_name(v.property), (PropertyViolated,), {"property": v.property})
    return cls(f"{v.property}: {v.summary}")


def raise_violations(violations: list[Violation], context: str) -> None:
    """Raise the violations: one exception, or a group of one per distinct property."""
    first: dict[str, Violation] = {}
    for v in violations:
        first.setdefault(v.property, v)
    errors = [_violation_error(v) for v in first.values()]
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise ExceptionGroup(f"{context}: violated {', '.join(first)}", errors)


def violated_properties(exc: BaseException) -> set[str]:
    """The property names carried by `exc` (a `PropertyViolated` or a group holding some)."""
    if isinstance(exc, BaseExceptionGroup):
        return set().union(*(violated_properties(e) for e in exc.exceptions))
    return {exc.property} if isinstance(exc, PropertyViolated) else set()


def _final_run() -> bool:
    """Whether this is the run Hypothesis reports (or a run outside Hypothesis, e.g. a pasted program)."""
    return current_build_context().is_final if _in_hypothesis() else True


def _in_hypothesis() -> bool:
    try:
        current_build_context()
    except InvalidArgument:
        return False
    return True


def note(text: str) -> None:
    """Hypothesis's `note` inside a test; printed when a program runs outside one (a pasted failing program)."""
    if _in_hypothesis():
        _hyp_note(text)
    else:
        print(text)


def event(text: str) -> None:
    """Hypothesis's `event` (statistics) inside a test; nothing outside one."""
    if _in_hypothesis():
        _hyp_event(text)


def write_found(trace: Trace, found_dir: str | Path, *parts: str) -> Path:
    """Save `trace` under `found_dir` (`Trace.save_unique`: named by content, never overwriting)."""
    return trace.save_unique(found_dir, *parts)


# == the protocol layer ================================================================================
class ProtocolMachine(RuleBasedStateMachine):
    """Episodes of one prompt: store, evict, look up, load one rank step at a time, with faults.

    After an episode ends (checked), the next rule opens a fresh one with the same sizes, and `lookup`,
    `start_load` and `move` first take the steps before them that have not happened yet. So every
    rule is meaningful in every state, which keeps preconditions (and Hypothesis's rejected draws) away and
    lets the shrinker delete any step.
    """

    def __init__(self) -> None:
        super().__init__()
        if _final_run():  # the run Hypothesis reports judges a stall at the full limit (see runtime.watchdog)
            forget()
        self.cfg = config.current()
        self.protocol = self.cfg.protocol_object()
        self.ep: Episode | None = None
        self.sizes: tuple[int, int, str, tuple] = (1, 0, "s0", ())

    def _open(self, n_ranks: int, n_chunks: int, salt: str, others: tuple = ()) -> Episode:
        self.sizes = (n_ranks, n_chunks, salt, others)
        # a real client's calls are bounded, so a blocking one is a hang, not a stuck test run
        stores = self.cfg.stores(n_ranks)
        if not self.cfg.in_memory():
            stores = [BoundedStore(st, self.cfg.op_timeout) for st in stores]
        self.ep = Episode(self.protocol, stores, n_ranks, n_chunks, salt, wait_bound=self.cfg.op_timeout,
                          others=others)
        self._check_if_done()
        return self.ep

    def _episode(self) -> Episode:
        """The open episode; after one ended, a fresh one of the same sizes (opened when first needed)."""
        return self.ep if self.ep is not None else self._open(*self.sizes)

    # -- rules --------------------------------------------------------------------------------------
    @initialize(n_ranks=s.n_ranks, n_chunks=s.n_chunks, salt=s.salts)
    def first_prompt(self, n_ranks: int, n_chunks: int, salt: str) -> None:
        """Every rank runs `rank_store` for the first prompt."""
        RULE_STEPS["protocol"] += 1
        self._open(n_ranks, n_chunks, salt)

    @rule(n_ranks=s.n_ranks, n_chunks=s.n_chunks, salt=s.salts)
    def store_prompt(self, n_ranks: int, n_chunks: int, salt: str) -> None:
        """Finish (and check) the open episode, then every rank stores a new prompt."""
        RULE_STEPS["protocol"] += 1
        if self.ep is not None:
            self.ep.finish()
            self._check_if_done()
        self._open(n_ranks, n_chunks, salt)

    @rule(n_ranks=s.n_ranks, n_chunks=s.n_chunks, salt=s.salts, others=s.other_prompts)
    def store_prompts(self, n_ranks: int, n_chunks: int, salt: str, others: list) -> None:
        """Finish (and check) the open episode, then a new prompt is stored in a tier that other prompts share
        (stored before or after it, sharing a prefix or not, some of their chunks evicted)."""
        RULE_STEPS["protocol"] += 1
        if self.ep is not None:
            self.ep.finish()
            self._check_if_done()
        self._open(n_ranks, n_chunks, salt, tuple(others))

    @precondition(lambda self: self.sizes[1] > 0)
    @rule(chunk=s.chunk_index, rank=s.evict_rank)
    def evict(self, chunk: int, rank: int | None) -> None:
        """Evict a chunk's keys (from one rank or all): before lookup, after it, or during the load."""
        RULE_STEPS["protocol"] += 1
        ep = self._episode()
        e = ep.evict(chunk % ep.k, None if rank is None else rank % ep.n)
        event(f"evict while {ep.phase}")
        note(f"evicted {e} while {ep.phase}")

    @rule()
    def lookup(self) -> None:
        """All ranks look up at one instant and the scheduler plans the load (once per episode)."""
        RULE_STEPS["protocol"] += 1
        self._lookup()

    def _lookup(self) -> None:
        if self._episode().phase == STORED:
            self.ep.lookup()
            out = self.ep.out
            note(f"lookup: cached {sorted(out.cached)}, LCP {out.lcp}, reports {out.reports}, planned {out.planned}")
            self._check_lookup()
            self._check_if_done()

    @rule(rank=s.rank_index, ahead=s.async_ahead)
    def lose_completion(self, rank: int, ahead: int) -> None:
        """A rank's upcoming GetAsync completion will never arrive."""
        RULE_STEPS["protocol"] += 1
        ep = self._episode()
        note(f"lost completion {ep.lose(rank % ep.n, ahead)}")

    @rule(rank=s.rank_index, ahead=s.async_ahead, seconds=s.delays)
    def delay_completion(self, rank: int, ahead: int, seconds: float) -> None:
        """A rank's upcoming GetAsync completion arrives late."""
        RULE_STEPS["protocol"] += 1
        ep = self._episode()
        note(f"delayed completion {ep.delay(rank % ep.n, ahead, seconds)}")

    @rule()
    def start_load(self) -> None:
        """Every rank starts its load program (looking up first if that has not happened)."""
        RULE_STEPS["protocol"] += 1
        self._start_load()

    def _start_load(self) -> None:
        self._lookup()
        if self.ep is not None and self.ep.phase == LOOKED_UP:
            self.ep.start_load()
            self._check_if_done()

    @rule(choice=s.move_choice)
    def move(self, choice: int) -> None:
        """Hypothesis picks which runnable rank takes its next effect (starting the load if need be)."""
        RULE_STEPS["protocol"] += 1
        self._start_load()
        if self.ep is not None and self.ep.phase == LOADING:
            self.ep.move(choice)
            self._check_if_done()

    @rule()
    def finish(self) -> None:
        """Run the rest of the episode (lowest runnable rank first) and check it."""
        RULE_STEPS["protocol"] += 1
        self._episode().finish()
        self._check_if_done()

    # -- the checks ----------------------------------------------------------------------------------
    # Checked where the state changes rather than as Hypothesis `@invariant`s run after every rule: the
    # lookup right after it is made, everything else when the episode ends (a move that desyncs, deadlocks
    # or hangs ends it at once).
    def _check_lookup(self) -> None:
        """Right after the lookup: `planned == LCP` (soundness and completeness)."""
        if self.ep.phase == LOOKED_UP and self.ep.lookup_violations():
            # finish the episode first, so every later property (e.g. within-plan) is reported with it
            self.ep.finish()

    def _check_if_done(self) -> None:
        """When the episode is over: every property of the contract (the next rule opens a fresh episode)."""
        ep = self.ep
        if ep is None or ep.phase != DONE:
            return
        self.ep = None
        out = ep.out
        event(f"episode: {ep.n} ranks, {ep.k} chunks, {min(ep.faults().size(), 3)}{'+' * (ep.faults().size() >= 3)} "
              f"faults, planned {'< LCP' if (out.planned or 0) < out.lcp else '= LCP' if out.planned == out.lcp else '> LCP'}")
        if not out.violations or not {"hang", "termination"} & set(out.violated()):
            try:
                ep.cleanup()
            except Exception:  # a client that fails even to delete: start over with fresh stores
                self.cfg.discard()
        else:
            self.cfg.discard()  # a client that hung or raised may be unusable (a real one restarts its servers)
        if not out.violations:
            return
        if _final_run():
            note(f"case: {ep.case()!r}")
            if self.cfg.write_traces:
                found = self._minimised(ep.case(), out)
                trace = Trace.from_outcome(found, protocol_ref=self.cfg.protocol_ref(), client=self.cfg.client_label(),
                                           origin="pytest properties/ (ProtocolMachine)")
                path = write_found(trace, self.cfg.found_dir, out.protocol, out.violations[0].property)
                note(f"counterexample trace: {path}")
        if self.cfg.in_memory():
            # the simulator replays a run over in-memory stores: it must see what the machine saw (a real
            # client's run may differ, e.g. where the client hung; `shardcheck replay --client` replays those)
            replay = run_case(self.protocol, ep.case())
            if set(replay.violated()) != set(out.violated()):
                raise VIOLATED["replay"](f"run_case replays this episode to {replay.violated()}, the machine saw "
                                         f"{out.violated()}")
        raise_violations(out.violations, f"protocol {out.protocol}")

    def _minimised(self, case: Any, out: Any) -> Any:
        """The outcome of the smallest case (`engines.minimise.minimise`) that still shows the first violation,
        re-run on fresh stores of a real client within `minimise_seconds` (Hypothesis does not shrink runs of
        a real client; on the model it has, and `out` is returned as it is)."""
        if self.cfg.in_memory() or self.cfg.minimise_seconds <= 0:
            return out
        from runtime.pool import ClientPool
        from engines.minimise import minimise
        from engines.search import Found

        stop_at = time.monotonic() + self.cfg.minimise_seconds
        pool = ClientPool(self.cfg.resolved_client(), op_timeout=self.cfg.op_timeout)
        try:
            found = minimise(self.protocol, Found(case, out, "pytest"), runner=pool.run,
                             should_stop=lambda: time.monotonic() >= stop_at)
        finally:
            pool.close()
        if found.case != case:
            note(f"minimised on fresh stores to: {found.case!r}")
        return found.outcome

    def teardown(self) -> None:
        """Finish and check the open episode, so every run ends with a full check."""
        if self.ep is not None:
            self.ep.finish()
            self._check_if_done()


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

    # -- calling the client -----------------------------------------------------------------------------
    def _fail(self, prop: str, message: str) -> None:
        self.failed = True
        if prop != "store-roundtrip":
            self.cfg.discard()  # a client that hung or raised may be unusable; a wrong answer leaves it usable
        if _final_run() and self.cfg.write_traces:
            trace = Trace(kind="store-ops", property=prop, summary=message, protocol={"name": "-", "ref": None},
                          client=self.cfg.client_label(),
                          config={"n_ranks": len(self.stores), "op_timeout": self.timeout},
                          ops=[{k: encode(v) for k, v in op.items()} for op in self.ops],
                          verdict={"violations": [{"property": prop, "summary": message, "detail": {}}]},
                          origin="pytest properties/ (StoreMachine)")
            trace = self._minimised(trace)
            note(f"counterexample trace: {write_found(trace, self.cfg.found_dir, self.cfg.client_label(), prop)}")
        raise VIOLATED[prop](f"{prop}: {message}")

    def _minimised(self, trace: Trace) -> Trace:
        """The trace with as few ops as still fail on fresh stores (`engines.storeops.minimise_store_ops`),
        within `minimise_seconds`: with a real client Hypothesis does not shrink, so this is what does."""
        if len(trace.ops) < 2 or self.cfg.minimise_seconds <= 0 or self.cfg.in_memory():
            return trace  # (Hypothesis has shrunk a model client's run)
        from engines.storeops import minimise_store_ops

        stop_at = time.monotonic() + self.cfg.minimise_seconds
        trace, _ = minimise_store_ops(trace, self.cfg.resolved_client(),
                                     should_stop=lambda: time.monotonic() >= stop_at, progress=note)
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
        for p in self.pending:
            if p.rank == rank and p.key == key:
                p.allowed.append(value)

    @rule(rank=s.store_rank, key=s.keys)
    def get(self, rank: int, key: str) -> None:
        """A GET answers the oracle's value, or None (promptly) on a miss."""
        RULE_STEPS["store"] += 1
        self._record("get", rank, key=key)
        event("get hit" if key in self.oracle[rank] else "get miss")
        self._expect(rank, f"get({key!r})", self._call(rank, "get", key, self.ns + key), [self.oracle[rank].get(key)])

    @rule(rank=s.store_rank, key=s.keys)
    def contains(self, rank: int, key: str) -> None:
        """`contains` agrees with the oracle."""
        RULE_STEPS["store"] += 1
        self._record("contains", rank, key=key)
        got = self._call(rank, "contains", key, self.ns + key)
        if got is not (key in self.oracle[rank]) and got != (key in self.oracle[rank]):
            self._fail("store-roundtrip", f"rank {rank}: contains({key!r}) returned {got!r}, "
                                          f"expected {key in self.oracle[rank]}")

    @rule(rank=s.store_rank, key=s.keys)
    def delete(self, rank: int, key: str) -> None:
        """Delete a key (present or not)."""
        RULE_STEPS["store"] += 1
        self._record("delete", rank, key=key)
        self._call(rank, "delete", key, self.ns + key)
        self.oracle[rank].pop(key, None)
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
        p = Pending(rank, key, future, [self.oracle[rank].get(key)])
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
            self._expect(rank, f"get_batch(...{k!r}...)", g, [self.oracle[rank].get(k)])

    @rule(rank=s.store_rank, key=s.keys)
    def read_every_path(self, rank: int, key: str) -> None:
        """A key (written through `put`) reads the same through every read path the client has."""
        RULE_STEPS["store"] += 1
        expected = [self.oracle[rank].get(key)]
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
