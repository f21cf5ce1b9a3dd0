"""A deterministic simulator of N rank programs under an explicit schedule and a fault plan.

Collectives are matched by call order (NCCL semantics): the k-th collective of every rank forms one call.
Time is logical: store operations take no time, a `Wait` advances its rank's clock, a collective
synchronises the clocks of all ranks. The simulator names desync, deadlock, hang and step-bound exhaustion.
"""
from __future__ import annotations

import random
from typing import Any, Callable, Generator, Mapping, Sequence

import attrs

from model.contract import RankStore, StoreCallTimeout
from model.effects import COLLECTIVES, Get, GetAsync, Handle, Put, TIMED_OUT, Wait, collective_signature
from model.interpreter import (ARRIVE_NOTE, WAITS_FOREVER, WAITS_FOREVER_NOTE, client_hang, collective_results,
                               completed_note, desync, handle_problem, not_an_effect, program_failed, rank_failed,
                               step_bound, store_call_failed, stuck, timeout_problem, wait_outcome)
from model.calls import DEFAULT_OP_TIMEOUT, ProtocolRaised, Stalled, protocol_call, wait_future
from model.faults import NEVER, Eviction
from model.outcome import Event, SimResult, Violation

__all__ = ["DONE", "Chooser", "ScheduleError", "lowest_runnable", "seeded_chooser", "Simulator", "simulate"]

DONE = "done"
#: The contract method a phase's rank programs come from.
_METHOD = {"store": "rank_store", "load": "rank_load"}
Chooser = Callable[[list[int], int], int]


class ScheduleError(Exception):
    """An explicit schedule names a rank that cannot move at that step."""


def lowest_runnable(runnable: list[int], step: int) -> int:
    """The default scheduler: the lowest-numbered rank that can move."""
    return runnable[0]


def seeded_chooser(seed: int) -> Chooser:
    """A scheduler picking uniformly among runnable ranks; the same seed gives the same schedule."""
    rng = random.Random(seed)
    return lambda runnable, step: runnable[rng.randrange(len(runnable))]


@attrs.define
class _Async:
    key: str
    issued: float
    future: Any  # None when the completion never arrives
    delay: float


@attrs.define
class _Rank:
    program: Generator
    pending: Any = None
    clock: float = 0.0
    n_async: int = 0
    n_collectives: int = 0
    arrived: int | None = None  # collective index this rank waits in
    hung: str | None = None
    asyncs: dict = attrs.field(factory=dict)


