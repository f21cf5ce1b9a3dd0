"""Exhaustive explorer: breadth-first search over every interleaving of the N rank load programs and
every fault choice, for small configurations (N ranks, K chunks, every cached set or a given one).

Pure Python, no I/O (the manifest tooling lives in `engines.manifest`).

# The model explored
One global state is
    (lid_0, ..., lid_{N-1}, fc), packed into one int (fc + sum lid_r << (24 + 24 r)),
where `lid_r` interns rank r's local state (trie node, status flag, its own store's contents, its async
completions) and `fc = cfg * (max_faults + 1) + faults_used` names the initial configuration (which
units were evicted before lookup) and how many faults the run has used. Everything else a run
depends on is a function of that tuple:

- rank-local program state: rank programs are generators and cannot be copied, but a deterministic
  program's state is determined by the sequence of results it received. Each rank has a trie per
  `planned` value, keyed by that history; a node memoises the next effect (or the return value / the
  exception). A generator is re-created and replayed only when a trie node is first created.
- the step count (moves made) = per rank, results received + 1 if it waits in a collective or hangs.
- the keys read (for key-consistency) = the reads along the trie path.

Transitions are "moves", exactly the simulator's (`model.sim`): a rank executes its pending store
effect and gets the result, or arrives at its pending collective; the last arrival completes the
collective and sends every rank its result. Fault choices:
- eviction of one chunk from one rank's store (`Eviction(chunk, rank, step)`, harness semantics: only
  keys the store phase wrote and that were not evicted before), at any point of the load;
- a lost completion of any `GetAsync` (`lost=(rank, i)`);
- a delayed completion (`delayed=(rank, i, DELAY_SECONDS)`), beyond any wait timeout < DELAY_SECONDS.
Evictions before lookup are not faults: they are the initial configurations ("every cached set" is
every subset of the (rank, chunk) units the store phase wrote; a given cached set keeps exactly the
units of its chunks). At most `max_faults` faults happen after the lookup per run. An eviction takes
one chunk from ONE rank's store: a whole-chunk eviction from k stores counts as k faults (the reference
protocols store each chunk on one rank, where the two coincide).

Checked: at every transition, desync (the k-th collectives differ, or a Broadcast root out of range), a
rank program raising or yielding a non-effect / a foreign handle (termination); at every state, the
step bound (a rank can still move after `step_bound` moves: termination); at every state where no rank
can move, hang (a rank waits forever on a lost completion) or else deadlock (a rank waits in a
collective), and then every property of `model.checks.check_outcome` over an `Outcome` built for
that terminal state. The lookup properties (soundness, completeness) are checked on the initial state
(they depend on the lookup only). A counterexample is replayed with `model.harness.run_case`, which
must report the same property (`ExploreError` otherwise: the explorer and the simulator disagree).

# Reductions (`reduction=True`)
1. Lazy eviction placement. An eviction of chunk c from store r is observable only by rank r's next
   store effect on a key of chunk c (no other rank reads store r; collectives do not read stores). So an
   eviction is only tried as a branch of such a move ("evict c, then do the move"), never elsewhere.
   Moving an eviction later, past moves that do not touch chunk c's keys on store r, changes no rank's
   history; an eviction that no later move observes changes nothing but the fault count, and a run with
   a fault after lookup has a subset of the violations of the same run without it (only maximality
   depends on faults, and it is waived when one happened). So every violation of the eager model is
   found in the lazy one.
2. Partial-order reduction: in every state only the lowest-numbered rank that can move is expanded
   (all of its branches: the plain move, evict-then-move, lost, delayed). Valmari's stubborn-set
   conditions hold for T = {branches of rank r's move}:
   D1: every transition of another rank touches only that rank's local state, its own store, the
   arrivals of the current collective (never completing it: r has not arrived), and the shared fault
   counter; r's branches touch r's local state, store r, and the counter. Local parts are disjoint;
   the counter only adds up, and a sequence is feasible iff its total is within the budget, whatever
   the order; two arrivals at one collective commute (same arrival set; if their kinds differ, both
   orders reach a desync). So t1..tn t executable implies t t1..tn executable to the same state.
   D2: r's plain move is a key transition: nothing but r changes r's status.
   The state graph is acyclic (each transition is one step), so no cycle proviso is needed, and
   stubborn sets preserve every terminal state, hence every terminal-state violation. A violation on
   a transition of another rank q (raise, desync) depends only on q and the arrived ranks, so it is
   still reached after r's move - except when it happens exactly at the step bound, where the reduced
   search reports the step bound (termination) instead. This is the classic result for deterministic
   message passing without wildcard receives (ISP/POE for MPI): the only nondeterminism that matters
   here is the fault choices. The reduced shortest counterexample is shortest within the reduced graph;
   `reduction=False` gives the true shortest.
3. Rank symmetry: NOT applied. Ownership (c mod N), the rank in every key, AllGather's rank-indexed
   result and Broadcast's root make ranks non-interchangeable; no permutation of ranks maps runs to
   runs in general, and a per-protocol argument is not available for user protocols.

`reduction=False` explores the naive model: every interleaving of every runnable rank, and evictions
as separate transitions of any present (rank, chunk) at any state where a rank can still move.

# Speed
Every rank-local successor is memoised per local state as (fault cost, packed delta): expanding a
global state is integer shifts, one add per successor, and one dict look-up in `seen` (which also holds
the BFS parent, for the shortest counterexample). cProfile showed, in turn: tuple slicing/hashing of
global states, then unpacking/packing on every collective arrival, then module-global look-ups in the
loop; what is left is the loop itself (int add, dict membership/insert, list append). `bench()`
measures it (`shardcheck bench`; the manifest: `shardcheck regen manifest`).
"""
from __future__ import annotations

import itertools
import time
from typing import Any, Callable, Iterable, Sequence

import attrs

