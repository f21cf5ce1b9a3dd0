"""T1..T5: the unbounded theorems, each split into small quantifier-free obligations.

Proof style (the reason every obligation is stable across seeds): definitions are written as their universally
quantified defining properties (the LCP ``L``: every chunk below ``L`` is cached, and ``L = K`` or chunk ``L`` is
missing; a rank's report: every owned chunk below it is cached, and it is ``K`` or an owned missing chunk; the minimum
``m``: below-or-equal every report, equal to the report of a witness rank ``j0``).  A proof step never hands the
quantifiers to the solver: it names the instances it needs (explicit witnesses such as "the rank owning chunk L") and
asserts only those. Instances of true universal hypotheses are true, so an unsat quantifier-free obligation is a proof
of the universal statement for every N >= 1, K >= 0 and every cached set / ownership / fault set. Nonlinear facts are
proved once as separate lemmas: T1 keeps ``c mod N`` as a term but the only fact its steps rely on (0 <= c mod N < N)
is the lemma ``mod_is_total_ownership``, instantiated where needed; T3's products S*L, S*K are replaced in the main
step by fresh constants carrying only the lemmas' conclusions; T5's products over the reals go to nlsat in tiny
separate obligations, with 1/B and 1/R as variables x, y (x*B = 1, y*R = 1) instead of divisions.  A sequence of
obligations sharing symbol names composes: an earlier lemma's conclusion appears as a hypothesis of a later one.
"""
from __future__ import annotations

from typing import Any, Callable

import attrs
import z3

from model.cost import PAPER

from .encoding import Obligation, between, ifun, ints, pred, reals

__all__ = ["Theorem", "T1", "T2", "T3", "T4", "T5", "THEOREMS"]


@attrs.frozen
class Theorem:
    """A named statement proved by ``obligations`` (all expected ``unsat``) whose hypotheses are
    shown satisfiable by ``vacuity`` (all expected ``sat``)."""

    name: str
    statement: str
    obligations: tuple[Obligation, ...]
    vacuity: tuple[Obligation, ...]
    expected: str = "proved"
    confirm: Callable[[Any], bool] | None = None
    #: Extra constraints for the per-step hypothesis checks (a satisfiable special case is enough
    #: to show the hypotheses satisfiable; e.g. fixing N makes ``c mod N`` linear).
    hyps_hint: Callable[[z3.Context], list] | None = None


# ============================================================================================
# T1 / T2: min over ranks of "first missing owned chunk" = longest cached prefix
# ============================================================================================

class _MinSetup:
    """Symbols and hypothesis instances shared by T1 (owner c mod N) and T2 (any ownership)."""

    def __init__(self, ctx: z3.Context, owner: str):
        self.N, self.K, self.L, self.m, self.j0 = ints(ctx, "N K L m j0")
        self.cached = pred(ctx, "cached")
        self.rep = ifun(ctx, "rep")
        if owner == "mod":
            self.own = lambda c: c % self.N
        else:
            f = ifun(ctx, "own")
            self.own = lambda c: f(c)

    def base(self) -> list[z3.BoolRef]:
        return [self.N >= 1, self.K >= 0]

    # LCP: chunks below L cached; L = K or chunk L missing.
    def lcp_below(self, c):
        return z3.Implies(between(0, c, self.L), self.cached(c))

    def lcp_stop(self):
        return z3.And(0 <= self.L, self.L <= self.K,
                      z3.Or(self.L == self.K, z3.Not(self.cached(self.L))))

    # report of rank i: first missing owned chunk, K when none.
    def rep_below(self, i, c):
        return z3.Implies(z3.And(between(0, i, self.N), between(0, c, self.rep(i)), self.own(c) == i),
                          self.cached(c))

    def rep_stop(self, i):
        r = self.rep(i)
        return z3.Implies(between(0, i, self.N), z3.And(
            0 <= r, r <= self.K,
            z3.Implies(r < self.K, z3.And(self.own(r) == i, z3.Not(self.cached(r))))))

    # total ownership: every chunk has an owner rank in [0, N)
    def own_total(self, c):
        return z3.Implies(between(0, c, self.K), between(0, self.own(c), self.N))

    # m = min over ranks of rep
    def min_le(self, i):
        return z3.Implies(between(0, i, self.N), self.m <= self.rep(i))

    def min_attained(self):
        return z3.And(between(0, self.j0, self.N), self.m == self.rep(self.j0))

    def expanded(self, n: int, k: int) -> list[z3.BoolRef]:
        """All hypotheses at N = n, K = k.  Every quantifier is guarded by 0 <= c < K (or < L,
        < rep(i) <= K) and 0 <= i < N, so at fixed N, K the finite conjunction over c in [0, K),
        i in [0, N) is equivalent to the quantified hypothesis (used for vacuity checks)."""
        cs, rs = range(k), range(n)
        return [self.N == n, self.K == k, *self.base(), self.lcp_stop(), self.min_attained(),
                *(self.lcp_below(c) for c in cs), *(self.own_total(c) for c in cs),
                *(self.rep_below(i, c) for i in rs for c in cs), *(self.rep_stop(i) for i in rs),
                *(self.min_le(i) for i in rs)]


