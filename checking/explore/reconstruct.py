"""Counterexample reconstruction: the BFS parent path of a violating state, as a `model.outcome.Case`.

Every state keeps its BFS parent (in `seen`), so a violation is turned into a shortest path (shortest in the
explored graph); each edge is recovered by regenerating the parent's successors in the search's order (the
first one equal to the child). The path's labels give the schedule and the faults: an eviction before the
move that observes it (`Eviction(chunk, rank, step)`), a lost or delayed completion of the rank's next
`GetAsync`. The initial configuration gives the evictions before lookup, i.e. the concrete cached set.
`checking.explore.bfs` replays the `Case` with `model.harness.run_case`, which must report the same property.
"""
from __future__ import annotations

from typing import Any, Iterator

import attrs

from model.faults import NEVER, Eviction, FaultPlan
from model.outcome import Case, Violation

from checking.explore.result import ExploreError
from checking.explore.state import DELAY_SECONDS, DELAYED_LABEL, LOST_LABEL, StateSpace

__all__ = ["Reached", "successors", "case_of"]


class Reached(Exception):
    """The search reached `violation`: on the transition `label` out of packed state `parent`, in state `parent`
    when `label` is None, or in initial configuration `cfg` when `parent` is None (`evicted`: the units evicted
    before lookup, when not the configuration's)."""

    def __init__(self, parent: int | None, label: Any, violation: Violation, cfg: int | None = None,
                 evicted: tuple | None = None) -> None:
        self.parent, self.label, self.violation, self.cfg, self.evicted = parent, label, violation, cfg, evicted
        self.prop = violation.property


def successors(space: StateSpace, packed: int) -> Iterator[tuple[tuple, Any]]:
    """Every (label, packed successor state or Violation) of a packed state, in the search's order."""
    n, max_faults = space.n, space.max_faults
    st = space.unpack(packed)
    cf = st[n]
    budget = max_faults - cf % (max_faults + 1)
    ranks = [r for r in range(n) if space.can_move[st[r]]]
    if space.reduction:
        ranks = ranks[:1]
    for r in ranks:
        for cost, nl, label in space.branches(st[r]):
            if cost > budget:
                continue
            if type(nl) is not int:
                yield (r, label), nl
                continue
            ns = st[:r] + (nl,) + st[r + 1:n] + (cf + cost,)
            if label[0] == "arrive":
                got = space.arrive(ns[:n], r)
                if type(got) is not tuple:
                    yield (r, label), got
                    continue
                ns = got + (cf + cost,)
            yield (r, label), space.pack(ns[:n], ns[n])
    if not space.reduction and budget and ranks:
        for q in range(n):
            for nl, chunk in space.evictions(st[q]):
                yield (q, ("eager-evict", chunk)), space.pack(st[:q] + (nl,) + st[q + 1:n], cf + 1)


def case_of(space: StateSpace, levels: list, reached: Reached) -> tuple[Case, int]:
    """The `Case` that reaches `reached`'s violation along the BFS parents (`levels[d]`: each state of depth d ->
    its parent, a dict or a `checking.explore.level.Level`), and its number of moves."""
    if reached.parent is None:
        if not space.configs:  # the store phase failed: no configuration was built
            return space.case0, 0
        evicted = space.configs[reached.cfg or 0].evicted if reached.evicted is None else reached.evicted
        return attrs.evolve(space.case0, faults=FaultPlan.of(before_lookup=evicted)), 0
    depth = next(d for d in reversed(range(len(levels))) if reached.parent in levels[d])
    path = [reached.parent]
    for d in range(depth, 0, -1):
        path.append(levels[d][path[-1]])
    path.reverse()
    steps: list[tuple[int, tuple]] = []
    for a, b in zip(path, path[1:]):
        for lab, ns in successors(space, a):
            if ns == b:
                steps.append((a, lab))
                break
        else:  # pragma: no cover - a parent pointer always names a successor
            raise ExploreError("cannot reconstruct the counterexample path")
    if reached.label is not None:
        steps.append((path[-1], reached.label))
    decided_absent = [(r, part[1]) for r, label in ([reached.label] if reached.label is not None else [])
                      for part in label if type(part) is tuple and part[0] == "decide" and not part[2]]
    last = space.unpack(path[-1])
    before = (space.concrete_evicted(last[:space.n], decided_absent) if space.lazy
              else space.configs[last[space.n] // (space.max_faults + 1)].evicted)
    schedule: list[int] = []
    evictions, late = [], {}
    for st, (r, label) in steps:
        s = len(schedule)
        if label[0] == "eager-evict":
            evictions.append(Eviction(label[1], r, step=s))
            continue
        if label[0] == "evict":
            evictions.append(Eviction(label[1], r, step=s))
        i = len(space.asyncs_of[space.unpack(st)[r]])
        if LOST_LABEL in label:
            late[(r, i)] = NEVER
        if DELAYED_LABEL in label:
            late[(r, i)] = DELAY_SECONDS
        schedule.append(r)
    plan = FaultPlan.of(before_lookup=before, during_load=evictions, late=late)
    return attrs.evolve(space.case0, faults=plan, schedule=tuple(schedule)), len(steps)
