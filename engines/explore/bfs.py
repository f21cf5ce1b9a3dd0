"""The search loop: breadth-first over packed global states, with partial-order reduction.

# Partial-order reduction (`reduction=True`)
In every state only the lowest-numbered rank that can move is expanded (all of its branches: the plain
move, evict-then-move, lost, delayed). Valmari's stubborn-set conditions hold for T = {branches of rank r's
move}:
D1: every transition of another rank touches only that rank's local state, its own store, the arrivals of
the current collective (never completing it: r has not arrived), and the shared fault counter; r's
branches touch r's local state, store r, and the counter. Local parts are disjoint; the counter only adds
up, and a sequence is feasible iff its total is within the budget, whatever the order; two arrivals at one
collective commute (same arrival set; if their kinds differ, both orders reach a desync). So t1..tn t
executable implies t t1..tn executable to the same state.
D2: r's plain move is a key transition: nothing but r changes r's status.
The state graph is acyclic (each transition is one step), so no cycle proviso is needed, and stubborn sets
preserve every terminal state, hence every terminal-state violation. A violation on a transition of another
rank q (raise, desync) depends only on q and the arrived ranks, so it is still reached after r's move -
except when it happens exactly at the step bound, where the reduced search reports the step bound
(termination) instead. This is the classic result for deterministic message passing without wildcard
receives (ISP/POE for MPI): the only nondeterminism that matters here is the fault choices. The reduced
shortest counterexample is shortest within the reduced graph; `reduction=False` gives the true shortest.
Rank symmetry is NOT applied: ownership (c mod N), the rank in every key, AllGather's rank-indexed result
and Broadcast's root make ranks non-interchangeable; no permutation of ranks maps runs to runs in general,
and a per-protocol argument is not available for user protocols.

# Checks
At every transition: desync (the k-th collectives differ, or a Broadcast root out of range), a rank program
raising or yielding a non-effect / a foreign handle (termination); at every state, the step bound (a rank can
still move after `step_bound` moves: termination); at every state where no rank can move, every check of
`engines.explore.terminal`. The lookup phase's violations and the lookup properties (soundness,
completeness) are checked on the initial states. A counterexample is replayed with `model.harness.run_case`,
which must report the same property (`ExploreError` otherwise: the explorer and the simulator disagree).

# Speed
Every rank-local successor is memoised per local state as (fault cost, packed delta): expanding a global
state is integer shifts, one add per successor, and one dict look-up in `seen` (which also holds the BFS
parent, for the shortest counterexample). cProfile showed, in turn: tuple slicing/hashing of global states,
then unpacking/packing on every collective arrival, then module-global look-ups in the loop. Then (instruction
counts under callgrind, 5 ranks x 10 chunks unreduced: 21.8k -> 14.5k per state): each state's local states are
extracted once (the evictions reuse them); a local state whose every branch is a plain move keeps, per fault
budget, the tuple of the deltas it can afford (no unpacking nor cost test per transition); an arrival that does
not complete its collective, does not desync and leaves some rank able to move (judged from one summary of the
state's ranks, made at its first arrival) needs no new-state check away from the step bound. What is left is the
loop itself (int add, dict membership/insert, list append).
"""
from __future__ import annotations

import time
from typing import Any, Callable

from model.checks import completeness, soundness
from model.harness import run_case

from engines.explore.reconstruct import Found, Reconstruct
from engines.explore.result import ExploreError, ExploreResult
from engines.explore.state import FB as _FB, FMASK as _FMASK, LMASK as _LMASK, RUN, Bad, Explorer
from engines.explore.terminal import Terminal
from engines.explore.tries import RAISED

__all__ = ["Search"]

_CHECK_EVERY = 4096


