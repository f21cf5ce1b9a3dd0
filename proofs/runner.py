"""Run theorems over several solver seeds and summarise them as the ``prove --json`` rows."""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import attrs

from .encoding import MAX_SECONDS, RLIMIT, CheckResult, Obligation, check
from .theorems import Theorem

__all__ = ["TheoremReport", "hypotheses_of", "run_theorem", "run_reports", "format_table"]


@attrs.frozen
class TheoremReport:
    theorem: str
    expected: str
    result: str  # "proved" | "counterexample" | "unknown"
    seconds: float  # max over seeds of the theorem's total solver seconds on that seed
    rlimit: int  # max over seeds of the theorem's total resource count on that seed
    seeds: int
    vacuity: str  # "sat" (hypotheses satisfiable) | "unsat" | "unknown"
    stable: bool  # every seed gave the expected answer, each check within its rlimit
    checks: tuple[tuple[CheckResult, ...], ...]  # per seed
    counterexample: Any = None  # concrete configuration (flawed variants), from seed 0

    def row(self) -> dict[str, Any]:
        return {"theorem": self.theorem, "expected": self.expected, "result": self.result,
                "seconds": round(self.seconds, 4), "rlimit": self.rlimit, "seeds": self.seeds,
                "vacuity": self.vacuity}


def hypotheses_of(ob: Obligation, hint=None) -> Obligation:
    """A proof step's own vacuity check: its assertions without the last one (the negated goal)
    must be satisfiable, so the step is not unsat merely because its instances contradict.
    `hint(ctx)` may add constraints (same-named constants) selecting a special case."""
    def build(ctx):
        assertions, terms = ob.build(ctx)
        return [*list(assertions)[:-1], *(hint(ctx) if hint else [])], terms
    return Obligation(f"{ob.name}[hyps]", build, expect="sat")


def run_theorem(th: Theorem, *, seeds: int = 10, rlimit: int = RLIMIT) -> TheoremReport:
    vacuity = list(th.vacuity)
    if th.expected == "proved":
        vacuity += [hypotheses_of(ob, th.hyps_hint) for ob in th.obligations]
    per_seed: list[tuple[CheckResult, ...]] = []
    for seed in range(seeds):
        per_seed.append(tuple(check(ob, seed=seed, rlimit=rlimit) for ob in (*th.obligations, *vacuity)))
    n_main = len(th.obligations)
    mains = [r for rs in per_seed for r in rs[:n_main]]
    vacs = [r for rs in per_seed for r in rs[n_main:]]
    seconds = max((sum(r.seconds for r in rs) for rs in per_seed), default=0.0)
    used = max((sum(r.rlimit for r in rs) for rs in per_seed), default=0)

    witness = None
    if th.expected == "proved":
        if mains and all(r.status == "unsat" for r in mains):
            result = "proved"
        elif any(r.status == "sat" for r in mains):
            result = "counterexample"
        else:
            result = "unknown"
    else:  # a flawed variant: every obligation is a search for a violation
        if mains and all(r.status == "sat" for r in mains):
            witness = per_seed[0][0].witness
            confirmed = all(th.confirm is None or th.confirm(r.witness) for r in mains)
            result = "counterexample" if confirmed else "unknown"
        elif mains and all(r.status == "unsat" for r in mains):
            result = "proved"
        else:
            result = "unknown"

    if not vacs:
        vacuity = "sat" if witness is not None else "unknown"  # the counterexample is a model
    elif all(r.status == "sat" for r in vacs):
        vacuity = "sat"
    elif any(r.status == "unsat" for r in vacs):
        vacuity = "unsat"
    else:
        vacuity = "unknown"
    if vacuity == "unsat" and result == "proved":
        result = "unknown"  # vacuous: the hypotheses are contradictory
    stable = result == th.expected and vacuity == "sat"  # (within the rlimit of every check: no wall-clock luck)
    return TheoremReport(th.name, th.expected, result, seconds, used, seeds, vacuity, stable,
                         tuple(per_seed), witness)


def run_reports(theorems: Iterable[Theorem], *, seeds: int = 10) -> list[TheoremReport]:
    return [run_theorem(th, seeds=seeds) for th in theorems]


def format_table(results: Sequence[dict[str, Any]]) -> str:
    """Render ``run_all`` rows as a fixed-width table."""
    cols = ("theorem", "expected", "result", "seconds", "rlimit", "seeds", "vacuity")
    heads = ("theorem", "expected", "result", "max solver s", "rlimit used", "seeds", "vacuity")
    cells = [[_fmt(k, r.get(k, "")) for k in cols] for r in results]
    widths = [max(len(h), *(len(row[i]) for row in cells)) if cells else len(h)
              for i, h in enumerate(heads)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(heads, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    ok = sum(r["result"] == r["expected"] for r in results)
    slow = [r["theorem"] for r in results if float(r.get("seconds", 0)) >= MAX_SECONDS]
    if slow:
        lines.append(f"over {MAX_SECONDS} solver s on some seed: {', '.join(slow)}")
    lines.append(f"{ok}/{len(results)} theorems have their expected result "
                 f"(rlimit budget {RLIMIT:,} per obligation, limit {MAX_SECONDS} solver s per seed)")
    return "\n".join(lines)


def _fmt(key: str, v: Any) -> str:
    if key == "seconds":
        return f"{float(v):.3f}"
    if key == "rlimit":
        return f"{int(v):,}"
    return str(v)