def _min_theorem(tag: str, owner: str, statement: str) -> Theorem:
    def rep_le_lcp(ctx):
        # Lemma A: the rank owning chunk L reports <= L (explicit witness j = own(L)).
        s = _MinSetup(ctx, owner)
        j = s.own(s.L)
        return [*s.base(), s.lcp_stop(), s.own_total(s.L), s.rep_below(j, s.L), s.rep_stop(j),
                s.L < s.K, z3.Not(s.rep(j) <= s.L)], {}

    def min_le_lcp(ctx):
        # m <= L: if L < K use lemma A at j = own(L) and m <= rep(j); if L = K, m = rep(j0) <= K.
        s = _MinSetup(ctx, owner)
        j = s.own(s.L)
        lemma_a = z3.Implies(s.L < s.K, s.rep(j) <= s.L)
        return [*s.base(), s.lcp_stop(), s.own_total(s.L), lemma_a, s.min_le(j), s.min_attained(),
                s.rep_stop(s.j0), z3.Not(s.m <= s.L)], {}

    def rep_ge_lcp(ctx):
        # Lemma B: every rank i reports >= L (all chunks below L are cached; a report < K is missing).
        s = _MinSetup(ctx, owner)
        i = z3.Int("i", ctx)
        return [*s.base(), s.lcp_stop(), between(0, i, s.N), s.rep_stop(i), s.lcp_below(s.rep(i)),
                z3.Not(s.rep(i) >= s.L)], {}

    def min_ge_lcp(ctx):
        # m >= L: m = rep(j0) and lemma B at i = j0.
        s = _MinSetup(ctx, owner)
        lemma_b = z3.Implies(between(0, s.j0, s.N), s.rep(s.j0) >= s.L)
        return [*s.base(), s.min_attained(), lemma_b, z3.Not(s.m >= s.L)], {}

    def lookup_sees_cached(ctx):
        # Why a rank's lookup may be read as "is chunk c cached": stored(r, c) = rank r's store
        # holds a key the store path wrote for c; cached(c) <=> some rank's store does (skolem
        # witness w(c)); the store path writes c only on own(c), the rank that looks it up.  Then for
        # an owned chunk, the rank's own-store answer equals cached(c).
        s = _MinSetup(ctx, owner)
        i, c = ints(ctx, "i c")
        I = z3.IntSort(ctx)
        stored = z3.Function("stored", I, I, z3.BoolSort(ctx))
        w = z3.Function("w", I, I)
        cached_intro = z3.Implies(stored(i, c), s.cached(c))
        cached_elim = z3.Implies(s.cached(c), z3.And(between(0, w(c), s.N), stored(w(c), c)))
        only_owner = z3.Implies(stored(w(c), c), w(c) == s.own(c))
        return [*s.base(), between(0, c, s.K), s.own_total(c), s.own(c) == i, cached_intro, cached_elim,
                only_owner, stored(i, c) != s.cached(c)], {}

    def lcp_unique(ctx):
        # The LCP's defining properties determine it: two solutions L, L2 are equal.
        s = _MinSetup(ctx, owner)
        L2 = z3.Int("L2", ctx)
        stop2 = z3.And(0 <= L2, L2 <= s.K, z3.Or(L2 == s.K, z3.Not(s.cached(L2))))
        below2 = z3.Implies(between(0, s.L, L2), s.cached(s.L))
        return [*s.base(), s.lcp_stop(), stop2, s.lcp_below(L2), below2, s.L != L2], {}

    def rep_unique(ctx):
        # A rank's report is determined by its defining properties.
        s = _MinSetup(ctx, owner)
        i = z3.Int("i", ctx)
        rep2 = ifun(ctx, "rep2")
        r, r2 = s.rep(i), rep2(i)
        stop2 = z3.And(0 <= r2, r2 <= s.K,
                       z3.Implies(r2 < s.K, z3.And(s.own(r2) == i, z3.Not(s.cached(r2)))))
        below2 = z3.Implies(z3.And(between(0, r, r2), s.own(r) == i), s.cached(r))
        return [*s.base(), between(0, i, s.N), s.rep_stop(i), stop2, s.rep_below(i, r2), below2,
                r != r2], {}

    def vacuity_gap(ctx):
        # All hypotheses hold with a non-trivial shape: 3 ranks, 7 chunks, a gap inside the prompt.
        s = _MinSetup(ctx, owner)
        return [*s.expanded(3, 7), 1 < s.L, s.L < 6], {}

    def vacuity_idle_rank(ctx):
        # ... and with more ranks than chunks (a rank owning no chunk) and a full hit.
        s = _MinSetup(ctx, owner)
        return [*s.expanded(4, 2), s.L == 2], {}

    obligations = [
        Obligation(f"{tag}.lookup_sees_cached", lookup_sees_cached),
        Obligation(f"{tag}.lcp_unique", lcp_unique),
        Obligation(f"{tag}.rep_unique", rep_unique),
        Obligation(f"{tag}.lemma_owner_of_L_reports_le_L", rep_le_lcp),
        Obligation(f"{tag}.min_le_lcp", min_le_lcp),
        Obligation(f"{tag}.lemma_every_report_ge_L", rep_ge_lcp),
        Obligation(f"{tag}.min_ge_lcp", min_ge_lcp),
    ]
    if owner == "mod":
        def mod_total(ctx):
            # c mod N is a total ownership function into [0, N) for N >= 1.
            N, c = ints(ctx, "N c")
            return [N >= 1, z3.Not(between(0, c % N, N))], {}
        obligations.insert(0, Obligation(f"{tag}.mod_is_total_ownership", mod_total))
    return Theorem(tag, statement, tuple(obligations),
                   (Obligation(f"{tag}.vacuity_gap", vacuity_gap, expect="sat"),
                    Obligation(f"{tag}.vacuity_idle_rank", vacuity_idle_rank, expect="sat")),
                   hyps_hint=(lambda ctx: [z3.Int("N", ctx) == 3]) if owner == "mod" else None)


