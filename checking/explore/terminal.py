"""Terminal states: the `Outcome` of a state where no rank can move, and every check over it.

The outcome is a real one: the case carries the fault plan of the state (the units evicted before lookup,
the units evicted after it, the lost and delayed completions: all recorded in the rank-local states), its
events are the harness's store and lookup phases followed by the load's effects in one canonical schedule
(lowest rank first; a state does not record the interleaving, nor where an eviction happened, so an
eviction during load is listed with `step=None`), and it is checked by `model.checks.check_outcome`,
exactly as `run_case` checks its outcomes. Hang and deadlock are diagnosed by `model.interpreter.stuck`, as the
simulator does.
"""
from __future__ import annotations

from typing import Sequence

import attrs

from model.checks import check_outcome
from model.effects import COLLECTIVES, Get, GetAsync, collective_signature
from model.faults import NEVER, Eviction, FaultPlan
from model.interpreter import ARRIVE_NOTE, WAITS_FOREVER_NOTE, completed_note, stuck
from model.outcome import Event, Outcome, SimResult, Violation

from checking.explore.state import ARRIVED, DELAYED, DELAY_SECONDS, HUNG, LOST, Config, StateSpace
from checking.explore.tries import DONE, freeze

__all__ = ["Terminals"]

#: The load events (per ranks' nodes and flags) and ranks' faults kept for terminal checks; a full table is emptied.
_LOADS_KEPT = 1 << 16


