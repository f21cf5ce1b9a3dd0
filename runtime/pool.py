"""Running protocol cases over a real client: one bounded store set per rank count, a fresh key salt per
run, and a restart (close + new factory call, so new servers) after a client hang."""
from __future__ import annotations

import itertools
from typing import Any, Callable

import attrs

from runtime.bounded import BoundedStore
from model.contract import STORE_METHODS, missing_members
from model.harness import Case, Outcome, run_case

DEFAULT_OP_TIMEOUT = 2.0


class ClientPool:
    """Stores from `factory`, reused across cases with the same rank count."""

    def __init__(self, factory: Callable[..., list[Any]], *, op_timeout: float = DEFAULT_OP_TIMEOUT,
                 options: dict | None = None, run_tag: str = "run") -> None:
        self.factory, self.op_timeout, self.options = factory, op_timeout, dict(options or {})
        self.sets: dict[int, list[BoundedStore]] = {}
        self.restarts = 0
        self._runs = itertools.count()
        self.run_tag = run_tag

    def stores(self, n_ranks: int) -> list[BoundedStore]:
        if n_ranks not in self.sets:
            made = list(self.factory(n_ranks, **self.options))
            lacking = sorted({m for s in made for m in missing_members(s, STORE_METHODS)})
            if len(made) != n_ranks or lacking:
                for s in made:
                    if callable(getattr(s, "close", None)):
                        s.close()
                raise ValueError(f"the client factory returned {len(made)} stores for {n_ranks} ranks"
                                 + (f", lacking RankStore method(s) {', '.join(lacking)}" if lacking else ""))
            self.sets[n_ranks] = [BoundedStore(s, self.op_timeout) for s in made]
        return self.sets[n_ranks]

    def run(self, protocol: Any, case: Case) -> Outcome:
        """Run `case` with keys salted for this run (a real store keeps earlier runs' keys)."""
        salted = case if case.salt.startswith(self.run_tag) else attrs.evolve(
            case, salt=f"{self.run_tag}{next(self._runs)}-{case.salt}")
        stores = self.stores(case.n_ranks)
        out = run_case(protocol, salted, stores)
        if any(s.broken for s in stores):
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
