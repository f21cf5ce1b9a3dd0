"""Running protocol cases over a client: `case_runner(client, op_timeout=...)` gives `run(protocol, case) -> Outcome`.

An in-memory client gets fresh stores per case, called directly. Any other client gets a `ClientPool`: one set of
bounded stores per rank count, reused across cases with a fresh key salt per run, and restarted (closed, and the
factory called again: new servers) after a call hung. The op timeout bounds every store call and every wait for
an async completion (the simulator's `wait_bound`).
"""
from __future__ import annotations

import contextlib
import itertools
from typing import Any, Callable, Iterator

import attrs

from model.calls import DEFAULT_OP_TIMEOUT
from model.harness import Case, Outcome, run_case
from model.timing import rerun_starved
from runtime.bounded import BoundedStore
from runtime.registry import Client

__all__ = ["ClientPool", "case_runner", "DEFAULT_OP_TIMEOUT"]


class ClientPool:
    """Bounded stores of `client` (a resolved `runtime.registry.Client`), reused across cases with the same rank
    count."""

    def __init__(self, client: Client, *, op_timeout: float = DEFAULT_OP_TIMEOUT,
                 options: dict | None = None, run_tag: str = "run", nemesis: Callable[[list], Any] | None = None,
                 recovery_seconds: float | None = None) -> None:
        self.client = client
        self.op_timeout, self.options = op_timeout, dict(options or {})
        if self.client.self_bounded:
            self.options.setdefault("op_timeout", op_timeout)
        self.sets: dict[int, list[BoundedStore]] = {}
        self.restarts = 0
        self._runs = itertools.count()
        self.run_tag = run_tag
        #: `nemesis(stores) -> ServerControl` for a case with real-server faults (a fresh one per case, closed after)
        self.nemesis, self.recovery_seconds = nemesis, recovery_seconds

    def stores(self, n_ranks: int) -> list[BoundedStore]:
        if n_ranks not in self.sets:
            made = self.client.stores(n_ranks, **self.options)
            self.sets[n_ranks] = [BoundedStore(s, self.op_timeout) for s in made]
        return self.sets[n_ranks]

    def run(self, protocol: Any, case: Case) -> Outcome:
        """Run `case` with keys salted for this run (a real store keeps earlier runs' keys); a run the machine starved
        (`model.timing.HarnessOutcome`) runs again on a fresh store set, and the last one propagates."""
        return rerun_starved(lambda: self._run(protocol, case), on_rerun=lambda exc: self.restart(case.n_ranks))

    def _run(self, protocol: Any, case: Case) -> Outcome:
        salted = case if case.salt.startswith(self.run_tag) else attrs.evolve(
            case, salt=f"{self.run_tag}{next(self._runs)}-{case.salt}")
        stores = self.stores(case.n_ranks)
        control = self.nemesis(stores) if self.nemesis is not None and case.faults.server_faults() else None
        try:
            out = run_case(protocol, salted, stores, wait_bound=self.op_timeout, control=control,
                           recovery_seconds=self.recovery_seconds)
        finally:
            if control is not None:
                control.close()
        if any(s.broken for s in stores) or any(v.property == "recovery" for v in out.violations):
            self.restart(case.n_ranks)
        return out

    def restart(self, n_ranks: int) -> None:
        """Close a hung store set; the next use calls the factory again (new servers)."""
        for s in self.sets.pop(n_ranks, []):
            s.close()
        self.restarts += 1

    def close(self) -> None:
        for n in list(self.sets):
            for s in self.sets.pop(n):
                s.close()

    def __enter__(self) -> "ClientPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@contextlib.contextmanager
def case_runner(client: Client, *, op_timeout: float = DEFAULT_OP_TIMEOUT, options: dict | None = None,
                nemesis: Callable[[list], Any] | None = None,
                recovery_seconds: float | None = None) -> Iterator[Callable[[Any, Case], Outcome]]:
    """`run(protocol, case)` over `client` (its factory given `options`): fresh in-memory stores per case, or a
    `ClientPool` (closed at the end) whose cases with real-server faults strike through `nemesis(stores)`."""
    if client.in_memory:
        def run(protocol: Any, case: Case) -> Outcome:
            return rerun_starved(lambda: run_case(protocol, case, client.stores(case.n_ranks, **(options or {})),
                                                  wait_bound=op_timeout))
        yield run
        return
    with ClientPool(client, op_timeout=op_timeout, options=options, nemesis=nemesis,
                    recovery_seconds=recovery_seconds) as pool:
        yield pool.run
