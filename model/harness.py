"""One run of a protocol: store, evict, look up (all ranks at one instant), load; then every check.

`run_case(protocol, case, stores)` is the single entry point the enumerator, the explorer's replays,
the properties, the proofs' counterexamples and `shardcheck replay` all use.
"""
from __future__ import annotations

import hashlib
from typing import Any, Callable, Sequence

import attrs

from model.checks import check_outcome
from model.contract import RankStore, StoreCallTimeout
from model.effects import Put
from model.faults import Eviction
from model.outcome import Case, Event, OtherPrompt, Outcome, Violation, default_step_bound, leading_run
from model.sim import lowest_runnable, seeded_chooser, simulate
from model.store import memory_factory
from model.calls import DEFAULT_OP_TIMEOUT, ProtocolRaised, Stalled, protocol_call
from model.recovery import default_recovery_seconds, probe


__all__ = ["chunk_hashes", "kv_bytes", "Shadow", "store_phase", "lookup_phase", "run_case", "Case", "Outcome",
           "default_step_bound", "leading_run"]

def chunk_hashes(n_chunks: int, salt: str) -> list[str]:
    """Prefix-chain hashes: chunk c's hash covers the salt and every chunk before it."""
    out, prev = [], salt
    for c in range(n_chunks):
        prev = hashlib.sha256(f"{prev}|{c}".encode()).hexdigest()[:16]
        out.append(prev)
    return out


def kv_bytes(n_chunks: int, salt: str) -> list[bytes]:
    """Distinct KV payloads per chunk (so a value names its chunk), of varying lengths."""
    return [f"{salt}|kv{c}|".encode() + bytes((c * 7 + i) % 256 for i in range(16 + 5 * c))
            for c in range(n_chunks)]


def other_prompt(case: Case, other: OtherPrompt, hashes: list[str], kv: list[bytes]) -> tuple[list[str], list[bytes]]:
    """The chunk hashes and KV bytes of `other`: the checked prompt's first `shared` chunks, then its own chain."""
    shared = max(0, min(other.shared, other.n_chunks, len(hashes)))
    own_kv = kv_bytes(other.n_chunks, f"{other.salt}/{case.salt}")
    out_h, out_kv = list(hashes[:shared]), list(kv[:shared])
    prev = hashes[shared - 1] if shared else other.salt
    for c in range(shared, other.n_chunks):
        prev = hashlib.sha256(f"{prev}|{c}|{other.salt}".encode()).hexdigest()[:16]
        out_h.append(prev)
        out_kv.append(own_kv[c])
    return out_h, out_kv


class Shadow:
    """The harness's exact record of which keys each store holds for the checked prompt (the oracle of `cached`).

    A key the checked prompt wrote counts for its chunk while it is present and holds the checked prompt's bytes: one
    that another prompt overwrote with other bytes is `stale`. Keys other prompts wrote are tracked too, so that
    their evictions delete what they wrote (and nothing else).
    """

    def __init__(self, stores: Sequence[RankStore], written: dict[int, dict[str, int]]) -> None:
        self.stores, self.written = stores, written
        self.present = {r: set(keys) for r, keys in written.items()}
        self.overwritten: dict[int, set[str]] = {r: set() for r in written}
        self.others: list[dict[int, dict[str, int]]] = []

    def cached(self) -> frozenset[int]:
        return frozenset(c for r, keys in self.present.items() for k in keys
                         if (c := self.written[r][k]) is not None and k not in self.overwritten[r])

    def stale(self) -> frozenset[int]:
        """Chunks with a key the checked prompt wrote that is present but holds another prompt's bytes."""
        return frozenset(c for r, keys in self.overwritten.items() for k in keys
                         if k in self.present[r] and (c := self.written[r][k]) is not None)

    def other_wrote(self, written: dict[int, dict[str, int]], values: dict[tuple[int, str], bytes],
                    own: Callable[[int, str], bytes | None], after: bool) -> None:
        """Another prompt's store phase wrote `written` (rank -> key -> its chunk) with `values`; `own(rank, key)`
        is the checked prompt's bytes under that key. Written after the checked prompt's, it overwrites."""
        self.others.append(written)
        if not after:
            return
        for (r, key), value in values.items():
            if key in self.written.get(r, {}):
                self.present[r].add(key)
                if value != own(r, key):
                    self.overwritten[r].add(key)
                else:
                    self.overwritten[r].discard(key)

    def evict(self, e: Eviction) -> None:
        for r, keys in self.written.items():
            if e.rank is not None and r != e.rank:
                continue
            for k, c in keys.items():
                if c == e.chunk and k in self.present[r]:
                    self.stores[r].delete(k)
                    self.present[r].discard(k)

    def evict_other(self, index: int, chunk: int) -> None:
        """Evict other prompt `index`'s keys of `chunk` from every store (a key the checked prompt shares goes too)."""
        for r, keys in self.others[index].items():
            for k, c in keys.items():
                if c == chunk:
                    self.stores[r].delete(k)
                    self.present.get(r, set()).discard(k)


