"""Counterexample reconstruction: the BFS parent path of a violating state, as a `model.outcome.Case`.

Every state keeps its BFS parent (in `seen`), so a violation is turned into a shortest path (shortest in the
explored graph); each edge is recovered by regenerating the parent's successors in the search's order (the
first one equal to the child). The path's labels give the schedule and the faults: an eviction before the
move that observes it (`Eviction(chunk, rank, step)`), a lost or delayed completion of the rank's next
`GetAsync`. The initial configuration gives the evictions before lookup, i.e. the concrete cached set.
`engines.explore.bfs` replays the `Case` with `model.harness.run_case`, which must report the same property.
"""
from __future__ import annotations

from typing import Any, Iterable

import attrs

from model.faults import NEVER, Eviction, FaultPlan
from model.outcome import Case

from engines.explore.result import ExploreError
from engines.explore.state import DELAY_SECONDS, DELAYED_LABEL, LOST_LABEL, Bad

__all__ = ["Found", "Reconstruct"]


class Found(Exception):
    """A violation of `prop`: on the transition `label` out of packed state `parent`, in state `parent` when
    `label` is None, or in initial configuration `cfg` when `parent` is None."""

    def __init__(self, parent: int | None, label: Any, prop: str, cfg: int | None = None,
                 evicted: tuple | None = None) -> None:
        self.parent, self.label, self.prop, self.cfg, self.evicted = parent, label, prop, cfg, evicted


class Reconstruct:
    """Counterexample reconstruction of an `engines.explore.state.Explorer` with a BFS `seen` (a mixin)."""

    def successors(self, packed: int) -> Iterable[tuple[tuple, Any]]:
        """Every (label, packed successor state or Bad) of a packed state, in the search's order."""
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
                if isinstance(nl, Bad):
                    yield (r, label), nl
                    continue
                ns = st[:r] + (nl,) + st[r + 1:n] + (fc + cost,)
                if label[0] == "arrive":
                    got = self.arrive(ns[:n], r)
                    if isinstance(got, Bad):
                        yield (r, label), got
                        continue
                    ns = got + (fc + cost,)
                yield (r, label), self.pack(ns[:n], ns[n])
        if not self.reduction and budget and ranks:
            for q in range(n):
                for nl, chunk in self.evictions(st[q]):
                    yield (q, ("eager-evict", chunk)), self.pack(st[:q] + (nl,) + st[q + 1:n], fc + 1)

    # -- the counterexample as a Case ----------------------------------------------------------------------------
    def case_of(self, found: Found) -> Case:
        """The `Case` that reaches `found`'s violation (sets `depth` to its number of moves)."""
        if found.parent is None:
            if not self.configs:  # the store phase failed: no configuration was built
                return self.case0
            evicted = self.configs[found.cfg or 0].evicted if found.evicted is None else found.evicted
            return attrs.evolve(self.case0, faults=FaultPlan.of(before_lookup=evicted))
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
        decided_absent = [(r, part[1]) for r, label in ([found.label] if found.label is not None else [])
                          for part in label if type(part) is tuple and part[0] == "decide" and not part[2]]
        last = self.unpack(path[-1])
        before = (self.concrete_evicted(last[:self.n], decided_absent) if self.lazy
                  else self.configs[last[self.n] // (self.maxf + 1)].evicted)
        schedule: list[int] = []
        evictions, late = [], {}
        for st, (r, label) in steps:
            s = len(schedule)
            if label[0] == "eager-evict":
                evictions.append(Eviction(label[1], r, step=s))
                continue
            if label[0] == "evict":
                evictions.append(Eviction(label[1], r, step=s))
            i = len(self.L_async[self.unpack(st)[r]])
            if LOST_LABEL in label:
                late[(r, i)] = NEVER
            if DELAYED_LABEL in label:
                late[(r, i)] = DELAY_SECONDS
            schedule.append(r)
        plan = FaultPlan.of(before_lookup=before, during_load=evictions, late=late)
        return attrs.evolve(self.case0, faults=plan, schedule=tuple(schedule))