from model.checks import check_outcome, completeness, soundness
from model.effects import (COLLECTIVES, AllGather, AllReduceMin, Broadcast, Get, GetAsync, Handle, Put,
                           TIMED_OUT, Wait, collective_signature)
from model.faults import Eviction, FaultPlan
from model.harness import Case, Outcome, chunk_hashes, default_step_bound, kv_bytes, leading_run, run_case
from model.sim import SimResult, Violation, simulate
from model.store import memory_factory
from model.calls import ProtocolRaised, Stalled, protocol_call

#: The delay of a delayed completion: beyond any wait timeout below it.
DELAY_SECONDS = 1.0e6

# node kinds
_PUT, _GET, _GETASYNC, _WAIT, _COLL, _DONE, _RAISED, _BAD = range(8)
_STORE_KINDS = (_PUT, _GET, _GETASYNC, _WAIT)
# local flags
_RUN, _ARRIVED, _HUNG = 0, 1, 2
# async completion status
_OK, _LOST, _DELAYED = 0, 1, 2
# a global state packed into one int: fc in the low _FB bits, then _LB bits per rank's local state id
_FB = _LB = 24
_FMASK = _LMASK = (1 << _LB) - 1


class ExploreError(Exception):
    """The explorer cannot handle the input, or its counterexample does not replay in `run_case`."""


@attrs.define
class ExploreResult:
    """What one exploration found.

    `verdict`: "held" (every reachable state checked, no violation), "violated" (`counterexample` and
    `violation` set; BFS order makes it a shortest one in the explored graph) or "incomplete" (stopped by
    `should_stop`). `states`: distinct global states; `transitions`: successors generated; `depth`: the
    BFS depth reached (= moves, in the reduced model).
    """

    verdict: str
    states: int
    transitions: int
    depth: int
    seconds: float
    counterexample: Case | None = None
    violation: Violation | None = None
    outcome: Outcome | None = attrs.field(default=None, repr=False)
    configs: int = 0
    trie_nodes: int = 0

    def trace(self, protocol_ref: str | None = None, origin: str = "explore"):
        """The counterexample as a `model.trace.Trace` (None when nothing was violated)."""
        if self.outcome is None:
            return None
        from model.trace import Trace
        return Trace.from_outcome(self.outcome, protocol_ref=protocol_ref, origin=origin)


# -- hashable snapshots of results (trie edge keys) ------------------------------------------------
def _freeze(v: Any) -> Any:
    t = type(v)
    if t is int or t is bytes or t is str or v is None or v is TIMED_OUT or t is Handle:
        return v
    if t is dict:
        return ("d", tuple((_freeze(k), _freeze(x)) for k, x in v.items()))
    if t is list:
        return ("l", tuple(_freeze(x) for x in v))
    if t is tuple:
        return ("t", tuple(_freeze(x) for x in v))
    if t is bool:
        return ("b", v)
    if t is float:
        return ("f", v)
    if t is bytearray:
        return ("ba", bytes(v))
    try:
        hash(v)
    except TypeError:
        raise ExploreError(f"cannot snapshot a result of type {t.__name__} for the explorer's trie") from None
    return ("o", v)


def _thaw(v: Any) -> Any:
    if type(v) is not tuple:
        return v
    tag, body = v
    if tag == "d":
        return {_thaw(k): _thaw(x) for k, x in body}
    if tag == "l":
        return [_thaw(x) for x in body]
    if tag == "t":
        return tuple(_thaw(x) for x in body)
    if tag == "ba":
        return bytearray(body)
    return body


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - an effect whose comparison raises: trust the type
        return type(a) is type(b)


# -- the rank tries -----------------------------------------------------------------------------------
class _Node:
    """A rank-local program state, named by the results the rank received so far."""

    __slots__ = ("rank", "planned", "parent", "edge", "depth", "kind", "effect", "children", "gen",
                 "reads", "n_async", "error", "ret")

    def __init__(self, rank: int, planned: Any, parent: "_Node | None", edge: Any, depth: int,
                 reads: tuple, n_async: int) -> None:
        self.rank, self.planned, self.parent, self.edge, self.depth = rank, planned, parent, edge, depth
        self.reads, self.n_async = reads, n_async
        self.children: dict = {}
        self.gen = None
        self.kind = _DONE
        self.effect = None
        self.error: str | None = None
        self.ret = None

    def history(self) -> list:
        out, node = [], self
        while node.parent is not None:
            out.append(node.edge)
            node = node.parent
        out.reverse()
        return out