class Simulator:
    """Runs rank programs over `stores` (one `RankStore` per rank); see `simulate`. `late`: (rank, i) -> how many
    seconds late rank `rank`'s i-th `GetAsync` completes (`model.faults.NEVER`: never; `FaultPlan.late`)."""

    def __init__(self, programs: Sequence[Generator], stores: Sequence[RankStore], *, phase: str,
                 schedule: Sequence[int] = (), chooser: Chooser = lowest_runnable, step_bound: int = 10_000,
                 late: Mapping[tuple[int, int], float] | None = None,
                 evictions: Sequence[Eviction] = (), evict: Callable[[Eviction], None] | None = None,
                 wait_bound: float = DEFAULT_OP_TIMEOUT) -> None:
        self.ranks = [_Rank(p) for p in programs]
        self.n = len(self.ranks)
        self.stores = stores
        self.phase = phase
        self.schedule = list(schedule)
        self.chooser = chooser
        self.step_bound = step_bound
        self.late = dict(late or {})
        self.evictions: dict[int, list[Eviction]] = {}
        for e in evictions:
            self.evictions.setdefault(e.step, []).append(e)
        self.evict = evict
        self.wait_bound = wait_bound
        self.events: list[Event] = []
        self.violations: list[Violation] = []
        self.results: dict[int, Any] = {}
        self.made: list[int] = []
        self.reads: list[tuple[int, str]] = []
        self.arrivals: dict[int, dict[int, Any]] = {}
        self.sigs: list[list[tuple[str, int | None]]] = [[] for _ in self.ranks]
        self.step = 0

    # -- advancing programs -------------------------------------------------------------------
    def _send(self, r: int, value: Any, first: bool = False) -> None:
        rank = self.ranks[r]
        try:
            with protocol_call(r, _METHOD.get(self.phase, self.phase)):
                try:
                    rank.pending = next(rank.program) if first else rank.program.send(value)
                except StopIteration as stop:
                    rank.pending = DONE
                    self.results[r] = stop.value
        except (ProtocolRaised, Stalled) as exc:  # raised, or did not return (see runtime.watchdog): not terminated
            rank.pending = DONE
            self.violations.append(program_failed(r, exc))

    def runnable(self) -> list[int]:
        return [r for r, k in enumerate(self.ranks)
                if k.pending is not DONE and k.hung is None and k.arrived is None]

    # -- store effects ---------------------------------------------------------------------------
    def _store_op(self, r: int, effect: Any) -> Any:
        rank, store = self.ranks[r], self.stores[r]
        if isinstance(effect, Put):
            store.put(effect.key, effect.value)
            return None
        if isinstance(effect, Get):
            self.reads.append((r, effect.key))
            return store.get(effect.key)
        if isinstance(effect, GetAsync):
            i = rank.n_async
            rank.n_async += 1
            self.reads.append((r, effect.key))
            delay = self.late.get((r, i), 0.0)
            future = None if delay == NEVER else store.get_async(effect.key)
            rank.asyncs[i] = _Async(effect.key, rank.clock, future, delay)
            return Handle(r, i, effect.key)
        if isinstance(effect, Wait):
            return self._wait(r, effect)
        raise _Refused(not_an_effect(r, effect))

    def _wait(self, r: int, effect: Wait) -> Any:
        rank, h = self.ranks[r], effect.handle
        problem = handle_problem(r, h, rank.n_async) or timeout_problem(r, effect.timeout)
        if problem:
            raise _Refused(problem)
        pending = rank.asyncs[h.seq]
        late, rank.clock = wait_outcome(rank.clock, pending.issued, pending.delay, pending.future is None,
                                        effect.timeout)
        if late is WAITS_FOREVER:
            rank.hung = pending.key
            return _HUNG
        if late is TIMED_OUT:
            return TIMED_OUT
        return wait_future(pending.future, self.wait_bound, "get_async", pending.key)

    # -- collectives ------------------------------------------------------------------------------
    def _arrive(self, r: int, effect: Any) -> None:
        rank = self.ranks[r]
        k = rank.n_collectives
        rank.n_collectives += 1
        rank.arrived = k
        sig = collective_signature(effect)
        self.sigs[r].append(sig)
        here = self.arrivals.setdefault(k, {})
        for q, other in here.items():
            if collective_signature(other) != sig:
                self.violations.append(desync(k, q, other, r, effect))
                return
        here[r] = effect
        if len(here) == self.n:
            self._complete(k, here)

    def _complete(self, k: int, arrived: dict[int, Any]) -> None:
        out = collective_results([arrived[r] for r in range(self.n)], k)
        if isinstance(out, Violation):
            self.violations.append(out)
            return
        now = max(self.ranks[r].clock for r in range(self.n))
        del self.arrivals[k]
        for r in range(self.n):
            self.ranks[r].clock = now
            self.ranks[r].arrived = None
            self.events.append(Event(self.step, r, now, self.phase, arrived[r], out[r], note=completed_note(k)))
        for r in range(self.n):
            self._send(r, out[r])

    # -- the run ----------------------------------------------------------------------------------
    def run(self) -> SimResult:
        """Start every program, step until no rank can move, and diagnose the end."""
        self.start()
        while self.step_once():
            pass
        return self.finish()

    def start(self) -> None:
        """Prime every rank program to its first effect."""
        for r in range(self.n):
            self._send(r, None, first=True)

    def step_once(self, choose: Callable[[list[int]], int] | None = None) -> bool:
        """Move one rank (the schedule's, else `choose(runnable)`, else the chooser's); False when over."""
        if self.violations:
            return False
        runnable = self.runnable()
        if not runnable:
            return False
        if self.step >= self.step_bound:
            self.violations.append(step_bound(runnable, self.step_bound))
            return False
        r = choose(runnable) if choose is not None else self._next_rank(runnable)
        for e in self.evictions.get(self.step, ()):
            if self.evict is not None:
                self.evict(e)
            self.events.append(Event(self.step, e.rank, 0.0, self.phase, e,
                                     note="evict" if isinstance(e, Eviction) else "fault"))
        self.made.append(r)
        self._move(r)
        self.step += 1
        return True

    def over(self) -> bool:
        """Whether no further step can be made."""
        return bool(self.violations) or not self.runnable() or self.step >= self.step_bound

    def finish(self) -> SimResult:
        """Diagnose why the run ended (hang, deadlock) and return what it produced."""
        if not self.violations:
            self._diagnose_stuck()
        return SimResult(self.results, self.events, self.made, self.violations, self.step, self.reads, self.sigs)

    def _next_rank(self, runnable: list[int]) -> int:
        if self.step < len(self.schedule):
            r = self.schedule[self.step]
            if r not in runnable:
                raise ScheduleError(f"step {self.step}: the schedule moves rank {r}, but only ranks "
                                    f"{runnable} can move")
            return r
        return self.chooser(runnable, self.step)

    def _move(self, r: int) -> None:
        rank = self.ranks[r]
        effect = rank.pending
        if isinstance(effect, COLLECTIVES):
            self.events.append(Event(self.step, r, rank.clock, self.phase, effect, note=ARRIVE_NOTE))
            self._arrive(r, effect)
            return
        try:
            result = self._store_op(r, effect)
        except StoreCallTimeout as exc:
            rank.hung = exc.key
            self.events.append(Event(self.step, r, rank.clock, self.phase, effect, note=f"client hang: {exc}"))
            self.violations.append(client_hang(r, exc.op, exc.key, exc.seconds, str(exc)))
            return
        except _Refused as exc:
            rank.pending = DONE
            self.violations.append(rank_failed(r, str(exc)))
            return
        except TypeError as exc:  # the store refused the call (an unhashable key, a value that is not bytes)
            rank.pending = DONE
            self.violations.append(store_call_failed(r, effect, exc))
            return
        if result is _HUNG:
            self.events.append(Event(self.step, r, rank.clock, self.phase, effect, note=WAITS_FOREVER_NOTE))
            return
        self.events.append(Event(self.step, r, rank.clock, self.phase, effect, result))
        self._send(r, result)

    def _diagnose_stuck(self) -> None:
        self.violations += stuck(self.n, {r: k.hung for r, k in enumerate(self.ranks) if k.hung is not None},
                                 {r: k.arrived for r, k in enumerate(self.ranks) if k.arrived is not None},
                                 self.arrivals, [q for q in range(self.n) if self.ranks[q].pending is DONE])


_HUNG = object()


class _Refused(Exception):
    """An effect the interpreter refuses (not an effect, a foreign handle, a bad timeout): its text says why."""


def simulate(programs: Sequence[Generator], stores: Sequence[RankStore], **options: Any) -> SimResult:
    """Run `programs` (one generator per rank) to the end; see `Simulator` for the options."""
    return Simulator(programs, stores, **options).run()