def _written(events: list[Event], kv: list[bytes], n: int) -> tuple[dict[int, dict[str, int]], dict]:
    """rank -> key -> chunk of every Put a store phase made (chunk None: bytes of no chunk), and the bytes put."""
    chunk_of = {v: c for c, v in enumerate(kv)}
    written: dict[int, dict[str, int]] = {r: {} for r in range(n)}
    values: dict[tuple[int, str], bytes] = {}
    for ev in events:
        if ev.note == "" and isinstance(ev.effect, Put) and ev.rank is not None:
            written[ev.rank][ev.effect.key] = chunk_of.get(ev.effect.value)
            values[(ev.rank, ev.effect.key)] = bytes(ev.effect.value)
    return written, values


def store_phase(protocol: Any, case: Case, stores: Sequence[RankStore], *, hashes: list[str] | None = None,
                kv: list[bytes] | None = None) -> tuple[Outcome, Shadow]:
    """Every rank's `rank_store` of the other prompts stored before, the checked prompt, and the other prompts stored
    after it, simulated over the same stores; the outcome so far (violations of the store phase, if any)."""
    n, k = case.n_ranks, case.n_chunks
    hashes = chunk_hashes(k, case.salt) if hashes is None else hashes
    kv = kv_bytes(k, case.salt) if kv is None else kv
    name = str(getattr(protocol, "name", type(protocol).__name__))
    bound = case.bound() + 10 * k * n

    def phase(h: list[str], b: list[bytes]) -> Any:
        return simulate([protocol.rank_store(r, n, h, b) for r in range(n)], stores, phase="store",
                        step_bound=bound + 10 * len(h) * n)

    prompts = [(o, *other_prompt(case, o, hashes, kv)) for o in case.others]
    events: list[Event] = []
    violations: list[Violation] = []
    foreign: dict[bytes, str] = {}
    later: list[tuple[int, Any, list[bytes]]] = []
    before: list[tuple[int, Any, list[bytes]]] = []
    for i, (o, h, b) in enumerate(prompts):
        (later if o.after else before).append((i, phase(h, b) if not o.after else None, b))
        foreign.update((v, f"prompt {o.salt!r} chunk {c}") for c, v in enumerate(b) if v not in kv)
    for i, res, _ in before:
        violations += res.violations
        events += [attrs.evolve(ev, note=ev.note or f"other prompt {prompts[i][0].salt}") for ev in res.events]
    store = phase(hashes, kv)
    written, _ = _written(store.events, kv, n)
    shadow = Shadow(stores, written)
    events += store.events
    violations += store.violations
    for i, res, b in before:
        shadow.other_wrote(_written(res.events, b, n)[0], {}, lambda r, key: None, after=False)
    for i, _, b in later:
        res = phase(prompts[i][1], b)
        violations += res.violations
        events += [attrs.evolve(ev, note=ev.note or f"other prompt {prompts[i][0].salt}") for ev in res.events]
        other_written, values = _written(res.events, b, n)
        shadow.other_wrote(other_written, values, lambda r, key: kv[c] if (c := written[r].get(key)) is not None
                           else None, after=True)
    order = [i for i, _, _ in before] + [i for i, _, _ in later]
    shadow.others = [shadow.others[order.index(i)] for i in range(len(prompts))]  # in `case.others` order
    out = Outcome(case, name, hashes, kv, written, frozenset(), 0, events=events, foreign=foreign)
    out.violations = [attrs.evolve(v, summary=f"store phase: {v.summary}") for v in violations]
    return out, shadow