class _Tries:
    """Per (rank, planned) tries of rank load programs, expanded on demand."""

    def __init__(self, protocol: Any, n: int, hashes: list[str]) -> None:
        self.protocol, self.n, self.hashes = protocol, n, hashes
        self.roots: dict[tuple[int, Any], _Node] = {}
        self.count = 0

    def root(self, rank: int, planned: Any) -> _Node:
        node = self.roots.get((rank, planned))
        if node is None:
            node = _Node(rank, planned, None, None, 0, (), 0)
            gen = self.protocol.rank_load(rank, self.n, self.hashes, planned)
            self._advance(node, gen, None, first=True)
            self.roots[(rank, planned)] = node
            self.count += 1
        return node

    def child(self, node: _Node, result: Any) -> _Node:
        key = _freeze(result)
        got = node.children.get(key)
        if got is not None:
            return got
        eff = node.effect
        reads = node.reads + (eff.key,) if node.kind in (_GET, _GETASYNC) else node.reads
        n_async = node.n_async + (node.kind == _GETASYNC)
        new = _Node(node.rank, node.planned, node, key, node.depth + 1, reads, n_async)
        gen, node.gen = node.gen, None
        try:
            if gen is None:  # re-create and replay the history
                gen = self._replay(node)
        except Stalled as exc:  # replaying a step that returned before: the same violation as in _advance
            new.kind, new.error = _RAISED, str(exc)
        else:
            self._advance(new, gen, _thaw(key))
        node.children[key] = new
        self.count += 1
        return new

    def _replay(self, node: _Node) -> Any:
        """A fresh generator of `node`'s rank program, fed `node`'s history (it must yield `node.effect`)."""
        gen = self.protocol.rank_load(node.rank, self.n, self.hashes, node.planned)
        try:
            with protocol_call(node.rank, "rank_load"):
                eff = next(gen)
            for edge in node.history():
                with protocol_call(node.rank, "rank_load"):
                    eff = gen.send(_thaw(edge))
        except ProtocolRaised as exc:
            raise ExploreError(f"rank {node.rank}'s load program is not deterministic: replaying its history "
                               f"raised {type(exc.error).__name__}: {exc.error}") from None
        if not _same(eff, node.effect):
            raise ExploreError(f"rank {node.rank}'s load program is not deterministic: replaying its history "
                               f"yielded {eff!r}, not {node.effect!r}")
        return gen

    @staticmethod
    def _advance(node: _Node, gen: Any, value: Any, first: bool = False) -> None:
        done = False
        try:
            with protocol_call(node.rank, "rank_load"):
                try:
                    eff = next(gen) if first else gen.send(value)
                except StopIteration as stop:
                    done, ret = True, stop.value
        except ProtocolRaised as exc:  # a raising rank program is a termination violation
            node.kind, node.error = _RAISED, str(exc)
            return
        except Stalled as exc:  # a step that does not return (see runtime.watchdog): the same violation
            node.kind, node.error = _RAISED, str(exc)
            return
        if done:
            node.kind, node.ret = _DONE, ret
            return
        node.effect, node.gen = eff, gen
        if isinstance(eff, COLLECTIVES):
            node.kind = _COLL
        elif isinstance(eff, Put):
            node.kind = _PUT
        elif isinstance(eff, Get):
            node.kind = _GET
        elif isinstance(eff, GetAsync):
            node.kind = _GETASYNC
        elif isinstance(eff, Wait):
            node.kind = _WAIT
        else:
            node.kind, node.error = _BAD, f"yielded {eff!r}, which is not an effect of model.effects"


# -- a store's contents -------------------------------------------------------------------------------
class _Store:
    """One rank's store: its data, and which store-phase keys the harness can still evict."""

    __slots__ = ("data", "present", "evicted", "put_memo", "chunks")

    def __init__(self, data: dict, present: frozenset, chunks: dict) -> None:
        self.data, self.present, self.chunks = data, present, chunks
        self.evicted: dict = {}
        self.put_memo: dict = {}


class _Stores:
    def __init__(self) -> None:
        self.table: dict = {}

    def make(self, data: dict, present: frozenset, written: dict) -> _Store:
        key = (frozenset(data.items()), present)
        got = self.table.get(key)
        if got is None:
            chunks: dict = {}
            for k in present:
                chunks.setdefault(written[k], []).append(k)
            got = self.table[key] = _Store(data, present, chunks)
        return got

    def evict(self, s: _Store, chunk: int, written: dict) -> _Store | None:
        """`s` after the harness evicts `chunk` (None when no evictable key of it is present)."""
        got = s.evicted.get(chunk)
        if got is None and chunk in s.chunks:
            keys = s.chunks[chunk]
            data = {k: v for k, v in s.data.items() if k not in keys}
            got = s.evicted[chunk] = self.make(data, s.present.difference(keys), written)
        return got

    def put(self, s: _Store, key: str, value: Any, written: dict) -> _Store:
        got = s.put_memo.get((key, value))
        if got is None:
            data = dict(s.data)
            data[key] = bytes(value)
            got = s.put_memo[(key, value)] = self.make(data, s.present, written)
        return got


@attrs.frozen
class _Config:
    """One initial configuration: the units evicted before lookup, and what the lookup saw."""

    evicted: tuple[Eviction, ...]
    cached: frozenset
    lcp: int
    reports: list | None
    planned: Any
    stores: tuple


class _Bad:
    """A transition that ends the run with a violation."""

    __slots__ = ("property", "summary")

    def __init__(self, prop: str, summary: str) -> None:
        self.property, self.summary = prop, summary


