"""The explorer's state space: interned rank-local states, interned store contents, packing, and the
rank-local transitions (store effects, faults, collectives).

# The model explored
One global state is
    (lid_0, ..., lid_{N-1}, cf), packed into one int (cf + h_0 << 24 + h_1 << 48),
where `lid_r` interns rank r's local state (trie node, status flag, its own store's contents, its async
completions), `h_0` and `h_1` intern the tuples of local ids of the ranks [0, N // 2) and [N // 2, N) (dense ids
per half: `StateSpace.half_id`), and `cf = cfg * (max_faults + 1) + faults_used` names the initial configuration
(which units were evicted before lookup) and how many faults the run has used. Everything else a run
depends on is a function of that tuple: the rank-local program state is its trie node
(`checking.explore.tries`), the step count is the sum of the ranks' moves, the keys read are the reads
along the trie paths.

The store and lookup phases, and the initial configurations, are `checking.explore.setup`'s.

Transitions are "moves", exactly the simulator's (`model.sim`), with the meaning of every effect taken from
`model.interpreter` (a collective's results, a `Wait`'s outcome, the wording of every violation): a rank
executes its pending store effect and gets the result, or arrives at its pending collective; the last arrival
completes the collective and sends every rank its result. Logical time is not tracked: a `Wait` is judged as if
no time had passed since its `GetAsync` (a delayed completion arrives `DELAY_SECONDS` later: after any wait
timeout below that). Fault choices:
- eviction of one chunk from one rank's store (`Eviction(chunk, rank, step)`, harness semantics: only
  keys the store phase wrote and that were not evicted before), at any point of the load;
- a lost completion of any `GetAsync` (`lost=(rank, i)`);
- a delayed completion (`delayed=(rank, i, DELAY_SECONDS)`), beyond any wait timeout < DELAY_SECONDS.
Evictions before lookup are not faults: they are the initial configurations ("every cached set" is
every subset of the (rank, chunk) units the store phase wrote; a given cached set keeps exactly the
units of its chunks; with `lazy=True`, each unit's presence is decided when first observed instead:
see `checking.explore.lazy`). At most `max_faults` faults happen after the lookup per run. An eviction takes
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

from typing import Any, Sequence

from model.effects import Handle, TIMED_OUT, Wait, collective_signature
from model.faults import Eviction
from model.interpreter import (WAITS_FOREVER, collective_results, desync, handle_problem, rank_failed,
                               store_call_failed, timeout_problem, wait_outcome)
from model.outcome import Case, Violation

from checking.explore.result import ExploreError
from checking.explore.setup import SetUp
from checking.explore.stores import Config, Store, Stores
from checking.explore.tries import BAD, COLL, DONE, GET, GETASYNC, PUT, RAISED, WAIT, Node, Tries, freeze

__all__ = ["DELAY_SECONDS", "StateSpace", "Config", "RUN", "ARRIVED", "HUNG", "OK", "LOST", "DELAYED", "CF_BITS",
           "CF_MASK", "HALF_BITS", "HALF_MASK", "PLAIN", "ARRIVE", "FAIL", "LAST_MOVE"]

#: The delay of a delayed completion: beyond any wait timeout below it.
DELAY_SECONDS = 1.0e6

# a rank-local state's flag
RUN, ARRIVED, HUNG = 0, 1, 2
# an async completion's status
OK, LOST, DELAYED = 0, 1, 2
#: The labels of a lost and a delayed completion in a move (`checking.explore.reconstruct` reads them back).
LOST_LABEL, DELAYED_LABEL = "completion-lost", "completion-delayed"
# a global state packed into one int: the configuration-and-faults word in the low CF_BITS bits, then HALF_BITS bits
# of the first half's id, then the second half's id
CF_BITS = HALF_BITS = 24
CF_MASK = HALF_MASK = (1 << HALF_BITS) - 1
# a packed branch's kind: a plain move, an arrival at a collective, a move that fails (a termination or desync
# violation), a move after which the rank cannot move (the state may be terminal)
PLAIN, ARRIVE, FAIL, LAST_MOVE = 0, 1, 2, 3


class StateSpace:
    """The state space of one exploration: its set-up (`checking.explore.setup.SetUp`), interned rank-local states
    (the per-local-id tables below, index = local id) and their transitions. `checking.explore.bfs.Search` searches
    it."""

    def __init__(self, protocol: Any, n: int, k: int, *, cached: Any = None, max_faults: int = 1,
                 reduction: bool = True, salt: str = "s0", step_bound: int | None = None, lazy: bool = False,
                 shard: tuple[int, int] | None = None, others: tuple = ()) -> None:
        if lazy and others:
            raise ExploreError("the lazy initial state does not cover other prompts in the tier (their bytes under "
                               "this prompt's keys are no presence bit): explore them with the eager one")
        if n < 1 or k < 0 or max_faults < 0:
            raise ExploreError(f"need n_ranks >= 1, n_chunks >= 0, max_faults >= 0 (got {n}, {k}, {max_faults})")
        self.lazy = lazy and cached in (None, "all")
        self.protocol, self.n, self.k, self.max_faults, self.reduction = protocol, n, k, max_faults, reduction
        self.case0 = Case(n, k, salt=salt, step_bound=step_bound, others=others)
        self.bound = self.case0.bound()
        self.name = str(getattr(protocol, "name", type(protocol).__name__))
        self.stores = Stores()
        self.setup = SetUp(protocol, self.case0, self.stores, cached=cached, lazy=self.lazy, shard=shard,
                           most=CF_MASK // (max_faults + 1))
        self.evictable, self.unit_data, self.configs = self.setup.evictable, self.setup.unit_data, self.setup.configs
        self.tries = Tries(protocol, n, self.setup.hashes)
        self.local_ids: dict[tuple, int] = {}  # (node, flag, store, asyncs) -> its local id
        self.node_of: list[Node] = []  # the rank program's trie node
        self.flag_of: list[int] = []  # RUN, ARRIVED (waits in its node's collective) or HUNG (waits forever)
        self.store_of: list[Store] = []  # the rank's own store
        self.asyncs_of: list[tuple] = []  # its GetAsyncs' completions: ((value, OK | LOST | DELAYED), ...)
        self.can_move: list[bool] = []
        self.moves_of: list[int] = []  # the moves the rank made to get there
        self.branches_memo: list[list | None] = []  # `branches(lid)`
        self.evictions_memo: list[list | None] = []  # `evictions(lid)`
        # `branches(lid)` as [(cost, new lid | Violation, kind: PLAIN, ARRIVE, FAIL or LAST_MOVE)]
        self.packed_branches: list[list | None] = []
        self.arrived_sig: list[int] = []  # the id of the collective signature it waits in (-1: not arrived)
        self.status_code: list[int] = []  # its arrived_sig if arrived, -1 if it can move, -2 otherwise (done, hung)
        self.signature_ids: dict = {}
        self.completions: dict[int, int] = {}  # packed lids (no cf), all arrived -> packed lids after completion
        self.completion_memo: dict[tuple, tuple | Violation] = {}  # `_complete`, per tuple of arrived lids
        # the dense ids of each half's tuples of local ids (see the module doc), and the tables indexed by them
        self.h, self.shift1 = n // 2, CF_BITS + HALF_BITS
        self.half_ids: tuple[dict[tuple, int], dict[tuple, int]] = ({}, {})
        self.half_lids: tuple[list[tuple], list[tuple]] = ([], [])  # half id -> its tuple of local ids
        self.half_tables: tuple[list[list], list[list]] = ([], [])  # lists indexed by a half's ids (None: not yet)

    def lid(self, node: Node, flag: int, store: Store, asyncs: tuple) -> int:
        """The local id of a rank-local state (interned on first use)."""
        key = (node, flag, store, asyncs)
        got = self.local_ids.get(key)
        if got is None:
            got = self.local_ids[key] = len(self.node_of)
            self.node_of.append(node)
            self.flag_of.append(flag)
            self.store_of.append(store)
            self.asyncs_of.append(asyncs)
            can_move = flag == RUN and node.kind not in (DONE, RAISED)
            self.can_move.append(can_move)
            self.moves_of.append(node.depth + (flag != RUN))
            for memo in (self.branches_memo, self.evictions_memo, self.packed_branches):
                memo.append(None)
            sig = self.signature_ids.setdefault(collective_signature(node.effect), len(self.signature_ids)) \
                if flag == ARRIVED else -1
            self.arrived_sig.append(sig)
            self.status_code.append(sig if flag == ARRIVED else -1 if can_move else -2)
        return got

    def half_id(self, half: int, lids: tuple) -> int:
        """The dense id of half `half`'s tuple of local ids (interned on first use; every table in
        `half_tables[half]` grows with the ids)."""
        ids = self.half_ids[half]
        got = ids.get(lids)
        if got is None:
            got = ids[lids] = len(self.half_lids[half])
            if got > HALF_MASK:
                raise ExploreError(f"more than {HALF_MASK} states of one half of the ranks: configuration too big")
            self.half_lids[half].append(lids)
            for table in self.half_tables[half]:
                table.append(None)
        return got

    def pack(self, lids: Sequence[int], cf: int) -> int:
        h = self.h
        return cf | self.half_id(0, tuple(lids[:h])) << CF_BITS | self.half_id(1, tuple(lids[h:])) << self.shift1

    def unpack(self, st: int) -> tuple:
        """(lid_0, ..., lid_{N-1}, cf) of a packed state."""
        return self.half_lids[0][(st >> CF_BITS) & HALF_MASK] + self.half_lids[1][st >> self.shift1] + (st & CF_MASK,)

    def packed(self, lid: int) -> list:
        """`branches(lid)` classified, for the search loop: [(cost, new lid | Violation, kind)]."""
        out = self.packed_branches[lid]
        if out is None:
            out = []
            for cost, nl, label in self.branches(lid):
                if type(nl) is not int:
                    out.append((cost, nl, FAIL))
                else:
                    out.append((cost, nl, ARRIVE if label[0] == "arrive" else PLAIN if self.can_move[nl]
                                else LAST_MOVE))
            self.packed_branches[lid] = out
        return out

    # -- rank-local transitions -------------------------------------------------------------------------
    def branches(self, lid: int) -> list:
        """Rank-local successors of `lid`'s move: [(cost, new lid | Violation, label)].

        An arrival gives the arrived lid with label "arrive" (the caller checks desync and completion).
        """
        out = self.branches_memo[lid]
        if out is not None:
            return out
        node, store, asyncs = self.node_of[lid], self.store_of[lid], self.asyncs_of[lid]
        kind, eff, r = node.kind, node.effect, node.rank
        out = []
        if kind == COLL:
            out.append((0, self.lid(node, ARRIVED, store, asyncs), ("arrive",)))
        elif kind == BAD:
            out.append((0, node.failure, ("move",)))
        elif kind == WAIT:
            out.append((0, self._wait(node, store, asyncs, eff), ("move",)))
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
                out = [(0, store_call_failed(r, eff, exc), ("move",))]
        self.branches_memo[lid] = out
        return out

    def _store_branches(self, node: Node, store: Store, asyncs: tuple, eff: Any, kind: int) -> list:
        """The move, and (lazy eviction placement) evict-then-move when the key is an evictable present one."""
        out = self._store_op(node, store, asyncs, eff, kind, ("move",), 0)
        if self.reduction and self.max_faults:
            chunk = self.evictable[node.rank].get(eff.key)
            if chunk is not None and eff.key in store.present:
                ev = self.stores.evict(store, chunk, self.evictable[node.rank])
                out.extend(self._store_op(node, ev, asyncs, eff, kind, ("evict", chunk), 1))
        return out

    def _to(self, node: Node, result: Any, store: Store, asyncs: tuple, key: Any = None) -> int | Violation:
        """The running local state after `node` gets `result` (`key`: its `freeze`), or the child's failure."""
        child = self.tries.child(node, result, key)
        if child.kind == RAISED:
            return child.failure
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
        if cost < self.max_faults:
            out.append((cost + 1, self._to(node, handle, store, asyncs + ((None, LOST),)), label + (LOST_LABEL,)))
            out.append((cost + 1, self._to(node, handle, store, asyncs + ((store.data.get(eff.key), DELAYED),)),
                        label + (DELAYED_LABEL,)))
        return out

    def _wait(self, node: Node, store: Store, asyncs: tuple, eff: Wait) -> int | Violation:
        """The `Wait`'s outcome (`model.interpreter.wait_outcome`, no time passed since the `GetAsync`)."""
        r = node.rank
        problem = handle_problem(r, eff.handle, len(asyncs)) or timeout_problem(r, eff.timeout)
        if problem:
            return rank_failed(r, problem)
        value, status = asyncs[eff.handle.seq]
        late, _ = wait_outcome(0.0, 0.0, DELAY_SECONDS if status == DELAYED else 0.0, status == LOST, eff.timeout)
        if late is WAITS_FOREVER:
            return self.lid(node, HUNG, store, asyncs)
        return self._to(node, TIMED_OUT if late is TIMED_OUT else value, store, asyncs)

    def evictions(self, lid: int) -> list:
        """Eager evictions of `lid`'s store (the naive model): [(new lid, chunk)]."""
        out = self.evictions_memo[lid]
        if out is None:
            out = []
            store, r = self.store_of[lid], self.node_of[lid].rank
            for chunk in sorted(store.chunks):
                ev = self.stores.evict(store, chunk, self.evictable[r])
                out.append((self.lid(self.node_of[lid], self.flag_of[lid], ev, self.asyncs_of[lid]), chunk))
            self.evictions_memo[lid] = out
        return out

    # -- collectives ----------------------------------------------------------------------------------------
    def arrive(self, lids: tuple, r: int) -> tuple | Violation:
        """After rank r arrived (lids already hold its arrived lid): the same lids, the lids after the
        collective completed, or the desync (`model.interpreter.desync`)."""
        arrived_sig = self.arrived_sig
        sig = arrived_sig[lids[r]]
        complete = True
        for q, x in enumerate(lids):
            other = arrived_sig[x]
            if other < 0:
                complete = False
            elif other != sig:
                here, there = self.node_of[lids[r]], self.node_of[x]
                return desync(here.n_collectives, q, there.effect, r, here.effect)
        if not complete:
            return lids
        got = self.completion_memo.get(lids)
        if got is None:
            got = self.completion_memo[lids] = self._complete(lids)
        return got

    def _complete(self, lids: tuple) -> tuple | Violation:
        """The lids after the collective every rank of `lids` waits in completes (`collective_results`)."""
        nodes = [self.node_of[x] for x in lids]
        outs = collective_results([nd.effect for nd in nodes], nodes[0].n_collectives)
        if isinstance(outs, Violation):
            return outs
        new, key = [], freeze(outs[0])  # every rank gets the same result: frozen once
        for r in range(self.n):
            x = self._to(nodes[r], outs[r], self.store_of[lids[r]], self.asyncs_of[lids[r]], key)
            if type(x) is not int:
                return x
            new.append(x)
        return tuple(new)

    def steps(self, st: tuple) -> int:
        """Moves made to reach an unpacked state."""
        return sum(self.moves_of[x] for x in st[:self.n])

    def concrete_evicted(self, lids: Sequence[int], also: tuple | list = (),
                         undecided_present: bool = True) -> tuple[Eviction, ...]:
        """`SetUp.concrete_evicted` of the stores of the rank-local states `lids` (the lazy initial state)."""
        return self.setup.concrete_evicted([self.store_of[x] for x in lids], also, undecided_present)
