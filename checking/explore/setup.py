"""The explorer's set-up: the harness's store phase, then the initial configurations, each with its lookup phase.

The store and lookup phases are the harness's own (`model.harness.store_phase` and `lookup_phase`, over in-memory
stores): one store phase, then per initial configuration the evictions before lookup and one lookup phase, whose
violations (a raising or stalling lookup or `combine`, a plan that is not a count) are that configuration's
violations, exactly as `run_case` reports them. Eagerly there is one configuration per cached set (every subset of
the (rank, chunk) units the store phase wrote, or the one given); lazily one per leaf of the lookup's decision tree
(`checking.explore.lazy`).
"""
from __future__ import annotations

import itertools
from collections import OrderedDict
from typing import Any

import attrs

from model.faults import Eviction, FaultPlan
from model.harness import Shadow, chunk_hashes, kv_bytes, leading_run, lookup_phase, store_phase
from model.outcome import Case, Outcome, Violation
from model.store import MemoryStore, memory_factory

from checking.explore.lazy import product_leaves
from checking.explore.result import ExploreError
from checking.explore.stores import Config, Store, Stores

__all__ = ["SetUp"]

#: Lookup outcomes (with their events) kept for terminal checks; older ones are re-run on demand.
_LOOKUPS_KEPT = 1024


class SetUp:
    """The store phase's outcome and stores, the initial configurations (`configs`; None for another shard's) and
    the lookups they start from. `most`: the configurations a packed state can name."""

    def __init__(self, protocol: Any, case0: Case, stores: Stores, *, cached: Any, lazy: bool,
                 shard: tuple[int, int] | None, most: int) -> None:
        self.protocol, self.case0, self.stores, self.lazy, self.shard, self.most = \
            protocol, case0, stores, lazy, shard, most
        n, k = case0.n_ranks, case0.n_chunks
        self.hashes, self.kv = chunk_hashes(k, case0.salt), kv_bytes(k, case0.salt)
        self.lazy_store_memo: dict[tuple[int, tuple], tuple] = {}  # (rank, unit bits) -> _lazy_store's answer
        self.lookups: OrderedDict[tuple[Eviction, ...], Outcome] = OrderedDict()  # the last few lookup outcomes
        mem = memory_factory(n)
        out, shadow = store_phase(protocol, case0, mem, hashes=self.hashes, kv=self.kv)
        self.store_outcome, self.store_shadow = out, shadow
        self.written: dict[int, dict[str, int | None]] = out.written
        self.store_violations: list[Violation] = list(out.violations)
        self.evictable = {r: {key: c for key, c in w.items() if c is not None} for r, w in self.written.items()}
        self.after_store = [dict(mem[r].data) for r in range(n)]
        self.unit_data = [{c: {key: self.after_store[r][key] for key, cc in self.evictable[r].items() if cc == c}
                           for c in set(self.evictable[r].values())} for r in range(n)]
        self.configs: list[Config | None] = []
        units = sorted({(r, c) for r, w in self.evictable.items() for c in w.values()})
        if cached is None or cached == "all":
            if not lazy and 2 ** len(units) > most:  # refused before any is built (2^units of them)
                raise ExploreError(f"{len(units)} stored (rank, chunk) units make 2^{len(units)} cached sets, more "
                                   f"than the {most} initial configurations a state can name: use the lazy "
                                   "initial state")
            choices: Any = () if lazy else (frozenset(s) for size in range(len(units) + 1)
                                            for s in itertools.combinations(units, size))
        else:
            keep = set(cached)
            bad = keep - set(range(k))
            if bad:
                raise ExploreError(f"cached chunks {sorted(bad)} are not chunks of 0..{k - 1}")
            choices = [frozenset(u for u in units if u[1] not in keep)]
        if self.store_violations:
            return
        if lazy:
            self._lazy_configs()
        else:
            self._eager_configs(choices)

    def mine(self, ci: int) -> bool:
        """Whether configuration `ci` is explored here (every one, unless this search is one shard)."""
        return self.shard is None or ci % self.shard[1] == self.shard[0]

    def _eager_configs(self, choices: Any) -> None:
        """One configuration per cached set of `choices` (each a set of units evicted before lookup)."""
        for ci, evicted in enumerate(choices):
            if not self.mine(ci):
                self.configs.append(None)  # another shard's: its lookup runs there
                continue
            look, stores = self.lookup(tuple(Eviction(c, r) for r, c in sorted(evicted)))
            interned = tuple(self.stores.make(dict(stores[r].data),
                                              frozenset(key for key in self.evictable[r] if key in stores[r].data),
                                              self.evictable[r]) for r in range(len(stores)))
            self.configs.append(Config(tuple(Eviction(c, r) for r, c in sorted(evicted)), look.cached, look.lcp,
                                       look.reports, look.planned, interned, tuple(look.violations), look.lcp))
            if any("stalled" in v.detail for v in look.violations):
                break  # a lookup that does not return: reported on this configuration; later ones would stall too

    def _lazy_configs(self) -> None:
        """One configuration per leaf of the lookup's decision tree (`checking.explore.lazy.product_leaves`)."""
        k = self.case0.n_chunks
        for ci, (bits, reports, planned, judge) in enumerate(product_leaves(self.protocol, self.hashes,
                                                                            self.after_store, self.evictable)):
            if ci > self.most:
                raise ExploreError(f"the lookup has more than {self.most} outcomes: more initial "
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
        got = self.lazy_store_memo.get((r, bits))
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
            got = self.lazy_store_memo[(r, bits)] = (store, tuple(gone), frozenset(init), frozenset(init | undecided))
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
        case = attrs.evolve(self.case0, faults=FaultPlan.of(before_lookup=evicted))
        out = attrs.evolve(self.store_outcome, case=case, events=list(self.store_outcome.events), violations=[])
        lookup_phase(self.protocol, out, stores, shadow)
        return out, stores

    def lookup_outcome(self, evicted: tuple[Eviction, ...]) -> Outcome:
        """The harness's lookup outcome after `evicted` (kept for the last few, else re-run)."""
        got = self.lookups.get(evicted)
        if got is None:
            got, _ = self.lookup(evicted)
            self.lookups[evicted] = got
            if len(self.lookups) > _LOOKUPS_KEPT:
                self.lookups.popitem(last=False)
        return got

    def concrete_evicted(self, stores: list[Store], also: tuple | list = (),
                         undecided_present: bool = True) -> tuple[Eviction, ...]:
        """The units evicted before lookup in a concrete cached set of the ranks' stores `stores`: the units known
        absent, and `also`; an undecided unit is present (absent when not `undecided_present`). Lazy initial
        state only (otherwise the configuration names them)."""
        units = set(also)
        for r, store in enumerate(stores):
            units.update((r, c) for c in self.unit_data[r]
                         if c not in store.init and (not undecided_present or c not in store.undecided))
        return tuple(Eviction(c, r) for r, c in sorted(units))