class _Explorer:
    def __init__(self, protocol: Any, n: int, k: int, cached: Any, max_faults: int, reduction: bool,
                 salt: str, step_bound: int | None, properties: frozenset | None = None) -> None:
        self.properties = properties
        if n < 1 or k < 0 or max_faults < 0:
            raise ExploreError(f"need n_ranks >= 1, n_chunks >= 0, max_faults >= 0 (got {n}, {k}, {max_faults})")
        self.protocol, self.n, self.k, self.maxf, self.reduction = protocol, n, k, max_faults, reduction
        self.salt = salt
        self.case0 = Case(n, k, salt=salt, step_bound=step_bound)
        self.bound = self.case0.bound()
        self.hashes, self.kv = chunk_hashes(k, salt), kv_bytes(k, salt)
        self.name = str(getattr(protocol, "name", type(protocol).__name__))
        self.tries = _Tries(protocol, n, self.hashes)
        self.stores = _Stores()
        # interned rank-local states
        self.local: dict = {}
        self.L_node: list[_Node] = []
        self.L_flag: list[int] = []
        self.L_store: list[_Store] = []
        self.L_async: list[tuple] = []
        self.L_run: list[bool] = []
        self.L_moves: list[int] = []
        self.L_br: list = []
        self.L_ev: list = []
        # per lid: [(cost, packed delta, new lid | _Bad, kind)]; kind 0 move, 1 arrive, 2 bad, 3 move after which
        # the rank cannot move (the state may be terminal)
        self.L_fast: list = []
        self.L_evd: list = []  # per lid: packed deltas of its eager evictions
        self.L_sig: list[int] = []  # per lid: the id of the collective signature it waits in (-1: not arrived)
        self.sig_ids: dict = {}
        self.coll_packed: dict[int, int] = {}  # packed lids (no fc) all arrived -> packed lids after completion
        self.shift = [_FB + _LB * r for r in range(n)]
        self.coll_memo: dict = {}
        self.term_memo: dict = {}
        self.store_violations: list[Violation] = []
        self._store_phase(cached)

    # -- set-up: the store phase (as `run_case` runs it) and the initial configurations ---------------
    def _store_phase(self, cached: Any) -> None:
        n, k = self.n, self.k
        mem = memory_factory(n)
        res = simulate([self.protocol.rank_store(r, n, self.hashes, self.kv) for r in range(n)], mem,
                       phase="store", step_bound=self.bound + 10 * k * n)
        chunk_of = {v: c for c, v in enumerate(self.kv)}
        self.written: dict[int, dict[str, int | None]] = {r: {} for r in range(n)}
        for ev in res.events:
            if ev.note == "" and type(ev.effect).__name__ == "Put" and ev.rank is not None:
                self.written[ev.rank][ev.effect.key] = chunk_of.get(ev.effect.value)
        self.store_violations = list(res.violations)
        self.evictable = {r: {key: c for key, c in w.items() if c is not None} for r, w in self.written.items()}
        units = sorted({(r, c) for r, w in self.evictable.items() for c in w.values()})
        if cached is None or cached == "all":
            choices = [frozenset(s) for size in range(len(units) + 1)
                       for s in itertools.combinations(units, size)]
        else:
            keep = set(cached)
            bad = keep - set(range(k))
            if bad:
                raise ExploreError(f"cached chunks {sorted(bad)} are not chunks of 0..{k - 1}")
            choices = [frozenset(u for u in units if u[1] not in keep)]
        self.configs: list[_Config] = []
        for out in choices:
            stores = []
            for r in range(n):
                s = self.stores.make(dict(mem[r].data), frozenset(self.evictable[r]), self.evictable[r])
                for rr, c in sorted(out):
                    if rr == r:
                        s = self.stores.evict(s, c, self.evictable[r]) or s
                stores.append(s)
            present = frozenset(c for r in range(n) for key in stores[r].present
                                if (c := self.written[r][key]) is not None)
            lcp = leading_run(present, k)
            reports = []
            for r in range(n):
                with protocol_call(r, "rank_lookup"):
                    reports.append(self.protocol.rank_lookup(r, n, self.hashes, stores[r].data.__contains__))
            with protocol_call(None, "combine"):
                planned = self.protocol.combine(list(reports), k)
            self.configs.append(_Config(tuple(Eviction(c, r) for r, c in sorted(out)), present, lcp, reports,
                                        planned, tuple(stores)))

    def lid(self, node: _Node, flag: int, store: _Store, asyncs: tuple) -> int:
        key = (node, flag, store, asyncs)
        got = self.local.get(key)
        if got is None:
            got = self.local[key] = len(self.L_node)
            self.L_node.append(node)
            self.L_flag.append(flag)
            self.L_store.append(store)
            self.L_async.append(asyncs)
            self.L_run.append(flag == _RUN and node.kind not in (_DONE, _RAISED))
            self.L_moves.append(node.depth + (flag != _RUN))
            self.L_br.append(None)
            self.L_ev.append(None)
            self.L_fast.append(None)
            self.L_evd.append(None)
            self.L_sig.append(self.sig_ids.setdefault(collective_signature(node.effect), len(self.sig_ids))
                              if flag == _ARRIVED else -1)
            if got > _LMASK:
                raise ExploreError(f"more than {_LMASK} local states of one rank: configuration too big")
        return got

    def pack(self, lids: Sequence[int], fc: int) -> int:
        st = fc
        for r, x in enumerate(lids):
            st |= x << self.shift[r]
        return st

    def unpack(self, st: int) -> tuple:
        """(lid_0, ..., lid_{N-1}, fc) of a packed state."""
        return tuple((st >> sh) & _LMASK for sh in self.shift) + (st & _FMASK,)

    def fast(self, lid: int) -> list:
        """`branches(lid)` as packed deltas, for the search loop."""
        out = self.L_fast[lid]
        if out is None:
            sh = self.shift[self.L_node[lid].rank]
            out = []
            for cost, nl, label in self.branches(lid):
                if type(nl) is not int:
                    out.append((cost, 0, nl, 2))
                else:
                    kind = 1 if label[0] == "arrive" else 0 if self.L_run[nl] else 3
                    out.append((cost, ((nl - lid) << sh) + cost, nl, kind))
            self.L_fast[lid] = out
        return out

    def fast_evictions(self, lid: int) -> list:
        out = self.L_evd[lid]
        if out is None:
            sh = self.shift[self.L_node[lid].rank]
            out = self.L_evd[lid] = [((nl - lid) << sh) + 1 for nl, _ in self.evictions(lid)]
        return out

    # -- rank-local transitions -------------------------------------------------------------------------
    def branches(self, lid: int) -> list:
        """Rank-local successors of `lid`'s move: [(cost, new lid | _Bad, label)].

        An arrival gives the arrived lid with label "arrive" (the caller checks desync and completion).
        """
        out = self.L_br[lid]
        if out is not None:
            return out
        node, store, asyncs = self.L_node[lid], self.L_store[lid], self.L_async[lid]
        kind, eff, r = node.kind, node.effect, node.rank
        out = []
        if kind == _COLL:
            out.append((0, self.lid(node, _ARRIVED, store, asyncs), ("arrive",)))
        elif kind == _BAD:
            out.append((0, _Bad("termination", f"rank {r} {node.error}"), ("move",)))
        elif kind == _WAIT:
            out.append((0,) + self._wait(lid, node, store, asyncs, eff) + (("move",),))
        elif kind in (_PUT, _GET, _GETASYNC):
            try:
                out.extend(self._store_op(node, store, asyncs, eff, kind, ("move",), 0))
                if self.reduction and self.maxf:
                    chunk = self.evictable[r].get(eff.key)
                    if chunk is not None and eff.key in store.present:
                        ev = self.stores.evict(store, chunk, self.evictable[r])
                        out.extend(self._store_op(node, ev, asyncs, eff, kind, ("evict", chunk), 1))
            except TypeError as exc:  # an unhashable key or a non-bytes value: the store call fails
                out = [(0, _Bad("termination", f"rank {r}: {eff!r} failed: {exc}"), ("move",))]
        self.L_br[lid] = out
        return out

    def _to(self, node: _Node, result: Any, store: _Store, asyncs: tuple) -> Any:
        child = self.tries.child(node, result)
        if child.kind == _RAISED:
            return _Bad("termination", child.error)
        return self.lid(child, _RUN, store, asyncs)

    def _store_op(self, node: _Node, store: _Store, asyncs: tuple, eff: Any, kind: int, label: tuple,
                  cost: int) -> list:
        if kind == _PUT:
            new = self.stores.put(store, eff.key, eff.value, self.evictable[node.rank])
            return [(cost, self._to(node, None, new, asyncs), label)]
        if kind == _GET:
            return [(cost, self._to(node, store.data.get(eff.key), store, asyncs), label)]
        handle = Handle(node.rank, len(asyncs), eff.key)
        out = [(cost, self._to(node, handle, store, asyncs + ((store.data.get(eff.key), _OK),)), label)]
        if cost < self.maxf:
            out.append((cost + 1, self._to(node, handle, store, asyncs + ((None, _LOST),)), label + ("lost",)))
            out.append((cost + 1, self._to(node, handle, store, asyncs + ((store.data.get(eff.key), _DELAYED),)),
                        label + ("delayed",)))
        return out

    def _wait(self, lid: int, node: _Node, store: _Store, asyncs: tuple, eff: Wait) -> tuple:
        h, r = eff.handle, node.rank
        if not isinstance(h, Handle) or h.rank != r or not isinstance(h.seq, int) or not 0 <= h.seq < len(asyncs):
            return (_Bad("termination", f"rank {r} waited on {h!r}, which is not a handle of its own GetAsync"),)
        value, status = asyncs[h.seq]
        late = status == _LOST or (status == _DELAYED and eff.timeout is not None and DELAY_SECONDS > eff.timeout)
        if late:
            if eff.timeout is None:
                return (self.lid(node, _HUNG, store, asyncs),)
            return (self._to(node, TIMED_OUT, store, asyncs),)
        return (self._to(node, value, store, asyncs),)

    def evictions(self, lid: int) -> list:
        """Eager evictions of `lid`'s store (the naive model): [(new lid, chunk)]."""
        out = self.L_ev[lid]
        if out is None:
            out = []
            store, r = self.L_store[lid], self.L_node[lid].rank
            for chunk in sorted(store.chunks):
                ev = self.stores.evict(store, chunk, self.evictable[r])
                out.append((self.lid(self.L_node[lid], self.L_flag[lid], ev, self.L_async[lid]), chunk))
            self.L_ev[lid] = out
        return out

    # -- collectives ----------------------------------------------------------------------------------------
    def arrive(self, lids: tuple, r: int) -> Any:
        """After rank r arrived (lids already hold its arrived lid): the same lids, the lids after the
        collective completed, or a `_Bad` desync."""
        L_sig = self.L_sig
        sig = L_sig[lids[r]]
        complete = True
        for q, x in enumerate(lids):
            other = L_sig[x]
            if other < 0:
                complete = False
            elif other != sig:
                nodes = [self.L_node[x] for x in lids]
                return _Bad("desync", f"collective #{self._coll_index(nodes[r])}: rank {q} entered "
                            f"{_sig_text(nodes[q].effect)}, rank {r} entered {_sig_text(nodes[r].effect)}")
        if not complete:
            return lids
        got = self.coll_memo.get(lids)
        if got is None:
            got = self.coll_memo[lids] = self._complete(lids, [self.L_node[x] for x in lids])
        return got

    @staticmethod
    def _coll_index(node: _Node) -> int:
        count, x = 0, node
        while x.parent is not None:
            x = x.parent
            count += x.kind == _COLL
        return count

    def _complete(self, lids: tuple, nodes: list) -> Any:
        n = self.n
        first = nodes[0].effect
        if isinstance(first, AllReduceMin):
            outs = [min(nd.effect.value for nd in nodes)] * n
        elif isinstance(first, AllGather):
            outs = [[nd.effect.value for nd in nodes]] * n
        else:
            if not 0 <= first.root < n:
                return _Bad("desync", f"collective #{self._coll_index(nodes[0])}: Broadcast from root "
                            f"{first.root}, which is not a rank of {n}")
            outs = [nodes[first.root].effect.value] * n
        new = []
        for r in range(n):
            x = self._to(nodes[r], outs[r], self.L_store[lids[r]], self.L_async[lids[r]])
            if isinstance(x, _Bad):
                return x
            new.append(x)
        return tuple(new)

    # -- terminal states ------------------------------------------------------------------------------------
    def terminal(self, st: tuple) -> list[Violation]:
        """Every violation of a state (unpacked) where no rank can move."""
        n = self.n
        fc = st[n]
        cfg, faults = divmod(fc, self.maxf + 1)
        key = (cfg, faults > 0) + tuple((self.L_node[x], self.L_flag[x]) for x in st[:n])
        got = self.term_memo.get(key)
        if got is None:
            got = self.term_memo[key] = self._check_terminal(st[:n], self.configs[cfg], faults > 0)
        return got

    def _check_terminal(self, lids: Sequence[int], cfg: _Config, faulted: bool) -> list[Violation]:
        n = self.n
        nodes = [self.L_node[x] for x in lids]
        flags = [self.L_flag[x] for x in lids]
        load_v: list[Violation] = []
        hung = [r for r in range(n) if flags[r] == _HUNG]
        for r in hung:
            load_v.append(Violation("hang", f"rank {r} waits forever on the completion of "
                                    f"GetAsync({self._wait_key(nodes[r], self.L_async[lids[r]])!r}), which never comes",
                                    {"rank": r}))
        waiting = [r for r in range(n) if flags[r] == _ARRIVED]
        if waiting and not hung:
            load_v.append(Violation("deadlock", f"ranks {waiting} wait in a collective that ranks "
                                    f"{[q for q in range(n) if q not in waiting]} never enter",
                                    {"stuck": waiting}))
        results = {r: nodes[r].ret for r in range(n) if nodes[r].kind == _DONE}
        reads = [(r, key) for r in range(n) for key in nodes[r].reads]
        load = SimResult(results, [], [], load_v, sum(self.L_moves[x] for x in lids), reads, [])
        return check_outcome(self._outcome(cfg, faulted, load))

    @staticmethod
    def _wait_key(node: _Node, asyncs: tuple) -> str:
        h = node.effect.handle
        return h.key if isinstance(h, Handle) else repr(h)

    def _outcome(self, cfg: _Config, faulted: bool, load: SimResult | None) -> Outcome:
        # `maximality` reads only `faults.after_lookup()`: a stand-in plan with the same answer.
        plan = FaultPlan(evict_before_lookup=cfg.evicted, lost=[(-1, -1)] if faulted else ())
        return Outcome(attrs.evolve(self.case0, faults=plan), self.name, self.hashes, self.kv, self.written,
                       cfg.cached, cfg.lcp, list(cfg.reports) if cfg.reports is not None else None, cfg.planned,
                       load)

    # -- successors, slowly (counterexample reconstruction) ---------------------------------------------
    def successors(self, packed: int) -> Iterable[tuple[tuple, Any]]:
        """Every (label, packed successor state or _Bad) of a packed state, in the search's order."""
        n, maxf = self.n, self.maxf
        st = self.unpack(packed)
        fc = st[n]
        budget = maxf - fc % (maxf + 1)
        ranks = [r for r in range(n) if self.L_run[st[r]]]
        if self.reduction:
            ranks = ranks[:1]
        for r in ranks:
            for cost, nl, label in self.branches(st[r]):
                if cost > budget:
                    continue
                if isinstance(nl, _Bad):
                    yield (r, label), nl
                    continue
                ns = st[:r] + (nl,) + st[r + 1:n] + (fc + cost,)
                if label[0] == "arrive":
                    got = self.arrive(ns[:n], r)
                    if isinstance(got, _Bad):
                        yield (r, label), got
                        continue
                    ns = got + (fc + cost,)
                yield (r, label), self.pack(ns[:n], ns[n])
        if not self.reduction and budget and ranks:
            for q in range(n):
                for nl, chunk in self.evictions(st[q]):
                    yield (q, ("eager-evict", chunk)), self.pack(st[:q] + (nl,) + st[q + 1:n], fc + 1)

    def steps(self, st: tuple) -> int:
        """Moves made to reach an unpacked state."""
        return sum(self.L_moves[x] for x in st[:self.n])