class Search(Reconstruct, Terminal, Explorer):
    """One exploration: `run()` searches breadth-first and returns an `ExploreResult`."""

    def run(self, should_stop: Callable[[], bool] | None, progress: Callable[[dict], None] | None) -> ExploreResult:
        t0 = time.perf_counter()
        self.seen: dict[int, int | None] = {}
        self.transitions = 0
        self.depth = 0
        self.dead: set[int] = set()
        self.terminals: set | None = getattr(self, "terminals", None)
        self.outcomes: set | None = getattr(self, "outcomes", None)
        self.phase, self.init_added, self.level_start, self.level_hist, self.nxt = 0, [], [], [], []
        try:
            verdict = self._bfs(should_stop, progress, t0)
        except Found as found:
            self.found_key = self._key(found)
            if self.shard is not None and self.phase:  # the new states of the level cut short, per configuration
                self.level_hist.append(self._histogram(self.nxt))
            case = self.case_of(found)
            outcome = run_case(self.protocol, case)
            match = [v for v in outcome.violations if v.property == found.prop]
            if not match:
                raise ExploreError(
                    f"explorer found {found.prop!r} for {self.name}, but run_case on its counterexample reports "
                    f"{outcome.violated() or 'no violation'}: the explorer and the simulator disagree ({case!r})")
            return ExploreResult(verdict="violated", states=len(self.seen), transitions=self.transitions,
                                 depth=self.depth, seconds=time.perf_counter() - t0, counterexample=case,
                                 violation=match[0], outcome=outcome, configs=len(self.configs),
                                 trie_nodes=self.tries.count)
        return ExploreResult(verdict=verdict, states=len(self.seen), transitions=self.transitions, depth=self.depth,
                             seconds=time.perf_counter() - t0, configs=len(self.configs), trie_nodes=self.tries.count)

    def _key(self, found: Found) -> tuple[int, int, int]:
        """Where in the breadth-first order a violation was found: (phase: 0 set-up / 1 search, the level being
        expanded, the configuration of the state it was found from). The search meets violations in this order
        (each level is ordered by configuration), so the least key over shards is the one-process find."""
        cfg = found.cfg if found.parent is None else (found.parent & _FMASK) // (self.maxf + 1)
        return (self.phase, self.depth if self.phase else 0, -1 if cfg is None else cfg)

    def _histogram(self, states: list[int]) -> list[tuple[int, int]]:
        """[(configuration, how many of `states` start from it)], in configuration order."""
        maxf1, counts = self.maxf + 1, {}
        for st in states:
            c = (st & _FMASK) // maxf1
            counts[c] = counts.get(c, 0) + 1
        return sorted(counts.items())

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
            if cfg is None:  # another shard's
                continue
            for v in cfg.violations:  # the lookup phase's (a raising or stalling lookup or combine, a bad plan)
                self._found(None, None, v.property, ci)
            if cfg.violations:
                continue
            planned = cfg.planned
            lids = []
            for r in range(n):
                root = self.tries.root(r, planned)
                if root.kind == RAISED:
                    self._found(None, None, "termination", ci)
                    break
                lids.append(self.lid(root, RUN, cfg.stores[r], ()))
            if len(lids) < n:
                continue
            if ci * maxf1 > _FMASK:
                raise ExploreError(f"more than {_FMASK // maxf1} initial configurations: configuration too big")
            st = self.pack(lids, ci * maxf1)
            if st in self.seen:
                continue
            self.seen[st] = None
            frontier.append(st)
            self.init_added.append(ci)
            if planned > cfg.lcp_min:  # some completion of the undecided units breaks soundness: every one absent
                absent = self.concrete_evicted(lids, undecided_present=False) if self.lazy else cfg.evicted
                for v in soundness(self.lookup_outcome(absent)):
                    self._found(None, None, v.property, ci, absent)
            if planned < cfg.lcp:  # or completeness: every undecided unit present
                for v in completeness(self.lookup_outcome(cfg.evicted)):
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

    def _found(self, parent: int | None, label: Any, prop: str, cfg: int | None = None,
               evicted: tuple | None = None) -> None:
        """Report a violation, unless only other properties are searched for."""
        if self.properties is None or prop in self.properties:
            raise Found(parent, label, prop, cfg, evicted)

    def _bfs(self, should_stop, progress, t0) -> str:
        n, maxf, maxf1, reduction, bound = self.n, self.maxf, self.maxf + 1, self.reduction, self.bound
        seen, L_run, L_fast, L_evd, L_plain = self.seen, self.L_run, self.L_fast, self.L_evd, self.L_plain
        fast, fast_evictions, arrive, pack, unpack = self.fast, self.fast_evictions, self.arrive, self.pack, self.unpack
        check_new, dead, found = self._check_new, self.dead, self._found
        shifts, L_sig, L_code, coll_packed = self.shift, self.L_sig, self.L_code, self.coll_packed
        LMASK, FMASK, FB = _LMASK, _FMASK, _FB
        budgets = [maxf - f % maxf1 for f in range(maxf1)]
        frontier = self._initial()
        self.phase = 1
        record = self.shard is not None
        while frontier:
            nxt: list[int] = []
            append = nxt.append
            if record:
                self.level_start.append(len(seen))
                self.nxt = nxt
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
                    here = []  # the ranks' local states
                    for sh in shifts:
                        here.append((st >> sh) & LMASK)
                    waits = None  # at the state's first arrival: the collective ranks wait in (-3: several), how many
                    for lid in here:  # (a rank's local states are its own: its index is here.index(lid))
                        if not L_run[lid]:
                            continue
                        runnable = True
                        plain = L_plain[lid]
                        if plain is None:
                            fast(lid)
                            plain = L_plain[lid]
                        if plain:  # every branch a plain move: only the deltas affordable within the budget
                            deltas = plain[budget]
                            trans += len(deltas)
                            for delta in deltas:
                                ns = st + delta
                                if ns in seen:
                                    continue
                                seen[ns] = st
                                append(ns)
                                if near:
                                    check_new(ns, d1)
                            if reduction:
                                break
                            continue
                        brs = L_fast[lid]
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
                                    label = self.branches(lid)[brs.index((cost, delta, nl, kind))][2]
                                    found(st, (here.index(lid), label), nl.property)
                                    continue
                                sig = L_sig[nl]
                                if waits is None:
                                    waits, waiting, movers = -1, 0, 0  # ranks arrived / able to move, in st
                                    for x in here:
                                        c = L_code[x]
                                        if c == -1:
                                            movers += 1
                                        elif c >= 0:
                                            waits = c if waits in (-1, c) else -3
                                            waiting += 1
                                if movers > 1 and waiting < n - 1 and (waits == sig or waits == -1) and not near:
                                    # another rank is still to arrive (no desync, not complete) and another
                                    # rank can move (not terminal); not near the step bound: nothing to check
                                    ns = st + delta
                                    if ns in seen:
                                        continue
                                    seen[ns] = st
                                    append(ns)
                                    continue
                                ns = st + delta
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
                                        r = here.index(lid)
                                        lids = unpack(ns)
                                        got = arrive(lids[:n], r)
                                        if type(got) is Bad:
                                            found(st, (r, ("arrive",)), got.property)
                                            continue
                                        got = coll_packed[high] = pack(got, 0) >> FB
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
                        for lid in here:
                            evs = L_evd[lid]
                            if evs is None:
                                evs = fast_evictions(lid)
                            trans += len(evs)
                            for delta in evs:
                                ns = st + delta
                                if ns in seen:
                                    continue
                                seen[ns] = st
                                append(ns)
                                if near:
                                    check_new(ns, d1)
            self.transitions += trans
            if record:
                self.level_hist.append(self._histogram(nxt))
            frontier = nxt
            if frontier:
                self.depth = d1
        if progress is not None:
            progress(self._stats(t0))
        return "held"

