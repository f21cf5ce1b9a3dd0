"""Flawed variants of the lookup/scheduler: Z3 finds a counterexample for each (expected result
"counterexample"), minimised and extracted into a concrete configuration (N, K, cached set).

The search space is bounded (N <= NMAX ranks, K <= KMAX chunks, any cached subset): a bounded model
is all a counterexample needs.  Every quantity is a quantifier-free term over N, K and one Boolean
per chunk, so each search is stable.  ``evaluate`` runs the demo protocol class itself on a configuration
(independently of Z3) and ``confirm`` checks that the Z3 model really violates.
"""
from __future__ import annotations

from typing import Any, Callable

import z3

from .encoding import Obligation, ints
from .theorems import Theorem

__all__ = ["VARIANTS", "evaluate", "confirm", "FLAWED"]

NMAX, KMAX = 4, 6

# Each variant: name -> (demo class in model.variants, property the harness should report)
VARIANTS: dict[str, tuple[str, str]] = {
    "own-count-report": ("OwnCountReport", "completeness"),
    "empty-rank-reports-zero": ("EmptyRankReportsZero", "completeness"),
    "max-combine": ("MaxCombine", "soundness"),
    "mismatched-ownership": ("MismatchedOwnership", "completeness"),
}


# ---------------------------------------------------------------------------------------------
# the double check: the demo protocol itself, run by the harness (no second copy of its semantics)
# ---------------------------------------------------------------------------------------------

def evaluate(variant: str, n: int, k: int, cached: set[int] | frozenset[int]) -> dict[str, Any]:
    """Reports, planned and LCP of `variant` on (n ranks, k chunks, cached set), computed by running the demo
    protocol class of `model.variants` through the harness's store and lookup phases (every chunk outside the
    cached set evicted before lookup): independent of the Z3 encoding, and the very code the other engines check."""
    import model.variants
    from model.faults import Eviction, FaultPlan
    from model.harness import Case, lookup_phase, store_phase
    from model.store import memory_factory

    protocol = getattr(model.variants, VARIANTS[variant][0])()
    case = Case(n, k, faults=FaultPlan.of(before_lookup=[Eviction(c) for c in range(k) if c not in cached]))
    stores = memory_factory(n)
    out, shadow = store_phase(protocol, case, stores)
    for e in case.faults.at("before-lookup"):
        shadow.evict(e)
    lookup_phase(protocol, out, stores, shadow)
    planned, lcp = out.planned, out.lcp
    prop = "soundness" if planned > lcp else "completeness" if planned < lcp else None
    return {"reports": list(out.reports), "planned": planned, "lcp": lcp, "property": prop}


def confirm(witness: dict[str, Any] | None) -> bool:
    """The Z3 model's configuration violates when the demo protocol runs, with the same numbers Z3 computed."""
    if not witness:
        return False
    ev = evaluate(witness["variant"], witness["n_ranks"], witness["n_chunks"], set(witness["cached"]))
    return (ev["property"] is not None and ev["property"] == witness["property"]
            and ev["reports"] == witness["reports"] and ev["planned"] == witness["planned"]
            and ev["lcp"] == witness["lcp"])


# ---------------------------------------------------------------------------------------------
# Z3 encoding
# ---------------------------------------------------------------------------------------------

class _Space:
    def __init__(self, ctx: z3.Context):
        self.ctx = ctx
        self.N, self.K = ints(ctx, "N K")
        self.cached = [z3.Bool(f"cached_{c}", ctx) for c in range(KMAX)]

    def bounds(self):
        return [1 <= self.N, self.N <= NMAX, 0 <= self.K, self.K <= KMAX]

    def owns(self, i: int, c: int, shift: int = 0) -> z3.BoolRef:
        """Rank i owns chunk c under owner(c) = (c + shift) mod N (case split over N's values)."""
        return z3.Or([z3.And(self.N == n, z3.BoolVal((c + shift) % n == i, self.ctx))
                      for n in range(1, NMAX + 1)])

    def first(self, missing: Callable[[int], z3.BoolRef]) -> z3.ArithRef:
        """The first c < K with missing(c), else K."""
        r = self.K
        for c in reversed(range(KMAX)):
            r = z3.If(z3.And(c < self.K, missing(c)), z3.IntVal(c, self.ctx), r)
        return r

    def ref_report(self, i: int) -> z3.ArithRef:
        return self.first(lambda c: z3.And(self.owns(i, c), z3.Not(self.cached[c])))

    def combine(self, reports: list, pick: str) -> z3.ArithRef:
        out = reports[0]
        for i in range(1, NMAX):
            better = reports[i] < out if pick == "min" else reports[i] > out
            out = z3.If(z3.And(i < self.N, better), reports[i], out)
        return out


