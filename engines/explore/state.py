"""The explorer's state space: interned rank-local states, interned store contents, packing, and the
rank-local transitions (store effects, faults, collectives).

# The model explored
One global state is
    (lid_0, ..., lid_{N-1}, fc), packed into one int (fc + sum lid_r << (24 + 24 r)),
where `lid_r` interns rank r's local state (trie node, status flag, its own store's contents, its async
completions) and `fc = cfg * (max_faults + 1) + faults_used` names the initial configuration (which
units were evicted before lookup) and how many faults the run has used. Everything else a run
depends on is a function of that tuple: the rank-local program state is its trie node
(`engines.explore.tries`), the step count is the sum of the ranks' moves, the keys read are the reads
along the trie paths.

The store and lookup phases are the harness's own (`model.harness.store_phase` and `lookup_phase`, over
in-memory stores): one store phase, then per initial configuration the evictions before lookup and one
lookup phase, whose violations (a raising or stalling lookup or `combine`, a plan that is not a count)
are that configuration's violations, exactly as `run_case` reports them.

Transitions are "moves", exactly the simulator's (`model.sim`): a rank executes its pending store
effect and gets the result, or arrives at its pending collective; the last arrival completes the
collective and sends every rank its result. Fault choices:
- eviction of one chunk from one rank's store (`Eviction(chunk, rank, step)`, harness semantics: only
  keys the store phase wrote and that were not evicted before), at any point of the load;
- a lost completion of any `GetAsync` (`lost=(rank, i)`);
- a delayed completion (`delayed=(rank, i, DELAY_SECONDS)`), beyond any wait timeout < DELAY_SECONDS.
Evictions before lookup are not faults: they are the initial configurations ("every cached set" is
every subset of the (rank, chunk) units the store phase wrote; a given cached set keeps exactly the
units of its chunks; with `lazy=True`, each unit's presence is decided when first observed instead:
see `engines.explore.lazy`). At most `max_faults` faults happen after the lookup per run. An eviction takes
one chunk from ONE rank's store: a whole-chunk eviction from k stores counts as k faults (the reference
protocols store each chunk on one rank, where the two coincide).

# Lazy eviction placement (`reduction=True`)
An eviction of chunk c from store r is observable only by rank r's next store effect on a key of chunk c
(no other rank reads store r; collectives do not read stores). So an eviction is only tried as a branch
of such a move ("evict c, then do the move"), never elsewhere. Moving an eviction later, past moves that
do not touch chunk c's keys on store r, changes no rank's history; an eviction that no later move
observes changes nothing but the fault count, and a run with a fault after lookup has a subset of the
violations of the same run without it (only maximality depends on faults, and it is waived when one
happened). So every violation of the eager model is found in the lazy one.
`reduction=False` explores the naive model instead: evictions as separate transitions of any present
(rank, chunk) at any state where a rank can still move.
"""
from __future__ import annotations

import itertools
from typing import Any, Sequence

import attrs

from model.effects import AllGather, AllReduceMin, Handle, TIMED_OUT, Wait, collective_signature
from model.faults import Eviction, FaultPlan
from model.harness import Shadow, chunk_hashes, kv_bytes, leading_run, lookup_phase, store_phase
from model.outcome import Case, Outcome, Violation
from model.store import MemoryStore, memory_factory

from engines.explore.lazy import product_leaves
from engines.explore.result import ExploreError
from engines.explore.stores import Config, Store, Stores
from engines.explore.tries import BAD, COLL, DONE, GET, GETASYNC, PUT, RAISED, WAIT, Node, Tries, freeze

__all__ = ["DELAY_SECONDS", "Explorer", "Bad", "Config", "sig_text"]

#: The delay of a delayed completion: beyond any wait timeout below it.
DELAY_SECONDS = 1.0e6

# local flags
RUN, ARRIVED, HUNG = 0, 1, 2
# async completion status
OK, LOST, DELAYED = 0, 1, 2
#: The labels of a lost and a delayed completion in a move (`engines.explore.reconstruct` reads them back).
LOST_LABEL, DELAYED_LABEL = "completion-lost", "completion-delayed"
# a global state packed into one int: fc in the low FB bits, then LB bits per rank's local state id
FB = LB = 24
FMASK = LMASK = (1 << LB) - 1