T1 = _min_theorem(
    "T1_min_over_ranks",
    "mod",
    "owner(c) = c mod N; each rank reports its first missing owned chunk (K if none); "
    "min over ranks = LCP, for all N >= 1, K >= 0, cached sets",
)
T2 = _min_theorem(
    "T2_any_ownership",
    "uf",
    "as T1 for every total ownership function chunks -> ranks",
)


# ============================================================================================
# T3: tokens
# ============================================================================================

def _t3() -> Theorem:
    def div_bounds(ctx):
        # K = n div S with S >= 1 gives S*K <= n < S*K + S (only full chunks are stored).
        n, S = ints(ctx, "n S")
        K = n / S
        return [n >= 1, S >= 1, z3.Not(z3.And(S * K <= n, n < S * K + S, K >= 0))], {}

    def mono(ctx):
        # 0 <= L <= K and S >= 1 give 0 <= S*L <= S*K.  Proved over the reals (a superset of the
        # integers), where z3's complete nlsat procedure answers with a seed-independent effort.
        S, L, K = reals(ctx, "S L K")
        return [S >= 1, 0 <= L, L <= K, z3.Not(z3.And(0 <= S * L, S * L <= S * K))], {}

    def hit_main(ctx):
        # With P = S*L (cached prefix tokens) and F = S*K (full-chunk tokens) carrying only the
        # lemma facts 0 <= P <= F <= n: hit = n-1 if P = n else P.
        n, P, F = ints(ctx, "n P F")
        hit = z3.If(P == n, n - 1, P)
        goal = z3.And(hit <= n - 1, hit <= P, hit >= 0,
                      z3.Implies(P < n, hit == P), z3.Implies(P == n, hit == n - 1))
        return [n >= 1, 0 <= P, P <= F, F <= n, z3.Not(goal)], {}

    def full_hit_needs_all_chunks(ctx):
        # A full-prompt hit (P = n) happens only when every chunk is cached and n is a multiple of S.
        n, P, F = ints(ctx, "n P F")
        return [n >= 1, 0 <= P, P <= F, F <= n, P == n, z3.Not(F == n)], {}

    def full_hit_means_all_chunks(ctx):
        # S*L = S*K with S >= 1 forces L = K: a full-prompt hit means every chunk is cached
        # (over the reals, as mul_monotone).
        S, L, K = reals(ctx, "S L K")
        return [S >= 1, S * L == S * K, z3.Not(L == K)], {}

    def vacuity(ctx):
        n, S, L = ints(ctx, "n S L")
        K = n / S
        return [n >= 1, S >= 2, 0 < L, L < K, n % S != 0], {}

    return Theorem(
        "T3_tokens",
        "hit = S*LCP, a full-prompt hit reduced to n-1: hit <= n-1, hit <= cached prefix tokens, "
        "hit = cached full-chunk prefix tokens otherwise",
        (Obligation("T3.div_bounds", div_bounds), Obligation("T3.mul_monotone", mono),
         Obligation("T3.hit", hit_main), Obligation("T3.full_hit_iff_all", full_hit_needs_all_chunks),
         Obligation("T3.full_hit_means_L_eq_K", full_hit_means_all_chunks)),
        (Obligation("T3.vacuity", vacuity, expect="sat"),),
    )


