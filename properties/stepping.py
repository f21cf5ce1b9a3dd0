"""`Episode`: one `model.harness.run_case` taken apart so that a state machine drives it rule by rule.

The store phase, the lookup and every load step do exactly what `run_case` does (same simulator, same
shadow of written keys, same checks), and every choice is recorded, so `episode.case()` re-runs the
episode with `run_case(protocol, episode.case())` to the same outcome.

The load is stepped through `model.sim.Simulator`'s own `start`, `step_once`, `over` and `finish`.
"""
from __future__ import annotations

import functools
from typing import Any, Sequence

from model.calls import DEFAULT_OP_TIMEOUT
from model.checks import check_outcome, completeness, soundness
from model.effects import Put
from model.faults import NEVER, Eviction, FaultPlan
from model import harness
from model.harness import Case, Outcome, lookup_phase, store_phase
from model.outcome import OtherPrompt
from model.sim import Simulator, Violation, lowest_runnable

__all__ = ["Episode", "STORED", "LOOKED_UP", "LOADING", "DONE"]

STORED, LOOKED_UP, LOADING, DONE = "stored", "looked-up", "loading", "done"

# the prompt of (n_chunks, salt) is the same every time: build its hashes and KV bytes once
chunk_hashes = functools.lru_cache(maxsize=256)(harness.chunk_hashes)
kv_bytes = functools.lru_cache(maxsize=256)(harness.kv_bytes)


class Episode:
    """One prompt: stored by every rank, then evicted from, looked up and loaded as the rules say."""

    def __init__(self, protocol: Any, stores: Sequence[Any], n_ranks: int, n_chunks: int, salt: str, *,
                 wait_bound: float = DEFAULT_OP_TIMEOUT, others: Sequence[OtherPrompt] = ()) -> None:
        n, k = n_ranks, n_chunks
        self.protocol, self.stores, self.n, self.k, self.salt = protocol, stores, n, k, salt
        self.wait_bound = wait_bound
        self.others = tuple(others)
        self.before: list[Eviction] = []
        self.after: list[Eviction] = []
        self.during: list[Eviction] = []
        self.late: dict[tuple[int, int], float] = {}  # (rank, i) -> seconds late (`model.faults.NEVER`: lost)
        self.sim: Simulator | None = None
        hashes, kv = list(chunk_hashes(k, salt)), list(kv_bytes(k, salt))  # copies: a protocol may mutate them
        self.out, self.shadow = store_phase(protocol, self.case(), stores, hashes=hashes, kv=kv)
        self.phase = DONE if self.out.violations else STORED

    # -- the recorded choices -------------------------------------------------------------------------
    def bound(self) -> int:
        return harness.default_step_bound(self.n, self.k)

    def faults(self) -> FaultPlan:
        return FaultPlan.of(before_lookup=self.before, after_lookup=self.after, during_load=self.during,
                            late=self.late)

    def case(self) -> Case:
        """The `Case` that `run_case` replays this episode from."""
        schedule = tuple(self.sim.made) if self.sim is not None else ()
        return Case(self.n, self.k, self.salt, self.faults(), schedule, others=self.others)

    # -- rules ----------------------------------------------------------------------------------------
    def evict(self, chunk: int, rank: int | None) -> Eviction:
        """Evict `chunk` (from `rank`, or every rank) now: before lookup, after it, or before the next load step."""
        if self.phase == STORED:
            e = Eviction(chunk, rank)
            self.before.append(e)
            self.shadow.evict(e)
        elif self.phase == LOOKED_UP:
            e = Eviction(chunk, rank)
            self.after.append(e)
            self.shadow.evict(e)
        else:
            assert self.phase == LOADING and self.sim is not None
            e = Eviction(chunk, rank, self.sim.step)
            self.during.append(e)
            self.sim.evictions.setdefault(e.step, []).append(e)
        return e

    def lookup(self) -> None:
        """Every rank looks up at one instant; the scheduler combines the reports (as `run_case` does)."""
        lookup_phase(self.protocol, self.out, self.stores, self.shadow)
        self.phase = DONE if self.out.violations else LOOKED_UP

    def lookup_violations(self) -> list[Violation]:
        """Soundness and completeness of the lookup just made (known before any load step)."""
        return soundness(self.out) + completeness(self.out)

    def _next_async(self, rank: int, ahead: int) -> int:
        return (self.sim.ranks[rank].n_async if self.sim is not None else 0) + ahead

    def lose(self, rank: int, ahead: int) -> tuple[int, int]:
        """The completion of `rank`'s `ahead`-th next `GetAsync` will never arrive; (rank, i)."""
        return self.delay(rank, ahead)[:2]

    def delay(self, rank: int, ahead: int, seconds: float = NEVER) -> tuple[int, int, float]:
        """The completion of `rank`'s `ahead`-th next `GetAsync` arrives `seconds` after it was issued (`NEVER`:
        it never arrives); (rank, i, seconds)."""
        x = (rank, self._next_async(rank, ahead))
        self.late[x] = max(seconds, self.late.get(x, 0.0))
        if self.sim is not None:
            self.sim.late[x] = self.late[x]
        return (*x, seconds)

    def start_load(self) -> None:
        """Every rank starts its load program (the simulator primes each to its first effect)."""
        assert self.phase == LOOKED_UP
        sim = Simulator([self.protocol.rank_load(r, self.n, self.out.hashes, self.out.planned) for r in range(self.n)],
                        self.stores, phase="load", chooser=lowest_runnable, step_bound=self.bound(),
                        late=self.late, evict=self.shadow.evict, wait_bound=self.wait_bound)
        self.sim = sim
        self.phase = LOADING
        sim.start()
        if sim.over():
            self.finish()

    def runnable(self) -> list[int]:
        return self.sim.runnable() if self.sim is not None else []

    def move(self, choice: int) -> int | None:
        """Move one runnable rank (`choice` indexes the runnable ones, wrapping); the moved rank."""
        moved: list[int] = []
        self.sim.step_once(lambda runnable: moved.append(runnable[choice % len(runnable)]) or moved[0])
        if self.sim.over():
            self.finish()
        return moved[0] if moved else None

    def finish(self) -> Outcome:
        """Run what is left of the episode (the load with the lowest runnable rank first) and check it."""
        if self.phase == STORED:
            self.lookup()
        if self.phase == LOOKED_UP:
            self.start_load()
        if self.phase == LOADING:
            sim = self.sim
            while sim.step_once(lambda runnable: runnable[0]):
                pass
            self.out.load = sim.finish()
            self.out.events.extend(sim.events)
            self.out.case = self.case()
            self.out.violations = check_outcome(self.out)
            self.phase = DONE
        self.out.case = self.case()
        return self.out

    def cleanup(self) -> None:
        """Delete every key this episode wrote, other prompts' included (stores are reused across episodes)."""
        for ev in self.out.events:
            if isinstance(ev.effect, Put) and ev.rank is not None and (ev.note == "" or ev.note.startswith("other prompt")):
                self.stores[ev.rank].delete(ev.effect.key)