def _sig_text(effect: Any) -> str:
    name, root = collective_signature(effect)
    return f"{name}(root={root})" if root is not None else name


# -- the search ------------------------------------------------------------------------------------------------
_CHECK_EVERY = 4096


class _Found(Exception):
    def __init__(self, parent: int | None, label: Any, prop: str, cfg: int | None = None) -> None:
        self.parent, self.label, self.prop, self.cfg = parent, label, prop, cfg


class _Search(_Explorer):
    def run(self, should_stop: Callable[[], bool] | None, progress: Callable[[dict], None] | None) -> ExploreResult:
        t0 = time.perf_counter()
        self.seen: dict[int, int | None] = {}
        self.transitions = 0
        self.depth = 0
        self.dead: set[int] = set()
        self.terminals: set | None = getattr(self, "terminals", None)
        self.outcomes: set | None = getattr(self, "outcomes", None)
        try:
            verdict = self._bfs(should_stop, progress, t0)
        except _Found as found:
            case = self._case(found)
            outcome = run_case(self.protocol, case)
            match = [v for v in outcome.violations if v.property == found.prop]
            if not match:
                raise ExploreError(
                    f"explorer found {found.prop!r} for {self.name}, but run_case on its counterexample reports "
                    f"{outcome.violated() or 'no violation'}: the explorer and the simulator disagree ({case!r})")
            return ExploreResult("violated", len(self.seen), self.transitions, self.depth,
                                 time.perf_counter() - t0, case, match[0], outcome, len(self.configs),
                                 self.tries.count)
        return ExploreResult(verdict, len(self.seen), self.transitions, self.depth, time.perf_counter() - t0,
                             configs=len(self.configs), trie_nodes=self.tries.count)

    def _stats(self, t0: float) -> dict:
        dt = time.perf_counter() - t0
        return {"states": len(self.seen), "transitions": self.transitions, "depth": self.depth,
                "seconds": dt, "states_per_s": len(self.seen) / dt if dt > 0 else 0.0,
                "trie_nodes": self.tries.count, "local_states": len(self.L_node)}

    def _initial(self) -> list[int]:
        n, maxf1 = self.n, self.maxf + 1
        for v in self.store_violations:
            self._found(None, None, v.property, 0)
        if self.store_violations:
            return []
        frontier = []
        for ci, cfg in enumerate(self.configs):
            planned = cfg.planned
            if not isinstance(planned, int) or isinstance(planned, bool):
                self._found(None, None, "soundness", ci)
                continue
            lids = []
            for r in range(n):
                root = self.tries.root(r, planned)
                if root.kind == _RAISED:
                    self._found(None, None, "termination", ci)
                    break
                lids.append(self.lid(root, _RUN, cfg.stores[r], ()))
            if len(lids) < n:
                continue
            if ci * maxf1 > _FMASK:
                raise ExploreError(f"more than {_FMASK // maxf1} initial configurations: configuration too big")
            st = self.pack(lids, ci * maxf1)
            if st in self.seen:
                continue
            self.seen[st] = None
            frontier.append(st)
            lookup = self._outcome(cfg, False, None)
            for v in soundness(lookup) + completeness(lookup):
                self._found(None, None, v.property, ci)
            self._check_new(st, 0)
        return frontier

    def _check_new(self, packed: int, depth: int) -> None:
        """The checks of a newly reached state (off the hot path: quiescent, or near the step bound)."""
        st = self.unpack(packed)
        if not any(self.L_run[x] for x in st[:self.n]):
            if self.terminals is not None:
                self.terminals.add(self.terminal_signature(st))
            if self.outcomes is not None:
                self.outcomes.add(self.outcome_summary(st))
            for v in self.terminal(st):
                self._found(packed, None, v.property)
        elif depth >= self.bound and (self.reduction or self.steps(st) >= self.bound):
            self.dead.add(packed)  # the simulator stops here: never expanded
            self._found(packed, None, "termination")

    def terminal_signature(self, st: tuple) -> tuple:
        """A terminal state as (cfg, per rank (history, flag), whether a fault happened): everything the
        terminal checks depend on."""
        cfg, faults = divmod(st[self.n], self.maxf + 1)
        return ((cfg,) + tuple((tuple(self.L_node[x].history()), self.L_flag[x]) for x in st[:self.n])
                + (faults > 0,))

    def outcome_summary(self, st: tuple) -> tuple:
        """A terminal state as (cached set, planned, each finished rank's result, violated properties)."""
        cfg = self.configs[st[self.n] // (self.maxf + 1)]
        nodes = [self.L_node[x] for x in st[:self.n]]
        results = tuple(_freeze(nd.ret) if nd.kind == _DONE else None for nd in nodes)
        return cfg.cached, cfg.planned, results, tuple(sorted({v.property for v in self.terminal(st)}))

    def _found(self, parent: int | None, label: Any, prop: str, cfg: int | None = None) -> None:
        """Report a violation, unless only other properties are searched for."""
        if self.properties is None or prop in self.properties:
            raise _Found(parent, label, prop, cfg)

    def _bfs(self, should_stop, progress, t0) -> str:
        n, maxf, maxf1, reduction, bound = self.n, self.maxf, self.maxf + 1, self.reduction, self.bound
        seen, L_run, L_fast, L_evd = self.seen, self.L_run, self.L_fast, self.L_evd
        fast, fast_evictions, arrive, pack, unpack = self.fast, self.fast_evictions, self.arrive, self.pack, self.unpack
        check_new, dead, found = self._check_new, self.dead, self._found
        shifts, L_sig, coll_packed = self.shift, self.L_sig, self.coll_packed
        LMASK, FMASK, FB = _LMASK, _FMASK, _FB
        budgets = [maxf - f % maxf1 for f in range(maxf1)]
        frontier = self._initial()
        while frontier:
            nxt: list[int] = []
            append = nxt.append
            d1 = self.depth + 1
            near = d1 >= bound  # only then can a state reach the step bound (steps <= depth)
            trans = 0
            for start in range(0, len(frontier), _CHECK_EVERY):
                if should_stop is not None and should_stop():
                    self.transitions += trans
                    return "incomplete"
                if progress is not None:
                    progress(self._stats(t0))
                for st in frontier[start:start + _CHECK_EVERY]:
                    if dead and st in dead:
                        continue
                    budget = budgets[(st & FMASK) % maxf1]
                    runnable = False
                    for r in range(n):
                        lid = (st >> shifts[r]) & LMASK
                        if not L_run[lid]:
                            continue
                        runnable = True
                        brs = L_fast[lid]
                        if brs is None:
                            brs = fast(lid)
                        for cost, delta, nl, kind in brs:
                            if cost > budget:
                                continue
                            trans += 1
                            if kind:
                                if kind == 3:
                                    ns = st + delta
                                    if ns in seen:
                                        continue
                                    seen[ns] = st
                                    append(ns)
                                    check_new(ns, d1)
                                    continue
                                if kind == 2:
                                    found(st, (r, self.branches(lid)[brs.index((cost, delta, nl, kind))][2]),
                                          nl.property)
                                    continue
                                ns = st + delta
                                sig = L_sig[nl]
                                complete = True
                                for sh in shifts:
                                    other = L_sig[(ns >> sh) & LMASK]
                                    if other != sig:
                                        if other >= 0:  # a different collective: desync
                                            complete = None
                                            break
                                        complete = False
                                if complete is not False:
                                    high = ns >> FB
                                    got = coll_packed.get(high)
                                    if got is None:
                                        lids = unpack(ns)
                                        got = arrive(lids[:n], r)
                                        if type(got) is _Bad:
                                            found(st, (r, ("arrive",)), got.property)
                                            continue
                                        got = coll_packed[high] = pack(got, 0) >> _FB
                                    ns = (got << FB) | (ns & FMASK)
                                if ns in seen:
                                    continue
                                seen[ns] = st
                                append(ns)
                                check_new(ns, d1)
                                continue
                            ns = st + delta
                            if ns in seen:
                                continue
                            seen[ns] = st
                            append(ns)
                            if near:
                                check_new(ns, d1)
                        if reduction:
                            break
                    if budget and runnable and not reduction:
                        for q in range(n):
                            lid = (st >> shifts[q]) & LMASK
                            evs = L_evd[lid]
                            if evs is None:
                                evs = fast_evictions(lid)
                            for delta in evs:
                                trans += 1
                                ns = st + delta
                                if ns in seen:
                                    continue
                                seen[ns] = st
                                append(ns)
                                if near:
                                    check_new(ns, d1)
            self.transitions += trans
            frontier = nxt
            if frontier:
                self.depth = d1
        if progress is not None:
            progress(self._stats(t0))
        return "held"

    # -- the counterexample as a Case ----------------------------------------------------------------------------
    def _case(self, found: _Found) -> Case:
        n, maxf1 = self.n, self.maxf + 1
        if found.parent is None:
            cfg = self.configs[found.cfg or 0]
            return attrs.evolve(self.case0, faults=FaultPlan(evict_before_lookup=cfg.evicted))
        path = [found.parent]
        while self.seen[path[-1]] is not None:
            path.append(self.seen[path[-1]])
        path.reverse()
        steps: list[tuple[tuple, Any]] = []
        for a, b in zip(path, path[1:]):
            for lab, ns in self.successors(a):
                if ns == b:
                    steps.append((a, lab))
                    break
            else:  # pragma: no cover - a parent pointer always names a successor
                raise ExploreError("cannot reconstruct the counterexample path")
        if found.label is not None:
            steps.append((path[-1], found.label))
        self.depth = len(steps)
        cfg = self.configs[(path[0] & _FMASK) // maxf1]
        schedule: list[int] = []
        evictions, lost, delayed = [], [], []
        for st, (r, label) in steps:
            s = len(schedule)
            if label[0] == "eager-evict":
                evictions.append(Eviction(label[1], r, step=s))
                continue
            if label[0] == "evict":
                evictions.append(Eviction(label[1], r, step=s))
            i = len(self.L_async[self.unpack(st)[r]])
            if "lost" in label:
                lost.append((r, i))
            if "delayed" in label:
                delayed.append((r, i, DELAY_SECONDS))
            schedule.append(r)
        plan = FaultPlan(evict_before_lookup=cfg.evicted, evict_during_load=evictions, lost=lost, delayed=delayed)
        return attrs.evolve(self.case0, faults=plan, schedule=tuple(schedule))


def explore(protocol: Any, n_ranks: int, n_chunks: int, *, cached: Iterable[int] | str | None = None,
            max_faults: int = 1, reduction: bool = True, should_stop: Callable[[], bool] | None = None,
            progress: Callable[[dict], None] | None = None, salt: str = "s0",
            step_bound: int | None = None, properties: Iterable[str] | None = None) -> ExploreResult:
    """Breadth-first search of every interleaving and fault choice of `protocol`'s load (see the module doc).

    `cached`: None or "all" = every cached set (every subset of the store phase's (rank, chunk) units
    evicted before lookup), or the chunks cached at lookup. `max_faults`: faults after lookup per run.
    `reduction`: lazy eviction placement + partial-order reduction (sound; see the module doc).
    `should_stop()`: polled periodically; True stops with verdict "incomplete". `progress(stats)`:
    called periodically with a dict of counters. `properties`: only violations of these count (the
    search goes on past others, as TLC checks only the invariants it is given); None = every property.
    """
    if isinstance(cached, str) and cached != "all":
        raise ExploreError(f"cached must be 'all', None or chunk indices, got {cached!r}")
    search = _Search(protocol, n_ranks, n_chunks, None if cached in (None, "all") else frozenset(cached),
                     max_faults, reduction, salt, step_bound,
                     None if properties is None else frozenset(properties))
    return search.run(should_stop, progress)


def bench(seconds: float = 5.0, *, protocol: Any = None, n_ranks: int = 5, n_chunks: int = 10, max_faults: int = 2,
          reduction: bool = False, max_states: int = 6_000_000) -> dict:
    """Distinct states per second of the explorer on the reference protocol, over about `seconds`.

    Default configuration: `PaperProtocol`, 5 ranks, 10 chunks, every cached set, at most 2 faults, no
    reduction: the full interleaving space (millions of states), stopped after `seconds` (or `max_states`,
    to bound memory). `states_per_s` is over wall-clock time; `cpu_seconds` tells whether the machine was shared.
    """
    from model.protocols import PaperProtocol
    protocol = PaperProtocol() if protocol is None else protocol
    holder: dict = {}
    deadline = time.perf_counter() + seconds
    c0 = time.process_time()
    res = explore(protocol, n_ranks, n_chunks, max_faults=max_faults, reduction=reduction,
                  progress=lambda stats: holder.update(stats),
                  should_stop=lambda: time.perf_counter() >= deadline or holder.get("states", 0) >= max_states)
    cpu = time.process_time() - c0
    return {"states_per_s": res.states / res.seconds if res.seconds else 0.0, "states": res.states,
            "seconds": res.seconds, "cpu_seconds": cpu, "transitions": res.transitions, "verdict": res.verdict,
            "config": {"protocol": getattr(protocol, "name", type(protocol).__name__), "n_ranks": n_ranks,
                       "n_chunks": n_chunks, "cached": "all", "max_faults": max_faults, "reduction": reduction}}


def terminal_signatures(protocol: Any, n_ranks: int, n_chunks: int, *, reduction: bool, max_faults: int = 1,
                        cached: Iterable[int] | str | None = None) -> set:
    """Every reachable terminal state's signature (initial configuration, each rank's received results and
    status, whether a fault happened), ignoring violations (a test hook). The reduced set must be a subset
    of the unreduced one, equal to it once the fault flag is dropped (lazy eviction only drops evictions
    nobody observes)."""
    search = _Search(protocol, n_ranks, n_chunks, None if cached in (None, "all") else frozenset(cached),
                     max_faults, reduction, "s0", None, frozenset())
    search.terminals = set()
    search.run(None, None)
    return search.terminals


def terminal_outcomes(protocol: Any, n_ranks: int, n_chunks: int, *, reduction: bool = True,
                      max_faults: int = 1) -> set:
    """Every reachable terminal state as (cached set, planned, per rank its frozen result or None, violated
    properties): what a simulator run that ends with no rank able to move can produce (a test hook)."""
    search = _Search(protocol, n_ranks, n_chunks, None, max_faults, reduction, "s0", None, frozenset())
    search.outcomes = set()
    search.run(None, None)
    return search.outcomes


def outcome_summary(outcome: Outcome) -> tuple:
    """The same summary of a `run_case` outcome."""
    n = outcome.case.n_ranks
    results = tuple(_freeze(outcome.results[r]) if r in outcome.results else None for r in range(n))
    return outcome.cached, outcome.planned, results, tuple(outcome.violated())