T3 = _t3()


# ============================================================================================
# T4: load agreement and collective sequence
# ============================================================================================

class _LoadSetup:
    def __init__(self, ctx):
        self.N, self.K, self.p, self.u, self.j0 = ints(ctx, "N K p u j0")
        self.failed = pred(ctx, "failed")
        self.f = ifun(ctx, "f")  # a rank's first failed own chunk below p, or p
        own = ifun(ctx, "own")
        self.own = lambda c: own(c)

    def base(self):
        return [self.N >= 1, 0 <= self.p, self.p <= self.K]

    def own_total(self, c):
        return z3.Implies(between(0, c, self.K), between(0, self.own(c), self.N))

    def f_below(self, i, c):
        return z3.Implies(z3.And(between(0, i, self.N), between(0, c, self.f(i)), self.own(c) == i),
                          z3.Not(self.failed(c)))

    def f_stop(self, i):
        r = self.f(i)
        return z3.Implies(between(0, i, self.N), z3.And(
            0 <= r, r <= self.p, z3.Implies(r < self.p, z3.And(self.own(r) == i, self.failed(r)))))

    def u_le(self, i):
        return z3.Implies(between(0, i, self.N), self.u <= self.f(i))

    def u_attained(self):
        return z3.And(between(0, self.j0, self.N), self.u == self.f(self.j0))


