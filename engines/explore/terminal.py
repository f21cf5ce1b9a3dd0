"""Terminal states: the `Outcome` of a state where no rank can move, and every check over it.

The outcome is a real one: the case carries the fault plan of the state (the units evicted before lookup,
the units evicted after it, the lost and delayed completions: all recorded in the rank-local states), its
events are the harness's store and lookup phases followed by the load's effects in one canonical schedule
(lowest rank first; a state does not record the interleaving, nor where an eviction happened, so an
eviction during load is listed with `step=None`), and it is checked by `model.checks.check_outcome`,
exactly as `run_case` checks its outcomes. Hang and deadlock are diagnosed as the simulator does.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Sequence

import attrs

from model.checks import check_outcome
from model.effects import COLLECTIVES, Get, GetAsync, Handle, collective_signature
from model.faults import NEVER, Eviction, FaultPlan
from model.outcome import Event, Outcome, SimResult, Violation

from engines.explore.state import ARRIVED, DELAYED, DELAY_SECONDS, HUNG, LOST, Config
from engines.explore.tries import DONE, freeze

__all__ = ["Terminal"]

#: Lookup outcomes (with their events) kept for terminal checks; older ones are re-run on demand.
_LOOKUPS_KEPT = 1024


class Terminal:
    """The terminal-state checks of an `engines.explore.state.Explorer` (a mixin)."""

    def terminal(self, st: tuple) -> list[Violation]:
        """Every violation of a state (unpacked) where no rank can move."""
        n = self.n
        cfg, faults = divmod(st[n], self.maxf + 1)
        key = (cfg, faults > 0) + tuple(self.terminal_part(x) for x in st[:n])
        got = self.term_memo.get(key)
        if got is None:
            got = self.term_memo[key] = check_outcome(self.terminal_outcome(st))
        return got

    def terminal_part(self, lid: int) -> tuple:
        """What the terminal outcome reads of one rank-local state: its trie node, its flag, and its faults
        (which units are present, known or undecided; each completion's status). Store values and completed
        values are not read: the results and reads are the node's."""
        memo = self.__dict__.setdefault("_parts", {})
        got = memo.get(lid)
        if got is None:
            store = self.L_store[lid]
            faults = (store.init, frozenset(store.chunks), store.undecided, tuple(s for _, s in self.L_async[lid]))
            got = memo[lid] = (self.L_node[lid], self.L_flag[lid], self.__dict__.setdefault("_fault_ids", {})
                               .setdefault(faults, len(self._fault_ids)))
        return got

    def terminal_outcome(self, st: tuple) -> Outcome:
        """The `Outcome` of a terminal state (unpacked), with its fault plan and events."""
        n = self.n
        lids = st[:n]
        cfg = self.configs[st[n] // (self.maxf + 1)]
        nodes = [self.L_node[x] for x in lids]
        flags = [self.L_flag[x] for x in lids]
        violations: list[Violation] = []
        hung = [r for r in range(n) if flags[r] == HUNG]
        for r in hung:
            violations.append(Violation("hang", f"rank {r} waits forever on the completion of "
                                        f"GetAsync({_wait_key(nodes[r])!r}), which never comes",
                                        {"rank": r, "key": _wait_key(nodes[r])}))
        waiting = [r for r in range(n) if flags[r] == ARRIVED]
        if waiting and not hung:
            violations.append(Violation("deadlock", f"ranks {waiting} wait in a collective that ranks "
                                        f"{[q for q in range(n) if q not in waiting]} never enter",
                                        {"stuck": waiting}))
        results = {r: nodes[r].ret for r in range(n) if nodes[r].kind == DONE}
        events, schedule, reads, sigs = _load_events(nodes, flags)
        load = SimResult(results, events, schedule, violations, sum(self.L_moves[x] for x in lids), reads, sigs)
        plan = self._plan(cfg, lids)
        look = self.lookup_outcome(plan.at("before-lookup"))
        return attrs.evolve(look, case=attrs.evolve(look.case, faults=plan), load=load,
                            events=look.events + events, violations=[])

    def _plan(self, cfg: Config, lids: Sequence[int]) -> FaultPlan:
        """The faults of a state: what its rank-local states record of evictions and completions."""
        evicted, late = [], {}
        for r, x in enumerate(lids):
            store = self.L_store[x]
            init = store.init if self.lazy else cfg.stores[r].chunks.keys()
            evicted.extend(Eviction(c, r) for c in sorted(set(init).difference(store.chunks)))
            for i, (_, status) in enumerate(self.L_async[x]):
                if status == LOST:
                    late[(r, i)] = NEVER
                elif status == DELAYED:
                    late[(r, i)] = DELAY_SECONDS
        before = self.concrete_evicted(lids) if self.lazy else cfg.evicted
        return FaultPlan.of(before_lookup=before, during_load=evicted, late=late)

    def concrete_evicted(self, lids: Sequence[int], also: Sequence[tuple[int, int]] = (),
                         undecided_present: bool = True) -> tuple[Eviction, ...]:
        """The units evicted before lookup in a concrete cached set of the rank-local states `lids`: the units
        known absent, and `also`; an undecided unit is present (absent when not `undecided_present`). Lazy
        initial state only (otherwise the configuration names them)."""
        units = set(also)
        for r, x in enumerate(lids):
            store = self.L_store[x]
            units.update((r, c) for c in self.unit_data[r]
                         if c not in store.init and (not undecided_present or c not in store.undecided))
        return tuple(Eviction(c, r) for r, c in sorted(units))

    def lookup_outcome(self, evicted: tuple[Eviction, ...]) -> Outcome:
        """The harness's lookup outcome after `evicted` (kept for the last few, else re-run)."""
        kept = self.__dict__.setdefault("_lookups", OrderedDict())
        got = kept.get(evicted)
        if got is None:
            got, _ = self.lookup(evicted)
            kept[evicted] = got
            if len(kept) > _LOOKUPS_KEPT:
                kept.popitem(last=False)
        return got

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
        results = tuple(freeze(nd.ret) if nd.kind == DONE else None for nd in nodes)
        return cfg.cached, cfg.planned, results, tuple(sorted({v.property for v in self.terminal(st)}))


def _wait_key(node: Any) -> str:
    h = node.effect.handle
    return h.key if isinstance(h, Handle) else repr(h)


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
            events.append(Event(len(schedule), r, 0.0, "load", eff, note="arrive"))
            schedule.append(r)
        for r in range(n):
            eff, res = paths[r][pos[r]]
            events.append(Event(len(schedule), r, 0.0, "load", eff, res, note=f"collective #{k}"))
            pos[r] += 1
        k += 1
    for r in range(n):
        if flags[r] == ARRIVED:
            sigs[r].append(collective_signature(nodes[r].effect))
            events.append(Event(len(schedule), r, 0.0, "load", nodes[r].effect, note="arrive"))
            schedule.append(r)
        elif flags[r] == HUNG:
            events.append(Event(len(schedule), r, 0.0, "load", nodes[r].effect, note="waits forever"))
            schedule.append(r)
    return events, schedule, reads, sigs