def lookup_phase(protocol: Any, out: Outcome, stores: Sequence[RankStore], shadow: Shadow) -> None:
    """Every rank looks up at one instant and the scheduler combines; a hang or a non-count plan is
    recorded in `out.violations`."""
    n, k = out.case.n_ranks, out.case.n_chunks
    try:
        evictions = [(i, c) for i, o in enumerate(out.case.others) for c in o.evicted]
        if evictions:  # the verdict before them, to tell what the other prompts' evictions changed (isolation)
            out.before_other_evictions = _probe(protocol, out, stores, shadow)
            for i, c in evictions:
                shadow.evict_other(i, c)
        out.cached = shadow.cached()
        out.stale = shadow.stale()
        out.lcp = leading_run(out.cached, k)
        out.reports = [_lookup(protocol, r, n, out.hashes, stores[r], out.events) for r in range(n)]
        with protocol_call(None, "combine"):
            out.planned = protocol.combine(list(out.reports), k)
        out.events.append(Event(0, None, 0.0, "lookup", "combine", out.planned, note=f"reports {out.reports}"))
    except StoreCallTimeout as exc:
        out.violations = [Violation("hang", f"lookup: {exc}", {"op": exc.op, "key": exc.key, "seconds": exc.seconds})]
        return
    except ProtocolRaised as exc:  # a protocol's lookup or combine that raises has not terminated normally
        out.violations = [Violation("termination", f"lookup: {exc}", {"rank": exc.rank, "exception": type(exc.error).__name__,
                                                                    "where": exc.where})]
        return
    except Stalled as exc:  # a lookup or combine that does not return (see runtime.watchdog)
        out.violations = [Violation("termination", f"lookup: {exc}", {"stalled": exc.method, "seconds": exc.seconds,
                                                                    "provisional": exc.again})]
        return
    if not isinstance(out.planned, int) or isinstance(out.planned, bool):
        out.violations = [Violation("soundness", f"combine returned {out.planned!r}, not a chunk count")]


class MissOnError:
    """A rank's store as a protocol sees it through real-server faults: a read the client answers with an error is a
    miss (`contains` False, `get` None, an async read that completes None), as an engine's remote backend answers it;
    a call that does not return within its bound still raises (`StoreCallTimeout`: a hang)."""

    def __init__(self, inner: RankStore, errors: list) -> None:
        self.inner, self.errors = inner, errors

    def _miss(self, op: str, key: str, exc: Exception) -> None:
        self.errors.append((op, key, f"{type(exc).__name__}: {exc}"))

    def contains(self, key: str) -> bool:
        try:
            return self.inner.contains(key)
        except StoreCallTimeout:
            raise
        except Exception as exc:  # noqa: BLE001 - an error while a fault lasts is a miss
            self._miss("contains", key, exc)
            return False

    def get(self, key: str) -> bytes | None:
        try:
            return self.inner.get(key)
        except StoreCallTimeout:
            raise
        except Exception as exc:  # noqa: BLE001
            self._miss("get", key, exc)
            return None

    def get_async(self, key: str) -> Any:
        import concurrent.futures

        out: concurrent.futures.Future = concurrent.futures.Future()
        try:
            inner = self.inner.get_async(key)
        except StoreCallTimeout:
            raise
        except Exception as exc:  # noqa: BLE001
            self._miss("get_async", key, exc)
            out.set_result(None)
            return out

        def done(f: Any) -> None:
            exc = None if f.cancelled() else f.exception()
            if f.cancelled() or exc is not None:
                self._miss("get_async", key, exc or RuntimeError("cancelled"))
                out.set_result(None)
            else:
                out.set_result(f.result())
        inner.add_done_callback(done)
        return out

    def __getattr__(self, name: str) -> Any:  # put, delete, close...: as they are
        return getattr(self.inner, name)