def _reports(s: _Space, variant: str) -> tuple[list, z3.ArithRef]:
    ranks = range(NMAX)
    if variant == "own-count-report":
        reps = [z3.Sum([z3.If(z3.And(c < s.ref_report(i), s.owns(i, c)), 1, 0) for c in range(KMAX)])
                for i in ranks]
        return reps, s.combine(reps, "min")
    if variant == "empty-rank-reports-zero":
        reps = [z3.If(z3.Or([z3.And(c < s.K, s.owns(i, c)) for c in range(KMAX)]), s.ref_report(i), 0)
                for i in ranks]
        return reps, s.combine(reps, "min")
    if variant == "max-combine":
        reps = [s.ref_report(i) for i in ranks]
        return reps, s.combine(reps, "max")
    if variant == "mismatched-ownership":
        def stored(i, c):
            return z3.And(s.cached[c], s.owns(i, c))
        reps = [s.first(lambda c, i=i: z3.And(s.owns(i, c, shift=1), z3.Not(stored(i, c)))) for i in ranks]
        return reps, s.combine(reps, "min")
    raise ValueError(variant)


def _search(variant: str, every_rank_owns: bool = False) -> Obligation:
    def build(ctx):
        s = _Space(ctx)
        reps, planned = _reports(s, variant)
        lcp = s.first(lambda c: z3.Not(s.cached[c]))
        bit = lambda b: z3.If(b, 1, 0)
        terms = {"N": s.N, "K": s.K, "cached": s.cached, "reports": reps, "planned": planned, "lcp": lcp,
                 "size": s.N + s.K,
                 "evicted": s.K - z3.Sum([z3.If(z3.And(c < s.K, b), 1, 0) for c, b in enumerate(s.cached)]),
                 "mask": z3.Sum([bit(b) * (1 << c) for c, b in enumerate(s.cached)])}
        shape = [s.K >= s.N] if every_rank_owns else []
        return [*s.bounds(), *shape, planned != lcp], terms

    def extract(model: z3.ModelRef, terms) -> dict[str, Any]:
        ev = lambda t: model.eval(t, model_completion=True)
        n, k = ev(terms["N"]).as_long(), ev(terms["K"]).as_long()
        cached = [c for c in range(k) if z3.is_true(ev(terms["cached"][c]))]
        planned, lcp = ev(terms["planned"]).as_long(), ev(terms["lcp"]).as_long()
        return {"variant": variant, "n_ranks": n, "n_chunks": k, "cached": cached,
                "reports": [ev(r).as_long() for r in terms["reports"][:n]], "planned": planned, "lcp": lcp,
                "property": "soundness" if planned > lcp else "completeness"}

    # Lexicographically smallest: fewest ranks + chunks, fewest ranks, fewest evicted chunks (the
    # harness realises the cached set by evicting the rest), then the cached bitmask (a tie-break
    # that makes the model seed-independent).  So dropping a rank, a chunk or an eviction from the
    # counterexample loses the violation.
    suffix = ".search_every_rank_owns_a_chunk" if every_rank_owns else ".search"
    return Obligation(f"{variant}{suffix}", build, expect="sat", extract=extract,
                      minimise=("size", "N", "evicted", "mask"))


def _flawed(variant: str, statement: str) -> Theorem:
    searches = [_search(variant)]
    if variant == "own-count-report":
        # (i) is also refuted with K >= N (every rank owns a chunk), so its flaw is not merely the
        # idle-rank shape of (ii).  The first search's model is the one saved as a trace.
        searches.append(_search(variant, every_rank_owns=True))
    return Theorem(f"F_{variant}", statement, tuple(searches), (), expected="counterexample",
                   confirm=confirm)


FLAWED: tuple[Theorem, ...] = (
    _flawed("own-count-report", "(i) ranks report the count of their own consecutive present chunks; "
            "min over ranks = LCP"),
    _flawed("empty-rank-reports-zero", "(ii) a rank owning no chunk reports 0; min over ranks = LCP"),
    _flawed("max-combine", "(iii) the scheduler takes the max over ranks; max = LCP"),
    _flawed("mismatched-ownership", "(iv) store owner c mod N, lookup owner (c+1) mod N; min = LCP"),
)
