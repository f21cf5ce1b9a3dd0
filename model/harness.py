"""One run of a protocol: store, evict, look up (all ranks at one instant), load; then every check.

`run_case(protocol, case, stores)` is the single entry point the enumerator, the explorer's replays,
the properties, the proofs' counterexamples and `shardcheck replay` all use.
"""
from __future__ import annotations

import hashlib
from typing import Any, Sequence

import attrs

from model.checks import check_outcome
from model.contract import RankStore, StoreCallTimeout
from model.effects import Put
from model.faults import Eviction
from model.outcome import Case, Event, Outcome, Violation, default_step_bound, leading_run
from model.sim import lowest_runnable, seeded_chooser, simulate
from model.store import memory_factory
from model.calls import DEFAULT_OP_TIMEOUT, ProtocolRaised, Stalled, protocol_call


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


class Shadow:
    """The harness's exact record of which written keys each store still holds (the oracle of `cached`)."""

    def __init__(self, stores: Sequence[RankStore], written: dict[int, dict[str, int]]) -> None:
        self.stores, self.written = stores, written
        self.present = {r: set(keys) for r, keys in written.items()}

    def cached(self) -> frozenset[int]:
        return frozenset(c for r, keys in self.present.items() for k in keys
                         if (c := self.written[r][k]) is not None)

    def evict(self, e: Eviction) -> None:
        for r, keys in self.written.items():
            if e.rank is not None and r != e.rank:
                continue
            for k, c in keys.items():
                if c == e.chunk and k in self.present[r]:
                    self.stores[r].delete(k)
                    self.present[r].discard(k)


def store_phase(protocol: Any, case: Case, stores: Sequence[RankStore], *, hashes: list[str] | None = None,
                kv: list[bytes] | None = None) -> tuple[Outcome, Shadow]:
    """Every rank's `rank_store`, simulated; the outcome so far (violations of the store phase, if any)."""
    n, k = case.n_ranks, case.n_chunks
    hashes = chunk_hashes(k, case.salt) if hashes is None else hashes
    kv = kv_bytes(k, case.salt) if kv is None else kv
    chunk_of = {v: c for c, v in enumerate(kv)}
    name = str(getattr(protocol, "name", type(protocol).__name__))
    store = simulate([protocol.rank_store(r, n, hashes, kv) for r in range(n)], stores, phase="store",
                     step_bound=case.bound() + 10 * k * n)
    written: dict[int, dict[str, int]] = {r: {} for r in range(n)}
    for ev in store.events:
        if ev.note == "" and isinstance(ev.effect, Put) and ev.rank is not None:
            written[ev.rank][ev.effect.key] = chunk_of.get(ev.effect.value)
    out = Outcome(case, name, hashes, kv, written, frozenset(), 0, events=list(store.events))
    out.violations = [attrs.evolve(v, summary=f"store phase: {v.summary}") for v in store.violations]
    return out, Shadow(stores, written)


def lookup_phase(protocol: Any, out: Outcome, stores: Sequence[RankStore], shadow: Shadow) -> None:
    """Every rank looks up at one instant and the scheduler combines; a hang or a non-count plan is
    recorded in `out.violations`."""
    n, k = out.case.n_ranks, out.case.n_chunks
    try:
        out.cached = shadow.cached()
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


def run_case(protocol: Any, case: Case, stores: Sequence[RankStore] | None = None, *,
             wait_bound: float = DEFAULT_OP_TIMEOUT) -> Outcome:
    """Run `case` under `protocol` over `stores` (default: fresh in-memory stores) and check it; an async read's
    completion is awaited at most `wait_bound` seconds (longer: a `hang`)."""
    n = case.n_ranks
    stores = memory_factory(n) if stores is None else stores
    out, shadow = store_phase(protocol, case, stores)
    if out.violations:
        return out
    try:
        for kind, e in case.faults.items():
            if kind.when == "before-lookup":
                shadow.evict(e)
        lookup_phase(protocol, out, stores, shadow)
        if out.violations:
            return out
        for kind, e in case.faults.items():
            if kind.when == "after-lookup":
                shadow.evict(e)
    except StoreCallTimeout as exc:
        out.violations = [Violation("hang", f"eviction: {exc}", {"op": exc.op, "key": exc.key, "seconds": exc.seconds})]
        return out
    chooser = seeded_chooser(case.seed) if case.seed is not None else lowest_runnable
    out.load = simulate([protocol.rank_load(r, n, out.hashes, out.planned) for r in range(n)], stores, phase="load",
                        schedule=case.schedule, chooser=chooser, step_bound=case.bound(),
                        evict=shadow.evict, wait_bound=wait_bound, **case.faults.simulator_options())
    out.events.extend(out.load.events)
    out.violations = check_outcome(out)
    return out


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