def _t4() -> Theorem:
    def prefix_fetched(ctx):
        # Every chunk c < u was fetched (not failed, below planned) by its owner i = own(c).
        s = _LoadSetup(ctx)
        c = z3.Int("c", ctx)
        i = s.own(c)
        goal = z3.And(z3.Not(s.failed(c)), c < s.p, between(0, i, s.N))
        return [*s.base(), between(0, c, s.u), s.u_attained(), s.f_stop(s.j0), s.own_total(c),
                s.u_le(i), s.f_below(i, c), z3.Not(goal)], {}

    def u_le_planned(ctx):
        s = _LoadSetup(ctx)
        return [*s.base(), s.u_attained(), s.f_stop(s.j0), z3.Not(s.u <= s.p)], {}

    def maximal_without_faults(ctx):
        # No fetch failed below p (instance at the witness's report) -> u = p.
        s = _LoadSetup(ctx)
        r = s.f(s.j0)
        no_fault_at_r = z3.Implies(between(0, r, s.p), z3.Not(s.failed(r)))
        return [*s.base(), s.u_attained(), s.f_stop(s.j0), no_fault_at_r, s.u != s.p], {}

    # --- collective sequence of the reference load program -----------------------------------
    # rank_load = [fetch own chunks < planned: GetAsync/Wait, no collective] ; AllReduceMin(f) ;
    # then a continuation that branches only on u (the all-reduce result, equal on all ranks):
    # AllGather.  Collective projection of the fetch loop: loopC(k), k = iterations, which may be
    # any function of rank and fault pattern (early stop on failure included).
    def _effects(ctx):
        # Effects a rank program yields; the collective projection keeps collectives, drops the rest.
        Eff = z3.Datatype("Eff", ctx=ctx)
        for kind in ("Get", "GetAsync", "Wait", "Put", "AllReduceMin", "AllGather", "Broadcast"):
            Eff.declare(kind)
        Eff = Eff.create()
        seq = z3.SeqSort(Eff)
        empty = z3.Empty(seq)

        def local(e):
            return z3.Or(Eff.is_Get(e), Eff.is_GetAsync(e), Eff.is_Wait(e), Eff.is_Put(e))

        def proj(e):
            return z3.If(local(e), empty, z3.Unit(e))

        # loopC(k): collective projection of the first k effects of a fetch loop; eff(k) its k-th effect
        loopC = z3.Function("loopC", z3.IntSort(ctx), seq)
        eff = z3.Function("eff", z3.IntSort(ctx), Eff)
        return Eff, empty, local, proj, loopC, eff

    def loop_base(ctx):
        Eff, empty, local, proj, loopC, eff = _effects(ctx)
        return [loopC(0) == empty, z3.Not(loopC(0) == empty)], {}

    def loop_step(ctx):
        # Induction step.  Every effect of the fetch loops of rank_load is Get (sync) or GetAsync /
        # Wait (async) -- which one, and its result (hit, miss, timeout), depends on the rank and the
        # fault pattern, so eff(k) is any local effect.
        Eff, empty, local, proj, loopC, eff = _effects(ctx)
        k = z3.Int("k", ctx)
        return [k >= 0, local(eff(k)), loopC(k) == empty, loopC(k + 1) == z3.Concat(loopC(k), proj(eff(k))),
                z3.Not(loopC(k + 1) == empty)], {}

    def same_sequence(ctx):
        Eff, empty, local, proj, loopC, eff = _effects(ctx)
        # Two ranks (or one rank under two fault patterns): first fetch loop a iterations, second
        # (the async flavour's wait loop; 0 for the sync one) b, arbitrary per rank and faults;
        # then AllReduceMin and AllGather unconditionally.
        a1, b1, a2, b2 = ints(ctx, "a1 b1 a2 b2")

        def prog(a, b):
            return z3.Concat(loopC(a), loopC(b), proj(Eff.AllReduceMin), proj(Eff.AllGather))

        expected = z3.Concat(z3.Unit(Eff.AllReduceMin), z3.Unit(Eff.AllGather))
        # instances of the induction lemma (forall k >= 0. loopC(k) = empty)
        ks = (a1, b1, a2, b2)
        return [*(k >= 0 for k in ks), *(loopC(k) == empty for k in ks),
                z3.Not(z3.And(prog(a1, b1) == prog(a2, b2), prog(a1, b1) == expected))], {}

    def vacuity(ctx):
        # All hypotheses at N = 3, K = 6 (guarded quantifiers expanded, as for T1), with a fetch
        # failure strictly inside the plan.
        s = _LoadSetup(ctx)
        n, k = 3, 6
        cs, rs = range(k), range(n)
        return [s.N == n, s.K == k, *s.base(), s.u_attained(), *(s.own_total(c) for c in cs),
                *(s.f_below(i, c) for i in rs for c in cs), *(s.f_stop(i) for i in rs),
                *(s.u_le(i) for i in rs), s.p >= 4, 0 < s.u, s.u < s.p], {}

    return Theorem(
        "T4_load_agreement",
        "u = min over ranks of first failed own chunk below planned: chunks < u fetched by owners, "
        "u <= planned, u = planned without faults; collective sequence independent of rank and faults",
        (Obligation("T4.prefix_fetched_by_owner", prefix_fetched), Obligation("T4.u_le_planned", u_le_planned),
         Obligation("T4.maximal_without_faults", maximal_without_faults),
         Obligation("T4.collectives_loop_base", loop_base), Obligation("T4.collectives_loop_step", loop_step),
         Obligation("T4.collectives_same_on_every_rank", same_sequence)),
        (Obligation("T4.vacuity", vacuity, expect="sat"),),
    )


T4 = _t4()


# ============================================================================================
# T5: cost model (reals)
# ============================================================================================

def _q(x: str | float, ctx) -> z3.ArithRef:
    """An exact rational: a decimal string, or a float read through its shortest repr."""
    return z3.RealVal(x if isinstance(x, str) else repr(float(x)), ctx)


