"""Lazy initial state: each unit's presence at lookup is decided when the run first observes it.

Every cached set is every subset of the units (rank r, chunk c) the store phase wrote (2^units initial
configurations, eagerly). Lazily, a unit's presence bit is decided the first time the run observes one of
its keys: a `contains` of the lookup, or a store effect of the load on store r (`Get`, `GetAsync`; a `Put`
too, which decides before it overwrites). The lookup is enumerated as a decision tree: it is run once per
leaf, answering the units decided on that branch and deciding a new one present first, then absent
(depth-first, so the leaves come in one fixed order). The load branches the same way on a store effect on
an undecided unit (a cost-0 branch, before the move and its fault branches).

The set-up enumerates each rank's tree on its own and takes their product (`product_leaves`): a rank's lookup
asks only its own store, and the harness runs the ranks in order, so the product in rank order is the whole
tree in the same order (`lookup_leaves`, one harness lookup phase per leaf, is the reference; a test checks
they agree). A leaf where anything goes wrong is judged by the harness's lookup phase.

Soundness (every violation of the eager model is found), for any deterministic protocol:
- a run depends on a unit only through the answers of the store calls on its keys; the first such call
  is where the bit is decided, and from then on the store holds exactly what the eager configuration with
  that bit holds. So the runs from eager configuration S and the lazy runs whose decisions agree with S
  have the same histories, stores at every read, reads, results and faults (the decisions are cost-0, the
  fault budget is the same): the map is onto, and each lazy run extends to at least one S.
- the terminal checks (results, agreement, within-plan, integrity, maximality, key consistency, desync,
  deadlock, hang, termination) read the histories, results, reads and faults, never an undecided bit.
- the lookup properties read the cached set, i.e. every bit: planned <= LCP holds for every completion
  iff it holds with every undecided unit absent (`lcp_min`), and planned >= LCP iff it holds with every
  undecided unit present (`lcp`); both are checked at the initial states, and the counterexample takes
  that completion. A decision made later in the load only narrows the completions, so no new lookup
  violation can appear there.
Completeness (nothing spurious): each lazy run is a run of every eager configuration that completes its
decisions, so a violation found is replayed by `run_case` on a concrete cached set (undecided units
present, or absent for soundness).
"""
from __future__ import annotations

from typing import Any, Iterator

import attrs

from model.calls import ProtocolRaised, Stalled, protocol_call
from model.contract import StoreCallTimeout
from model.harness import Shadow, lookup_phase
from model.outcome import Outcome
from model.store import MemoryStore

__all__ = ["lookup_leaves", "product_leaves"]


class _Decisions:
    """The presence bits decided on one branch of the lookup's decision tree."""

    def __init__(self, script: list[bool]) -> None:
        self.script, self.order, self.values = script, [], {}

    def decide(self, unit: tuple[int, int]) -> bool:
        got = self.values.get(unit)
        if got is None:
            i = len(self.order)
            got = self.values[unit] = self.script[i] if i < len(self.script) else True
            self.order.append(unit)
        return got

    def next_script(self) -> list[bool] | None:
        """The decisions of the next branch (depth-first, present before absent), None after the last."""
        vals = [self.values[u] for u in self.order]
        while vals and not vals[-1]:
            vals.pop()
        if not vals:
            return None
        vals[-1] = False
        return vals


class _DecidingStore(MemoryStore):
    """A rank's store after the store phase whose evictable keys answer `contains` by their unit's bit."""

    def __init__(self, rank: int, data: dict, chunk_of: dict, decisions: _Decisions) -> None:
        super().__init__()
        self.data, self.rank, self.chunk_of, self.decisions = dict(data), rank, chunk_of, decisions

    def contains(self, key: str) -> bool:
        c = self.chunk_of.get(key)
        if c is None:
            return key in self.data
        return self.decisions.decide((self.rank, c))


def lookup_leaves(protocol: Any, store_outcome: Outcome, after_store: list[dict],
                  evictable: dict[int, dict[str, int]]) -> Iterator[tuple[dict, Outcome]]:
    """Every leaf of the lookup's decision tree: (the bits it decided {(rank, chunk): present}, the harness's
    lookup outcome on that branch). Stops after a leaf whose lookup stalled (each further one would too)."""
    script: list[bool] | None = []
    while script is not None:
        decisions = _Decisions(script)
        stores = [_DecidingStore(r, data, evictable[r], decisions) for r, data in enumerate(after_store)]
        out = attrs.evolve(store_outcome, events=list(store_outcome.events), violations=[])
        lookup_phase(protocol, out, stores, Shadow(stores, store_outcome.written))
        yield dict(decisions.values), out
        if any("stalled" in v.detail for v in out.violations):
            return
        script = decisions.next_script()


def product_leaves(protocol: Any, hashes: list[str], after_store: list[dict],
                   evictable: dict[int, dict[str, int]]) -> Iterator[tuple[dict, list | None, Any, bool]]:
    """The leaves of `lookup_leaves`, in the same order, without running the whole lookup phase per leaf:
    (bits, reports, planned, whether the harness must judge it).

    A rank's lookup asks only its own store (CONTRACT.md), so the tree is the product of each rank's own tree
    (rank 0 outermost, as the harness runs the ranks in order). Each rank's tree is enumerated once, and
    `combine` runs once per leaf. A leaf where a lookup raised or stalled, `combine` raised, or the plan is
    not a count is flagged: the caller runs the harness's lookup phase on it, which reports exactly what
    `run_case` reports (and a raising rank ends the lookup there: its leaf has no later rank's bits).
    """
    n, k = len(after_store), len(hashes)
    trees = []
    for r in range(n):
        leaves, script = [], []
        while script is not None:
            decisions = _Decisions(script)
            store = _DecidingStore(r, after_store[r], evictable[r], decisions)
            try:
                with protocol_call(r, "rank_lookup"):
                    report, bad = protocol.rank_lookup(r, n, hashes, store.contains), False
            except (ProtocolRaised, StoreCallTimeout):
                report, bad = None, True
            except Stalled:
                leaves.append((decisions.values, None, True))
                break  # each further run would stall again
            leaves.append((decisions.values, report, bad))
            script = decisions.next_script()
        trees.append(leaves)
    yield from _combine(protocol, trees, 0, {}, [], k)


def _combine(protocol: Any, trees: list, r: int, bits: dict, reports: list, k: int) -> Iterator[tuple]:
    if r == len(trees):
        try:
            with protocol_call(None, "combine"):
                planned = protocol.combine(list(reports), k)
        except (ProtocolRaised, Stalled):
            yield bits, reports, None, True
            return
        yield bits, reports, planned, not isinstance(planned, int) or isinstance(planned, bool)
        return
    for own, report, bad in trees[r]:
        if bad:
            yield {**bits, **own}, None, None, True
        else:
            yield from _combine(protocol, trees, r + 1, {**bits, **own}, reports + [report], k)
