"""Shared Z3 plumbing: obligations, one fresh context per check, a fixed rlimit, seeded solvers.

Every check runs in its own ``z3.Context`` so that the ``rlimit count`` statistic is the resource
use of that one check (the counter is per context and cumulative), and so that no state leaks
between seeds.  Budgets are resource limits (``rlimit``), never wall-clock timeouts: a result is
reproducible on any machine, and a proof that needs more than the budget reports ``unknown``.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Sequence

import attrs
import z3

__all__ = ["RLIMIT", "MAX_SECONDS", "Query", "Obligation", "CheckResult", "check", "between", "ints", "reals",
           "pred", "ifun"]

#: Fixed resource budget per obligation (z3 ``rlimit``).  The heaviest obligation uses < 2 % of it.
RLIMIT = 2_000_000
#: Solver seconds one theorem may take on one seed (all its obligations together).
MAX_SECONDS = 1.0

#: A query: the assertions to check, and named terms an extractor may evaluate in a model.
Query = tuple[Sequence[z3.BoolRef], Mapping[str, Any]]


@attrs.frozen
class Obligation:
    """One solver query.  ``expect`` is ``"unsat"`` for a proof step, ``"sat"`` for a
    vacuity check or a counterexample search."""

    name: str
    build: Callable[[z3.Context], Query]
    expect: str = "unsat"
    extract: Callable[[z3.ModelRef, Mapping[str, Any]], Any] | None = None
    #: Names of integer terms (in the query's terms) to minimise lexicographically after ``sat``
    #: (iterative tightening on the same solver, same budget): pins a smallest, seed-independent model.
    minimise: tuple[str, ...] = ()


@attrs.frozen
class CheckResult:
    obligation: str
    status: str  # "sat" | "unsat" | "unknown"
    seconds: float
    rlimit: int
    witness: Any = None
    reason: str = ""


_SEED_PARAMS = ("sat.random_seed", "smt.random_seed")


def check(ob: Obligation, *, seed: int, rlimit: int = RLIMIT) -> CheckResult:
    """Check one obligation in a fresh context with the given seed and resource budget."""
    saved = {p: z3.get_param(p) for p in _SEED_PARAMS}
    try:
        for p in _SEED_PARAMS:  # sat.random_seed is only a global parameter
            z3.set_param(p, seed)
        ctx = z3.Context()
        solver = z3.Solver(ctx=ctx)
        solver.set("rlimit", rlimit)
        solver.set("random_seed", seed)
        solver.set("smt.random_seed", seed)
        assertions, terms = ob.build(ctx)
        solver.add(*assertions)
        start = time.perf_counter()
        answer = solver.check()
        seconds = time.perf_counter() - start
        stats = solver.statistics()
        used = int(stats.get_key_value("rlimit count")) if "rlimit count" in stats.keys() else 0
        status = str(answer)
        witness = None
        reason = ""
        if answer == z3.sat and ob.minimise:
            model = solver.model()
            for name in ob.minimise:
                term = terms[name]
                while True:
                    best = model.eval(term, model_completion=True)
                    solver.push()
                    solver.add(term < best)
                    start = time.perf_counter()
                    again = solver.check()
                    seconds += time.perf_counter() - start
                    if again == z3.sat:
                        model = solver.model()
                        solver.pop()
                        solver.add(term <= best)  # keep progress; the next round tightens further
                        continue
                    solver.pop()
                    if again == z3.unknown:
                        answer, reason = again, solver.reason_unknown()
                    solver.add(term == best)
                    break
                if answer == z3.unknown:
                    break
            status = str(answer)
            if answer == z3.sat:
                start = time.perf_counter()
                answer = solver.check()  # the pinned model (the loop's last check was unsat)
                seconds += time.perf_counter() - start
                status = str(answer)
                stats = solver.statistics()
                used = int(stats.get_key_value("rlimit count"))
        if answer == z3.sat and ob.extract is not None:
            witness = ob.extract(solver.model(), terms)
        if answer == z3.unknown:
            reason = solver.reason_unknown()
        return CheckResult(ob.name, status, seconds, used, witness, reason)
    finally:
        for p, v in saved.items():
            z3.set_param(p, v)


# --- small formula helpers -------------------------------------------------------------------

def between(lo: Any, x: Any, hi: Any) -> z3.BoolRef:
    """``lo <= x < hi``."""
    return z3.And(lo <= x, x < hi)


def ints(ctx: z3.Context, names: str) -> list[z3.ArithRef]:
    return [z3.Int(n, ctx) for n in names.split()]


def reals(ctx: z3.Context, names: str) -> list[z3.ArithRef]:
    return [z3.Real(n, ctx) for n in names.split()]


def pred(ctx: z3.Context, name: str) -> z3.FuncDeclRef:
    """An uninterpreted predicate over Int (e.g. an arbitrary cached set)."""
    return z3.Function(name, z3.IntSort(ctx), z3.BoolSort(ctx))


def ifun(ctx: z3.Context, name: str) -> z3.FuncDeclRef:
    """An uninterpreted function Int -> Int (e.g. an arbitrary ownership, per-rank reports)."""
    return z3.Function(name, z3.IntSort(ctx), z3.IntSort(ctx))
