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