def run_case(protocol: Any, case: Case, stores: Sequence[RankStore] | None = None, *,
             wait_bound: float = DEFAULT_OP_TIMEOUT, control: Any = None,
             recovery_seconds: float | None = None) -> Outcome:
    """Run `case` under `protocol` over `stores` (default: fresh in-memory stores) and check it; an async read's
    completion is awaited at most `wait_bound` seconds (longer: a `hang`). A case with real-server faults strikes
    them through `control` (`model.faults.ServerControl`) at their phase, and once they are over every struck rank's
    store must pass the `recovery` probe within `recovery_seconds`."""
    n = case.n_ranks
    server = case.faults.server_faults()
    if server and control is None:
        raise ValueError(f"the case strikes real-server faults ({server[0][0].text(server[0][1])}): it needs a "
                         "nemesis (a client over servers shardcheck started)")
    stores = memory_factory(n) if stores is None else stores
    out, shadow = store_phase(protocol, case, stores)
    if out.violations:
        return out
    errors: list = []
    raw, stores = stores, [MissOnError(s, errors) for s in stores] if server else stores

    def strike(fault: Any) -> None:
        kind = next(k for k, f in server if f is fault)
        kind.strike(control, fault)

    try:
        for kind, e in case.faults.items():
            if kind.when_of(e) == "before-lookup":
                shadow.evict(e) if kind.family == "harness" else strike(e)
        lookup_phase(protocol, out, stores, shadow)
        if out.violations:
            return _recovered(out, raw, control, recovery_seconds, wait_bound, errors)
        for kind, e in case.faults.items():
            if kind.when_of(e) == "after-lookup":
                shadow.evict(e) if kind.family == "harness" else strike(e)
    except StoreCallTimeout as exc:
        out.violations = [Violation("hang", f"eviction: {exc}", {"op": exc.op, "key": exc.key, "seconds": exc.seconds})]
        return out
    chooser = seeded_chooser(case.seed) if case.seed is not None else lowest_runnable
    out.load = simulate([protocol.rank_load(r, n, out.hashes, out.planned) for r in range(n)], stores, phase="load",
                        schedule=case.schedule, chooser=chooser, step_bound=case.bound(),
                        evict=lambda e: shadow.evict(e) if isinstance(e, Eviction) else strike(e),
                        wait_bound=wait_bound, **case.faults.simulator_options())
    out.events.extend(out.load.events)
    out.violations = check_outcome(out)
    return _recovered(out, raw, control, recovery_seconds, wait_bound, errors)


def _recovered(out: Outcome, stores: Sequence[RankStore], control: Any, recovery_seconds: float | None,
               op_timeout: float, errors: list) -> Outcome:
    """After a case's real-server faults: wait until they are over and probe `recovery` on every struck rank."""
    server = out.case.faults.server_faults()
    if not server:
        return out
    for op, key, why in errors[:20]:
        out.events.append(Event(0, None, 0.0, "fault", (op, key), None, note=f"error answered as a miss: {why}"))
    healed = control.healed(max(f.seconds for _, f in server) + 10.0)
    if healed is None:
        raise RuntimeError("the nemesis could not end the case's real-server faults")
    bound = default_recovery_seconds(op_timeout) if recovery_seconds is None else recovery_seconds
    for r in sorted({f.rank for _, f in server}):
        got = probe(stores[r], healed_at=healed, recovery_seconds=bound, op_timeout=op_timeout)
        out.events.append(Event(0, r, 0.0, "recovery", "probe", got.ok,
                                note=f"recovered in {got.seconds} s" if got.ok else got.why))
        if not got.ok:
            out.violations.append(Violation("recovery", f"rank {r}: {bound:g} s after its server was back the client "
                                            f"still fails ({got.attempts} attempts): {got.why}",
                                            {"rank": r, "attempts": got.attempts}))
    return out


def _probe(protocol: Any, out: Outcome, stores: Sequence[RankStore], shadow: Shadow) -> tuple[frozenset[int], Any]:
    """(cached set, planned) of a lookup nobody records (the lookup is read-only)."""
    n, k = out.case.n_ranks, out.case.n_chunks
    reports = [_lookup(protocol, r, n, out.hashes, stores[r], []) for r in range(n)]
    with protocol_call(None, "combine"):
        return shadow.cached(), protocol.combine(list(reports), k)


#: Contains calls of one rank's lookup recorded as events (a lookup that polls its store makes millions).
MAX_LOOKUP_CALLS = 1000


def _lookup(protocol: Any, rank: int, n: int, hashes: list[str], store: RankStore, events: list[Event]) -> int:
    calls = [0]

    def contains(key: str) -> bool:
        hit = store.contains(key)
        calls[0] += 1
        if calls[0] <= MAX_LOOKUP_CALLS:
            events.append(Event(0, rank, 0.0, "lookup", ("contains", key), hit))
        elif calls[0] == MAX_LOOKUP_CALLS + 1:  # a lookup that polls: keep the trace (and memory) bounded
            events.append(Event(0, rank, 0.0, "lookup", ("contains", key), hit,
                                note=f"more than {MAX_LOOKUP_CALLS} contains calls: later ones not recorded"))
        return hit

    with protocol_call(rank, "rank_lookup"):
        report = protocol.rank_lookup(rank, n, hashes, contains)
    events.append(Event(0, rank, 0.0, "lookup", "report", report))
    return report
