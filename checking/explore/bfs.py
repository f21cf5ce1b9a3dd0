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
`checking.explore.terminal.Terminals`. The lookup phase's violations and the lookup properties (soundness,
completeness) are checked on the initial states. A counterexample is replayed with `model.harness.run_case`,
which must report the same property (`ExploreError` otherwise: the explorer and the simulator disagree).

# Speed
Every rank-local successor is memoised per local state as (fault cost, packed delta): expanding a global
state is integer shifts, one add per successor, and one dict look-up in the next level's dict (which also holds
the BFS parent, for the shortest counterexample). A state has one depth: every transition is one move (the sum of
the ranks' `moves_of` grows by one), except an eager eviction (unreduced only), which is one fault and no move. So
the depth is the moves plus, unreduced, the faults used less the lost and delayed completions the local states
record: a function of the state, and a successor of depth d+1 can only have been reached before at depth d+1. The level's own dict is then
the whole duplicate check (smaller than one dict of every state, and its keys in order are the next frontier: no
list to append to). cProfile showed, in turn: tuple slicing/hashing of global states,
then unpacking/packing on every collective arrival, then module-global look-ups in the loop. Then (instruction
counts under callgrind, 5 ranks x 10 chunks unreduced: 21.8k -> 14.5k per state): each state's local states are
extracted once (the evictions reuse them); a local state whose every branch is a plain move keeps, per fault
budget, the tuple of the deltas it can afford (no unpacking nor cost test per transition); an arrival that does
not complete its collective, does not desync and leaves some rank able to move (judged from one summary of the
state's ranks, made at its first arrival) needs no new-state check away from the step bound (10.7k per state over
the first 300k states). What is left is the loop itself (int add, dict membership/insert): 10.4k.
Then (states 53k..809k of the same run: 14.8k -> 7.5k per state) the deltas of each half of the ranks are memoised
per (half's local states, budget) with a class per half, and a table over pairs of classes says whether a state's
successors are all plain (`checking.explore.halves`; 91% of the full space's states): such a state is two look-ups, a
list look-up and the loop over its deltas; any other takes the loop above (`checking.explore.slow`, its tables bound once per
search). A level is built one configuration at a time (a state's successors keep its configuration, and a level is
ordered by configuration): the duplicate check is in that configuration's small dict (`pending`), kept once done as
the level's next part (`checking.explore.level.Level`; merging the parts into one dict took a tenth of the wall time
under py-spy, the cache misses of one big dict, and 500 instructions per state), so the same order. Terminal checks are memoised on what `check_outcome` reads, not on the
configuration (`Terminals.violations`): on the full 5 x 10 space, 24,779 terminal states cost 3.9 CPU s of 11.6
with the configuration in the key, 0.6 s without (1,613 misses). What is left is the dict and int work of the loop
(about 2/3 of the instructions) and the slow path at completions.
Then (the bench's first 2M states, all instructions of the process: 11.4k -> 10.1k per state) each half of a state is
a dense id of its ranks' local ids (`checking.explore.state`): a half's entry is a list look-up (no hash, no compare),
and a state a 72-bit int, not 144 (cheaper add, hash and compare); each half id's deltas are computed once, per rank
(`Halves.rank_moves`). A level's per-configuration dicts are the next frontier (no list copies, which the collector
would traverse), and the hot loop inserts with `dict.setdefault` (one look-up per successor).
"""
from __future__ import annotations

import gc
import time
from itertools import islice
from typing import Any, Callable, Iterator

from model.checks import completeness, soundness
from model.harness import run_case
from model.interpreter import step_bound
from model.outcome import Violation

from checking.explore.expand import expand_plain
from checking.explore.halves import Halves
from checking.explore.level import Level
from checking.explore.reconstruct import Reached, case_of
from checking.explore.result import ExploreError, ExploreResult
from checking.explore.slow import slow_expander
from checking.explore.state import CF_BITS, CF_MASK, RUN, StateSpace
from checking.explore.terminal import Terminals
from checking.explore.tries import RAISED

__all__ = ["Search"]

_CHECK_EVERY = 4096


class Search:
    """One exploration of the state space `space` (built from the `StateSpace` options): `run()` searches breadth-first
    and returns an `ExploreResult`. `properties`: only violations of these are reported (None: every one);
    `record_terminals` / `record_outcomes`: collect every terminal state's `Terminals.signature` / `.summary`."""

    def __init__(self, protocol: Any, n: int, k: int, *, properties: frozenset | None = None,
                 record_terminals: bool = False, record_outcomes: bool = False, **options: Any) -> None:
        self.space = StateSpace(protocol, n, k, **options)
        self.setup = self.space.setup
        self.terminal = Terminals(self.space)
        self.halves = Halves(self.space)
        self.budgets: list[int] = []  # the fault budget left, per cf (set once the configurations are known)
        self.properties = properties
        self.shard: tuple[int, int] | None = options.get("shard")
        self.terminal_signatures: set | None = set() if record_terminals else None
        self.outcome_summaries: set | None = set() if record_outcomes else None
        # per depth d, the states first reached at d -> their BFS parent (None: an initial state). A state has one
        # depth (see Speed), so a level's own dict is its whole "seen" check, and its keys, in order, its frontier
        # (level 0 is one dict; every later level a `Level` of one dict per configuration).
        self.levels: list[dict[int, int | None] | Level] = []
        self.dead: set[int] = set()  # states at the step bound: never expanded
        self.transitions = self.depth = self.phase = 0  # phase: 0 set-up, 1 search
        self.init_added: list[int] = []  # the configuration of each initial state, in order
        self.level_start: list[int] = []  # (a shard's) distinct states before each level
        self.level_hist: list[list[tuple[int, int]]] = []  # (a shard's) each level's new states per configuration
        self.nxt = Level()  # the level being built
        self.pending: dict[int, int | None] = {}  # its new states of the configuration being expanded (see Speed)
        self.reached: Reached | None = None  # the violation the search reached (its own words; run_case replays it)
        self.found_key: tuple[int, int, int] | None = None
        self._expand_slow: Callable[[Any, dict, int], int] | None = None  # `checking.explore.slow` (set once in `_bfs`)

    def run(self, should_stop: Callable[[], bool] | None, progress: Callable[[dict], None] | None) -> ExploreResult:
        try:
            return self._run(should_stop, progress)
        finally:
            gc.unfreeze()  # the objects each level froze (`_bfs`) are the collector's again

    def _run(self, should_stop: Callable[[], bool] | None, progress: Callable[[dict], None] | None) -> ExploreResult:
        t0 = time.perf_counter()
        space = self.space
        try:
            verdict = self._bfs(should_stop, progress, t0)
        except Reached as reached:
            self._flush()
            self.reached, self.found_key = reached, self._key(reached)
            if self.shard is not None and self.phase:  # the new states of the level cut short, per configuration
                self.level_hist.append(self._histogram(self.nxt))
            case, self.depth = case_of(space, self.levels, reached)
            outcome = run_case(space.protocol, case)
            match = [v for v in outcome.violations if v.property == reached.prop]
            if not match:
                raise ExploreError(
                    f"explorer found {reached.prop!r} for {space.name}, but run_case on its counterexample reports "
                    f"{outcome.violated() or 'no violation'}: the explorer and the simulator disagree ({case!r})")
            return ExploreResult(verdict="violated", states=self.n_states(), transitions=self.transitions,
                                 depth=self.depth, seconds=time.perf_counter() - t0, counterexample=case,
                                 violation=match[0], outcome=outcome, configs=len(space.configs),
                                 trie_nodes=space.tries.count)
        return ExploreResult(verdict=verdict, states=self.n_states(), transitions=self.transitions, depth=self.depth,
                             seconds=time.perf_counter() - t0, configs=len(space.configs), trie_nodes=space.tries.count)

    def _key(self, reached: Reached) -> tuple[int, int, int]:
        """Where in the breadth-first order a violation was found: (phase: 0 set-up / 1 search, the level being
        expanded, the configuration of the state it was found from). The search meets violations in this order
        (each level is ordered by configuration), so the least key over shards is the one-process find."""
        cfg = reached.cfg if reached.parent is None else (reached.parent & CF_MASK) // (self.space.max_faults + 1)
        return (self.phase, self.depth if self.phase else 0, -1 if cfg is None else cfg)

    def _histogram(self, states: list[int]) -> list[tuple[int, int]]:
        """[(configuration, how many of `states` start from it)], in configuration order."""
        max_faults1, counts = self.space.max_faults + 1, {}
        for st in states:
            c = (st & CF_MASK) // max_faults1
            counts[c] = counts.get(c, 0) + 1
        return sorted(counts.items())

    def _stats(self, t0: float) -> dict:
        dt = time.perf_counter() - t0
        states = self.n_states()
        return {"states": states, "transitions": self.transitions, "depth": self.depth,
                "seconds": dt, "states_per_s": states / dt if dt > 0 else 0.0,
                "trie_nodes": self.space.tries.count, "local_states": len(self.space.node_of)}

    def _initial(self) -> None:
        """The initial states (level 0), with the set-up's violations and the lookup properties checked."""
        space, setup = self.space, self.setup
        n, max_faults1 = space.n, space.max_faults + 1
        level0: dict[int, int | None] = {}
        self.levels.append(level0)
        for v in setup.store_violations:
            self._found(None, None, v, 0)
        if setup.store_violations:
            return
        for ci, cfg in enumerate(space.configs):
            if cfg is None:  # another shard's
                continue
            for v in cfg.violations:  # the lookup phase's (a raising or stalling lookup or combine, a bad plan)
                self._found(None, None, v, ci)
            if cfg.violations:
                continue
            planned = cfg.planned
            lids = []
            for r in range(n):
                root = space.tries.root(r, planned)
                if root.kind == RAISED:
                    self._found(None, None, root.failure, ci)
                    break
                lids.append(space.lid(root, RUN, cfg.stores[r], ()))
            if len(lids) < n:
                continue
            if ci * max_faults1 > CF_MASK:
                raise ExploreError(f"more than {CF_MASK // max_faults1} initial configurations: configuration too big")
            st = space.pack(lids, ci * max_faults1)
            if st in level0:
                continue
            level0[st] = None
            self.init_added.append(ci)
            if planned > cfg.lcp_min:  # some completion of the undecided units breaks soundness: every one absent
                absent = space.concrete_evicted(lids, undecided_present=False) if space.lazy else cfg.evicted
                for v in soundness(setup.lookup_outcome(absent)):
                    self._found(None, None, v, ci, absent)
            if planned < cfg.lcp:  # or completeness: every undecided unit present
                for v in completeness(setup.lookup_outcome(cfg.evicted)):
                    self._found(None, None, v, ci)
            self._check_new(st, 0)

    def _check_new(self, packed: int, depth: int) -> None:
        """The checks of a newly reached state (off the hot path: quiescent, or near the step bound)."""
        space = self.space
        st = space.unpack(packed)
        if not any(space.can_move[x] for x in st[:space.n]):
            if self.terminal_signatures is not None:
                self.terminal_signatures.add(self.terminal.signature(st))
            if self.outcome_summaries is not None:
                self.outcome_summaries.add(self.terminal.summary(st))
            for v in self.terminal.violations(st):
                self._found(packed, None, v)
        elif depth >= space.bound and (space.reduction or space.steps(st) >= space.bound):
            self.dead.add(packed)  # the simulator stops here: never expanded
            self._found(packed, None, step_bound([r for r in range(space.n) if space.can_move[st[r]]], space.bound))

    def _found(self, parent: int | None, label: Any, violation: Violation, cfg: int | None = None,
               evicted: tuple | None = None) -> None:
        """Report a violation, unless only other properties are searched for."""
        if self.properties is None or violation.property in self.properties:
            raise Reached(parent, label, violation, cfg, evicted)

    def n_states(self) -> int:
        """The distinct states reached so far."""
        return sum(map(len, self.levels)) + len(self.pending)

    def reached_states(self) -> Iterator[int]:
        """Every packed state reached so far, level by level."""
        for level in self.levels:
            yield from level

    def _bfs(self, should_stop, progress, t0) -> str:
        """Expand level after level, one configuration's states at a time (see Speed), in slices of `_CHECK_EVERY`
        states of the level (polling `should_stop` between them; a slice's transitions count once it is done)."""
        self._initial()
        self.budgets = self.halves.budgets()
        self._expand_slow = slow_expander(self)
        frontier = self._by_config(list(self.levels[0])) if self.levels else []
        self.phase = 1
        record = self.shard is not None
        while frontier:
            gc.freeze()  # what exists now (the memo tables, the levels) is never walked again by a full collection
            if record:
                self.level_start.append(self.n_states())
            nxt = Level()
            self.levels.append(nxt)
            self.nxt = nxt
            d1, pos, done = self.depth + 1, 0, 0
            for chunk in frontier:  # a configuration's states: a list (level 0) or the previous level's dict
                pending = self.pending = {}
                start, size, rest = 0, len(chunk), iter(chunk)
                while start < size:
                    if pos % _CHECK_EVERY == 0:  # the level's slices of _CHECK_EVERY states, as one list's
                        self.transitions += done
                        done = 0
                        if should_stop is not None and should_stop():
                            self._flush()
                            return "incomplete"
                        if progress is not None:
                            progress(self._stats(t0))
                    take = min(_CHECK_EVERY - pos % _CHECK_EVERY, size - start)
                    done += self._expand(chunk if take == size else islice(rest, take), pending, d1)
                    pos += take
                    start += take
                self._flush()
            self.transitions += done
            if record:
                self.level_hist.append(self._histogram(nxt))
            frontier = nxt.parts  # (dicts of ints: the collector never traverses them, as it would lists)
            if frontier:
                self.depth = d1
        if progress is not None:
            progress(self._stats(t0))
        return "held"

    def _flush(self) -> None:
        """Move the current configuration's new states (`pending`) into the level being built."""
        if self.pending:
            self.nxt.add(self.pending)
            self.pending = {}

    def _by_config(self, states: list[int]) -> list[list[int]]:
        """`states` (ordered by configuration) cut into one list per configuration."""
        max_faults1, chunks, last = self.space.max_faults + 1, [], None
        for st in states:
            ci = (st & CF_MASK) // max_faults1
            if ci != last:
                chunks.append([])
                last = ci
            chunks[-1].append(st)
        return chunks

    def _expand(self, states: list[int], seen: dict[int, int | None], d1: int) -> int:
        """Expand `states` (of depth d1 - 1) into `seen` (the states of depth d1: their parents); the transitions
        generated. The hot loop (see Speed): a state whose two halves' entries (`checking.explore.halves`) say its
        successors are plain is the state plus their deltas; any other takes `checking.explore.slow`'s path."""
        space = self.space
        if d1 >= space.bound:  # near the step bound every new state is checked
            return self._expand_slow(states, seen, d1)
        halves = self.halves
        # (no state here is dead: a state at the step bound is only ever expanded near it)
        return expand_plain(states, seen, d1, halves.memo[0], halves.memo[1], halves.entry, self.budgets,
                            self._expand_slow, CF_MASK, CF_BITS, halves.mask0, halves.shift1)