class Bad:
    """A transition that ends the run with a violation."""

    __slots__ = ("property", "summary")

    def __init__(self, prop: str, summary: str) -> None:
        self.property, self.summary = prop, summary


class Explorer:
    """The state space of one exploration: set-up (store and lookup phases, initial configurations), interned
    rank-local states and their transitions. `engines.explore.bfs.Search` searches it."""

    def __init__(self, protocol: Any, n: int, k: int, *, cached: Any = None, max_faults: int = 1,
                 reduction: bool = True, salt: str = "s0", step_bound: int | None = None,
                 properties: frozenset | None = None, lazy: bool = False,
                 shard: tuple[int, int] | None = None, others: tuple = ()) -> None:
        self.properties = properties
        if lazy and others:
            raise ExploreError("the lazy initial state does not cover other prompts in the tier (their bytes under "
                               "this prompt's keys are no presence bit): explore them with the eager one")
        self.lazy = lazy and cached in (None, "all")
        self.shard = shard  # (index, count): explore only the configurations of that shard (engines.explore.shards)
        if n < 1 or k < 0 or max_faults < 0:
            raise ExploreError(f"need n_ranks >= 1, n_chunks >= 0, max_faults >= 0 (got {n}, {k}, {max_faults})")
        self.protocol, self.n, self.k, self.maxf, self.reduction = protocol, n, k, max_faults, reduction
        self.salt = salt
        self.case0 = Case(n, k, salt=salt, step_bound=step_bound, others=others)
        self.bound = self.case0.bound()
        self.hashes, self.kv = chunk_hashes(k, salt), kv_bytes(k, salt)
        self.name = str(getattr(protocol, "name", type(protocol).__name__))
        self.tries = Tries(protocol, n, self.hashes)
        self.stores = Stores()
        # interned rank-local states
        self.local: dict = {}
        self.L_node: list[Node] = []
        self.L_flag: list[int] = []
        self.L_store: list[Store] = []
        self.L_async: list[tuple] = []
        self.L_run: list[bool] = []
        self.L_moves: list[int] = []
        self.L_br: list = []
        self.L_ev: list = []
        # per lid: [(cost, packed delta, new lid | Bad, kind)]; kind 0 move, 1 arrive, 2 bad, 3 move after which
        # the rank cannot move (the state may be terminal)
        self.L_fast: list = []
        # per lid, when every branch of its move is a plain move (kind 0): per fault budget b, the packed deltas of
        # the branches costing at most b, in branch order (the loop's fast path); False otherwise
        self.L_plain: list = []
        self.L_evd: list = []  # per lid: packed deltas of its eager evictions
        self.L_sig: list[int] = []  # per lid: the id of the collective signature it waits in (-1: not arrived)
        self.L_code: list[int] = []  # per lid: its L_sig if arrived, -1 if it can move, -2 otherwise (done, hung)
        self.sig_ids: dict = {}
        self.coll_packed: dict[int, int] = {}  # packed lids (no fc) all arrived -> packed lids after completion
        self.shift = [FB + LB * r for r in range(n)]
        self.coll_memo: dict = {}
        self.term_memo: dict = {}
        self.store_violations: list[Violation] = []
        self._store_phase(cached)

    # -- set-up: the harness's store phase, then per initial configuration its lookup phase ----------
    def _store_phase(self, cached: Any) -> None:
        n, k = self.n, self.k
        mem = memory_factory(n)
        out, shadow = store_phase(self.protocol, self.case0, mem, hashes=self.hashes, kv=self.kv)
        self.store_outcome, self.store_shadow = out, shadow
        self.written: dict[int, dict[str, int | None]] = out.written
        self.store_violations = list(out.violations)
        self.evictable = {r: {key: c for key, c in w.items() if c is not None} for r, w in self.written.items()}
        units = sorted({(r, c) for r, w in self.evictable.items() for c in w.values()})
        most = FMASK // (self.maxf + 1)  # the configurations a packed state can name
        if cached is None or cached == "all":
            if not self.lazy and 2 ** len(units) > most:  # refused before any is built (2^units of them)
                raise ExploreError(f"{len(units)} stored (rank, chunk) units make 2^{len(units)} cached sets, more "
                                   f"than the {most} initial configurations a state can name: use the lazy "
                                   "initial state")
            choices = () if self.lazy else (frozenset(s) for size in range(len(units) + 1)
                                            for s in itertools.combinations(units, size))
        else:
            keep = set(cached)
            bad = keep - set(range(k))
            if bad:
                raise ExploreError(f"cached chunks {sorted(bad)} are not chunks of 0..{k - 1}")
            choices = [frozenset(u for u in units if u[1] not in keep)]
        self.after_store = [dict(mem[r].data) for r in range(n)]
        self.unit_data = [{c: {key: self.after_store[r][key] for key, cc in self.evictable[r].items() if cc == c}
                           for c in set(self.evictable[r].values())} for r in range(n)]
        self.configs: list[Config] = []
        if self.store_violations:
            return
        if self.lazy:
            self._lazy_configs()
            return
        for ci, evicted in enumerate(choices):
            if not self.mine(ci):
                self.configs.append(None)  # another shard's: its lookup runs there
                continue
            look, stores = self.lookup(tuple(Eviction(c, r) for r, c in sorted(evicted)))
            interned = tuple(self.stores.make(dict(stores[r].data),
                                              frozenset(key for key in self.evictable[r] if key in stores[r].data),
                                              self.evictable[r]) for r in range(n))
            self.configs.append(Config(tuple(Eviction(c, r) for r, c in sorted(evicted)), look.cached, look.lcp,
                                       look.reports, look.planned, interned, tuple(look.violations), look.lcp))
            if any("stalled" in v.detail for v in look.violations):
                break  # a lookup that does not return: reported on this configuration; later ones would stall too

    def mine(self, ci: int) -> bool:
        """Whether configuration `ci` is explored here (every one, unless this search is one shard)."""
        return self.shard is None or ci % self.shard[1] == self.shard[0]

    def _lazy_configs(self) -> None:
        """One configuration per leaf of the lookup's decision tree (`engines.explore.lazy.product_leaves`)."""
        k = self.k
        for ci, (bits, reports, planned, judge) in enumerate(product_leaves(self.protocol, self.hashes,
                                                                            self.after_store, self.evictable)):
            if ci > FMASK // (self.maxf + 1):
                raise ExploreError(f"the lookup has more than {FMASK // (self.maxf + 1)} outcomes: more initial "
                                   "configurations than a state can name")
            if not self.mine(ci):
                self.configs.append(None)
                continue
            stores, absent, low, high = [], [], set(), set()
            for r, units in enumerate(self.unit_data):
                store, gone, present_at_lookup, maybe = self._lazy_store(r, tuple(bits.get((r, c)) for c in units))
                stores.append(store)
                absent.extend(gone)
                low |= present_at_lookup
                high |= maybe
            evicted, violations = tuple(Eviction(c, r) for r, c in sorted(absent)), ()
            if judge:  # something went wrong in this lookup: the harness's lookup phase says what, as run_case does
                look, _ = self.lookup(evicted)
                reports, planned, violations = look.reports, look.planned, tuple(look.violations)
            self.configs.append(Config(evicted, frozenset(high), leading_run(high, k), reports, planned,
                                       tuple(stores), violations, leading_run(low, k)))
            if any("stalled" in v.detail for v in violations):
                break  # a lookup that does not return: reported on this configuration; later ones would stall too

    def _lazy_store(self, r: int, bits: tuple) -> tuple:
        """Rank r's store at lookup with its units' bits (True present, False absent, None undecided, in the
        order of `unit_data[r]`): (store, units known absent, chunks known present, chunks maybe present)."""
        memo = self.__dict__.setdefault("_lazy_stores", {})
        got = memo.get((r, bits))
        if got is None:
            data = dict(self.after_store[r])
            init, undecided, gone = set(), set(), []
            for (c, keys), bit in zip(self.unit_data[r].items(), bits):
                if bit:
                    init.add(c)
                    continue
                for key in keys:
                    del data[key]
                (gone.append((r, c)) if bit is False else undecided.add(c))
            present = frozenset(key for key in self.evictable[r] if key in data)
            store = self.stores.make(data, present, self.evictable[r], frozenset(init), frozenset(undecided))
            got = memo[(r, bits)] = (store, tuple(gone), frozenset(init), frozenset(init | undecided))
        return got

    def lookup(self, evicted: tuple[Eviction, ...]) -> tuple[Outcome, list[MemoryStore]]:
        """The harness's lookup phase after the store phase and `evicted`: its outcome (with the events of
        both phases) and the stores it ran over."""
        stores = []
        for data in self.after_store:
            s = MemoryStore()
            s.data = dict(data)
            stores.append(s)
        shadow = Shadow(stores, self.written)
        shadow.overwritten = {r: set(keys) for r, keys in self.store_shadow.overwritten.items()}
        shadow.others = self.store_shadow.others  # (other prompts' writes: what their evictions delete)
        for e in evicted:
            shadow.evict(e)
        out = attrs.evolve(self.store_outcome, case=attrs.evolve(self.case0, faults=FaultPlan.of(before_lookup=evicted)),
                           events=list(self.store_outcome.events), violations=[])
        lookup_phase(self.protocol, out, stores, shadow)
        return out, stores

    def lid(self, node: Node, flag: int, store: Store, asyncs: tuple) -> int:
        key = (node, flag, store, asyncs)
        got = self.local.get(key)
        if got is None:
            got = self.local[key] = len(self.L_node)
            self.L_node.append(node)
            self.L_flag.append(flag)
            self.L_store.append(store)
            self.L_async.append(asyncs)
            self.L_run.append(flag == RUN and node.kind not in (DONE, RAISED))
            self.L_moves.append(node.depth + (flag != RUN))
            self.L_br.append(None)
            self.L_ev.append(None)
            self.L_fast.append(None)
            self.L_plain.append(None)
            self.L_evd.append(None)
            self.L_sig.append(self.sig_ids.setdefault(collective_signature(node.effect), len(self.sig_ids))
                              if flag == ARRIVED else -1)
            self.L_code.append(self.L_sig[-1] if flag == ARRIVED else -1 if self.L_run[-1] else -2)
            if got > LMASK:
                raise ExploreError(f"more than {LMASK} local states of one rank: configuration too big")
        return got

    def pack(self, lids: Sequence[int], fc: int) -> int:
        st = fc
        for r, x in enumerate(lids):
            st |= x << self.shift[r]
        return st

    def unpack(self, st: int) -> tuple:
        """(lid_0, ..., lid_{N-1}, fc) of a packed state."""
        return tuple((st >> sh) & LMASK for sh in self.shift) + (st & FMASK,)

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
            plain = all(b[3] == 0 for b in out)
            self.L_plain[lid] = plain and tuple(tuple(b[1] for b in out if b[0] <= budget)
                                                for budget in range(self.maxf + 1))
        return out

    def fast_evictions(self, lid: int) -> list:
        out = self.L_evd[lid]
        if out is None:
            sh = self.shift[self.L_node[lid].rank]
            out = self.L_evd[lid] = [((nl - lid) << sh) + 1 for nl, _ in self.evictions(lid)]
        return out

    # -- rank-local transitions -------------------------------------------------------------------------
    def branches(self, lid: int) -> list:
        """Rank-local successors of `lid`'s move: [(cost, new lid | Bad, label)].

        An arrival gives the arrived lid with label "arrive" (the caller checks desync and completion).
        """
        out = self.L_br[lid]
        if out is not None:
            return out
        node, store, asyncs = self.L_node[lid], self.L_store[lid], self.L_async[lid]
        kind, eff, r = node.kind, node.effect, node.rank
        out = []
        if kind == COLL:
            out.append((0, self.lid(node, ARRIVED, store, asyncs), ("arrive",)))
        elif kind == BAD:
            out.append((0, Bad("termination", f"rank {r} {node.error}"), ("move",)))
        elif kind == WAIT:
            out.append((0,) + self._wait(lid, node, store, asyncs, eff) + (("move",),))
        elif kind in (PUT, GET, GETASYNC):
            try:
                chunk = self.evictable[r].get(eff.key)
                if chunk is not None and chunk in store.undecided:  # the first observation of a lazy unit
                    for bit in (True, False):
                        decided = self.stores.decide(store, chunk, bit, self.unit_data[r][chunk], self.evictable[r])
                        out.extend((cost, nl, label + (("decide", chunk, bit),))
                                   for cost, nl, label in self._store_branches(node, decided, asyncs, eff, kind))
                else:
                    out.extend(self._store_branches(node, store, asyncs, eff, kind))
            except TypeError as exc:  # an unhashable key or a non-bytes value: the store call fails
                out = [(0, Bad("termination", f"rank {r}: {eff!r} failed: {exc}"), ("move",))]
        self.L_br[lid] = out
        return out

    def _store_branches(self, node: Node, store: Store, asyncs: tuple, eff: Any, kind: int) -> list:
        """The move, and (lazy eviction placement) evict-then-move when the key is an evictable present one."""
        out = self._store_op(node, store, asyncs, eff, kind, ("move",), 0)
        if self.reduction and self.maxf:
            chunk = self.evictable[node.rank].get(eff.key)
            if chunk is not None and eff.key in store.present:
                ev = self.stores.evict(store, chunk, self.evictable[node.rank])
                out.extend(self._store_op(node, ev, asyncs, eff, kind, ("evict", chunk), 1))
        return out

    def _to(self, node: Node, result: Any, store: Store, asyncs: tuple, key: Any = None) -> Any:
        child = self.tries.child(node, result, key)
        if child.kind == RAISED:
            return Bad("termination", child.error)
        return self.lid(child, RUN, store, asyncs)

    def _store_op(self, node: Node, store: Store, asyncs: tuple, eff: Any, kind: int, label: tuple,
                  cost: int) -> list:
        if kind == PUT:
            new = self.stores.put(store, eff.key, eff.value, self.evictable[node.rank])
            return [(cost, self._to(node, None, new, asyncs), label)]
        if kind == GET:
            return [(cost, self._to(node, store.data.get(eff.key), store, asyncs), label)]
        handle = Handle(node.rank, len(asyncs), eff.key)
        out = [(cost, self._to(node, handle, store, asyncs + ((store.data.get(eff.key), OK),)), label)]
        if cost < self.maxf:
            out.append((cost + 1, self._to(node, handle, store, asyncs + ((None, LOST),)), label + (LOST_LABEL,)))
            out.append((cost + 1, self._to(node, handle, store, asyncs + ((store.data.get(eff.key), DELAYED),)),
                        label + (DELAYED_LABEL,)))
        return out

    def _wait(self, lid: int, node: Node, store: Store, asyncs: tuple, eff: Wait) -> tuple:
        h, r = eff.handle, node.rank
        if not isinstance(h, Handle) or h.rank != r or not isinstance(h.seq, int) or not 0 <= h.seq < len(asyncs):
            return (Bad("termination", f"rank {r} waited on {h!r}, which is not a handle of its own GetAsync"),)
        value, status = asyncs[h.seq]
        late = status == LOST or (status == DELAYED and eff.timeout is not None and DELAY_SECONDS > eff.timeout)
        if late:
            if eff.timeout is None:
                return (self.lid(node, HUNG, store, asyncs),)
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
        collective completed, or a `Bad` desync."""
        L_sig = self.L_sig
        sig = L_sig[lids[r]]
        complete = True
        for q, x in enumerate(lids):
            other = L_sig[x]
            if other < 0:
                complete = False
            elif other != sig:
                nodes = [self.L_node[x] for x in lids]
                return Bad("desync", f"collective #{self._coll_index(nodes[r])}: rank {q} entered "
                            f"{sig_text(nodes[q].effect)}, rank {r} entered {sig_text(nodes[r].effect)}")
        if not complete:
            return lids
        got = self.coll_memo.get(lids)
        if got is None:
            got = self.coll_memo[lids] = self._complete(lids, [self.L_node[x] for x in lids])
        return got

    @staticmethod
    def _coll_index(node: Node) -> int:
        count, x = 0, node
        while x.parent is not None:
            x = x.parent
            count += x.kind == COLL
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
                return Bad("desync", f"collective #{self._coll_index(nodes[0])}: Broadcast from root "
                            f"{first.root}, which is not a rank of {n}")
            outs = [nodes[first.root].effect.value] * n
        new, key = [], freeze(outs[0])  # every rank gets the same result: frozen once
        for r in range(n):
            x = self._to(nodes[r], outs[r], self.L_store[lids[r]], self.L_async[lids[r]], key)
            if isinstance(x, Bad):
                return x
            new.append(x)
        return tuple(new)

    def steps(self, st: tuple) -> int:
        """Moves made to reach an unpacked state."""
        return sum(self.L_moves[x] for x in st[:self.n])


def sig_text(effect: Any) -> str:
    name, root = collective_signature(effect)
    return f"{name}(root={root})" if root is not None else name