class Terminals:
    """The terminal-state checks of one `checking.explore.state.StateSpace`, memoised per what they read."""

    def __init__(self, space: StateSpace) -> None:
        self.space = space
        self.memo: dict[tuple, list[Violation]] = {}  # (lookup view, a fault happened, each rank's part) -> violations
        self.parts: dict[int, int] = {}  # local id -> `part(lid)`
        self.part_ids: dict[tuple, int] = {}  # (trie node, flag) -> a small id
        self.config_views: dict[int, int] = {}  # configuration -> `_view` (eager initial state)
        self.evicted_views: dict[tuple, int] = {}  # units evicted before lookup -> `_view` (lazy initial state)
        self.view_ids: dict[tuple, int] = {}  # what the checks read of a lookup outcome -> a small id
        self.load_memo: dict[tuple, tuple] = {}  # (nodes, flags) -> `_load_events` (many states share them)
        self.rank_faults: dict[tuple[int, int], tuple] = {}  # (lid, cfg or -1 if lazy) -> `_rank_faults`

    def violations(self, st: tuple) -> list[Violation]:
        """Every violation of a state (unpacked) where no rank can move: `check_outcome(self.outcome(st))`, memoised
        on exactly what `check_outcome` reads of that outcome, which is not the configuration (terminal states of
        many configurations share an answer):
        - of the lookup outcome (a function of the units evicted before lookup): `lcp`, `planned`, `reports`,
          `stale`, `before_other_evictions`, and `cached` only when `before_other_evictions` is set (isolation-
          eviction); `kv`, `written` and `foreign` are the store phase's, the same for every lookup: `_view`;
        - of the fault plan: only `after_lookup()` (maximality; `striking` and `server_faults` are a real server's,
          never in the explorer's plans), which is `faults > 0`: every fault the counter counts leaves its mark in
          the plan (an eviction takes its chunk's keys out of `present` for good, a lost or delayed completion keeps
          its status) and every mark was counted;
        - of the load: the results, the reads and the hang/deadlock diagnosis, all functions of each rank's trie node
          and flag (a node is named by the results its rank received: `part`). The step count, the schedule, the
          events and the collective signatures are read by no check.
        `tests/test_explore.py` compares this with the unmemoised checks on every terminal state of many searches."""
        space = self.space
        n = space.n
        ci, faults = divmod(st[n], space.max_faults + 1)
        key = (self._view(ci, st[:n]), faults > 0) + tuple(self.part(x) for x in st[:n])
        got = self.memo.get(key)
        if got is None:
            got = self.memo[key] = check_outcome(self.outcome(st))
        return got

    def _view(self, ci: int, lids: Sequence[int]) -> int:
        """The id of what the checks read of the lookup outcome a state (of configuration `ci`, local states `lids`)
        starts from (see `violations`); an unhashable one gets an id of its own."""
        space = self.space
        if not space.lazy:
            got = self.config_views.get(ci)
            if got is None:
                got = self.config_views[ci] = self._view_of(space.configs[ci].evicted)
            return got
        before = space.concrete_evicted(lids)
        got = self.evicted_views.get(before)
        if got is None:
            got = self.evicted_views[before] = self._view_of(before)
        return got

    def _view_of(self, before: tuple) -> int:
        look = self.space.setup.lookup_outcome(before)
        boe = look.before_other_evictions
        read = (look.lcp, look.planned, None if look.reports is None else tuple(look.reports), look.stale, boe,
                None if boe is None else look.cached)
        try:
            key = (read, repr(read))  # equal values written alike (1 and 1.0 and True are equal keys, not texts)
            return self.view_ids.setdefault(key, len(self.view_ids))
        except TypeError:  # (a protocol's unhashable report)
            self.view_ids[(object(),)] = len(self.view_ids)
            return len(self.view_ids) - 1

    def part(self, lid: int) -> int:
        """What the terminal checks read of one rank-local state: the id of its trie node and flag (see
        `violations`; its store and completions matter only through the fault count)."""
        got = self.parts.get(lid)
        if got is None:
            space = self.space
            got = self.parts[lid] = self.part_ids.setdefault((space.node_of[lid], space.flag_of[lid]),
                                                             len(self.part_ids))
        return got

    def outcome(self, st: tuple) -> Outcome:
        """The `Outcome` of a terminal state (unpacked), with its fault plan and events."""
        space = self.space
        n = space.n
        lids = st[:n]
        nodes = [space.node_of[x] for x in lids]
        flags = [space.flag_of[x] for x in lids]
        waiting = {r: nodes[r].n_collectives for r in range(n) if flags[r] == ARRIVED}
        arrived: dict[int, set[int]] = {}
        for r, k in waiting.items():
            arrived.setdefault(k, set()).add(r)
        violations = stuck(n, {r: nodes[r].effect.handle.key for r in range(n) if flags[r] == HUNG}, waiting, arrived,
                           [r for r in range(n) if nodes[r].kind == DONE])
        results = {r: nodes[r].ret for r in range(n) if nodes[r].kind == DONE}
        events, schedule, reads, sigs = self._load(nodes, flags)
        load = SimResult(results, events, schedule, violations, space.steps(st), reads, sigs)
        plan = self._plan(st[n] // (space.max_faults + 1), lids)
        look = space.setup.lookup_outcome(plan.at("before-lookup"))
        return attrs.evolve(look, case=attrs.evolve(look.case, faults=plan), load=load,
                            events=look.events + events, violations=[])

    def _load(self, nodes: list, flags: list[int]) -> tuple[list[Event], list[int], list, list]:
        """`_load_events(nodes, flags)`, memoised (fresh lists each time; at most `_LOADS_KEPT` kept)."""
        key = (tuple(nodes), tuple(flags))
        got = self.load_memo.get(key)
        if got is None:
            if len(self.load_memo) >= _LOADS_KEPT:
                self.load_memo.clear()
            got = self.load_memo[key] = _load_events(nodes, flags)
        events, schedule, reads, sigs = got
        return list(events), list(schedule), list(reads), [list(s) for s in sigs]

    def _plan(self, ci: int, lids: Sequence[int]) -> FaultPlan:
        """The faults of a state from configuration `ci`: what its rank-local states record of evictions and
        completions."""
        space = self.space
        cfg = space.configs[ci]
        evicted, late = [], {}
        for r, x in enumerate(lids):
            key = (x, -1 if space.lazy else ci)
            got = self.rank_faults.get(key)
            if got is None:
                if len(self.rank_faults) >= _LOADS_KEPT:
                    self.rank_faults.clear()
                got = self.rank_faults[key] = self._rank_faults(r, x, cfg)
            evicted += got[0]
            late.update(got[1])
        before = space.concrete_evicted(lids) if space.lazy else cfg.evicted
        return FaultPlan.of(before_lookup=before, during_load=evicted, late=late)

    def _rank_faults(self, r: int, x: int, cfg: Config) -> tuple[list, list]:
        """Rank r's part of `_plan` in local state x: its evictions during the load, and how late each of its lost
        (`NEVER`) and delayed completions is (a function of x, and of the configuration unless the initial state is
        lazy)."""
        store = self.space.store_of[x]
        init = store.init if self.space.lazy else cfg.stores[r].chunks.keys()
        evicted = [Eviction(c, r) for c in sorted(set(init).difference(store.chunks))]
        statuses = [status for _, status in self.space.asyncs_of[x]]
        return evicted, [((r, i), NEVER if status == LOST else DELAY_SECONDS)
                         for i, status in enumerate(statuses) if status in (LOST, DELAYED)]

    def signature(self, st: tuple) -> tuple:
        """A terminal state as (cfg, per rank (history, flag), whether a fault happened): everything the
        terminal checks depend on."""
        space = self.space
        cfg, faults = divmod(st[space.n], space.max_faults + 1)
        return ((cfg,) + tuple((tuple(space.node_of[x].history()), space.flag_of[x]) for x in st[:space.n])
                + (faults > 0,))

    def summary(self, st: tuple) -> tuple:
        """A terminal state as (cached set, planned, each finished rank's result, violated properties)."""
        space = self.space
        cfg = space.configs[st[space.n] // (space.max_faults + 1)]
        nodes = [space.node_of[x] for x in st[:space.n]]
        results = tuple(freeze(nd.ret) if nd.kind == DONE else None for nd in nodes)
        return cfg.cached, cfg.planned, results, tuple(sorted({v.property for v in self.violations(st)}))


def _load_events(nodes: list, flags: list[int]) -> tuple[list[Event], list[int], list, list]:
    """The load's events in one canonical schedule (the lowest rank that can move, moves), with the schedule,
    the reads and each rank's collective signatures."""
    n = len(nodes)
    paths = [nd.steps() for nd in nodes]
    events: list[Event] = []
    schedule: list[int] = []
    reads: list = []
    sigs: list = [[] for _ in range(n)]
    pos = [0] * n
    k = 0
    while True:
        for r in range(n):
            while pos[r] < len(paths[r]) and not isinstance(paths[r][pos[r]][0], COLLECTIVES):
                eff, res = paths[r][pos[r]]
                if isinstance(eff, (Get, GetAsync)):
                    reads.append((r, eff.key))
                events.append(Event(len(schedule), r, 0.0, "load", eff, res))
                schedule.append(r)
                pos[r] += 1
        if not all(pos[r] < len(paths[r]) for r in range(n)):
            break
        for r in range(n):
            eff = paths[r][pos[r]][0]
            sigs[r].append(collective_signature(eff))
            events.append(Event(len(schedule), r, 0.0, "load", eff, note=ARRIVE_NOTE))
            schedule.append(r)
        for r in range(n):
            eff, res = paths[r][pos[r]]
            events.append(Event(len(schedule), r, 0.0, "load", eff, res, note=completed_note(k)))
            pos[r] += 1
        k += 1
    for r in range(n):
        if flags[r] == ARRIVED:
            sigs[r].append(collective_signature(nodes[r].effect))
            events.append(Event(len(schedule), r, 0.0, "load", nodes[r].effect, note=ARRIVE_NOTE))
            schedule.append(r)
        elif flags[r] == HUNG:
            events.append(Event(len(schedule), r, 0.0, "load", nodes[r].effect, note=WAITS_FOREVER_NOTE))
            schedule.append(r)
    return events, schedule, reads, sigs