def _t5() -> Theorem:
    # x = 1/B and y = 1/R are introduced as variables with x*B = 1, y*R = 1, so the per-token
    # cost difference y - s*x is a polynomial; d = y - s*x is the per-token advantage of a hit.
    def setup(ctx):
        s, R, B, T0, x, y = reals(ctx, "s R B T0 x y")
        hyps = [s > 0, R > 0, B > 0, T0 > 0, x * B == 1, y * R == 1]
        return s, R, B, T0, x, y, hyps

    def breakeven_equiv(ctx):
        # B > s*R  <=>  1/R > s/B
        s, R, B, T0, x, y, hyps = setup(ctx)
        return [*hyps, z3.Not((B > s * R) == (y > s * x))], {}

    def never_when_slow(ctx):
        # B <= s*R: no n >= 0 has T_hit(n) < T_rec(n).
        s, R, B, T0, x, y, hyps = setup(ctx)
        n, d = reals(ctx, "n d")
        return [*hyps, d == y - s * x, d <= 0, n >= 0, T0 + n * s * x < n * y], {}

    def threshold_iff(ctx):
        # B > s*R: T_hit(n) < T_rec(n)  <=>  n > n*, where n* * d = T0.
        s, R, B, T0, x, y, hyps = setup(ctx)
        n, d, ns = reals(ctx, "n d ns")
        return [*hyps, d == y - s * x, d > 0, ns * d == T0,
                z3.Not((T0 + n * s * x < n * y) == (n > ns))], {}

    def some_n_wins(ctx):
        # B > s*R: the explicit witness n = n* + 1 wins.
        s, R, B, T0, x, y, hyps = setup(ctx)
        d, ns = reals(ctx, "d ns")
        n = ns + 1
        return [*hyps, d == y - s * x, d > 0, ns * d == T0, z3.Not(z3.And(n > 0, T0 + n * s * x < n * y))], {}

    def threshold_ge_RT0(ctx):
        # n* >= R*T0 (the infinite-bandwidth limit): d = 1/R - s/B <= 1/R.
        s, R, B, T0, x, y, hyps = setup(ctx)
        d, ns = reals(ctx, "d ns")
        return [*hyps, d == y - s * x, d > 0, ns * d == T0, z3.Not(ns >= R * T0)], {}

    def paper_numbers(ctx):
        # s = 48.4 KB/token, R = 52.2k tokens/s, T0 = 0.33 s:
        # B* = s*R in [2.525, 2.535) GB/s; R*T0 in [16.5k, 17.5k) tokens;
        # at the sharded 10.76 GB/s the threshold n* is in [22k, 23k).
        s, R, T0 = _q(PAPER.s, ctx), _q(PAPER.R, ctx), _q(PAPER.T0, ctx)
        ns = z3.Real("ns", ctx)
        d = 1 / R - s / _q(PAPER.B_sharded, ctx)
        goal = z3.And(s * R >= _q("2.525e9", ctx), s * R < _q("2.535e9", ctx),
                      R * T0 >= 16500, R * T0 < 17500, ns >= 22000, ns < 23000)
        return [ns * d == T0, z3.Not(goal)], {}

    def queue_unstable(ctx):
        # rho = lam * bytes / B with x = 1/B: lam = 1.21/s, 0.79 GB per hit, B in [0.78, 0.89] GB/s
        # gives rho > 1 for every B in the measured range.
        x, B = reals(ctx, "x B")
        lam, size = _q(PAPER.lam, ctx), _q(PAPER.bytes_per_hit, ctx)
        lo, hi = PAPER.B_sync
        return [B >= _q(lo, ctx), B <= _q(hi, ctx), x * B == 1,
                z3.Not(lam * size * x > 1)], {}

    def backlog_unbounded(ctx):
        # Fluid lower bound on the backlog of a synchronous (single-server) queue: work arrived by
        # time t minus time elapsed = rho*t - t.  rho > 1: for every M the witness t = (M+1)/(rho-1)
        # gives backlog > M, so no stationary regime exists.
        rho, M, t = reals(ctx, "rho M t")
        return [rho > 1, M >= 0, t * (rho - 1) == M + 1, z3.Not(rho * t - t > M)], {}

    def vacuity(ctx):
        s, R, B, T0, x, y, hyps = setup(ctx)
        d, ns = reals(ctx, "d ns")
        return [*hyps, d == y - s * x, d > 0, ns * d == T0], {}

    return Theorem(
        "T5_cost_model",
        "T_hit = T0 + n s/B, T_rec = n/R: a hit wins for some n iff B > sR, exactly for "
        "n > T0/(1/R - s/B) >= R*T0; paper: B* ~ 2.53 GB/s, R*T0 ~ 17k tokens, rho > 1",
        tuple(Obligation(f"T5.{f.__name__}", f) for f in (
            breakeven_equiv, never_when_slow, threshold_iff, some_n_wins, threshold_ge_RT0,
            paper_numbers, queue_unstable, backlog_unbounded)),
        (Obligation("T5.vacuity", vacuity, expect="sat"),),
    )


T5 = _t5()

THEOREMS: tuple[Theorem, ...] = (T1, T2, T3, T4, T5)
