"""The one finding type: what any strategy of `check` found, with the trace that replays it and how often it showed.

Every strategy of `check` returns a `Finding` or None. A finding carries its violations (the first is what it is
about), the `Trace` that replays it (any kind: `protocol`, `store-ops`, `concurrent`, `engine`, `stack`), the
strategy that found it, and, once measured, its `Rate`: k of n runs on fresh stores showed it, and the machine's load then. Its
`case` is of its kind's type (`model.cases.CODECS`: read from its trace unless given); a protocol finding also
carries its `Outcome`, which the case minimiser works on.

The statistics of replays live here too: a rate's lower confidence bound (`lower_bound`), the runs within which a
rate shows (`runs_within`), and the rule of a racy replay judged against a control run alternately beside it
(`fisher_lower`, `controlled_outcome`, `control_pairs`; see `controlled_outcome` for the rule and its error).
"""
from __future__ import annotations

import math
import os
from typing import Any

import attrs

from model.outcome import Case, Outcome, Violation
from model.trace import Trace
from model.trace_validate import rate_problem

__all__ = ["CONFIDENCE", "RATE_DRIFT", "Rate", "Finding", "lower_bound", "runs_within", "machine_load", "fisher_lower",
           "control_showings", "controlled_outcome", "control_pairs", "CONTROL_MAX_PAIRS"]

#: The confidence of every statistical verdict (a racy finding's replay, its minimisation).
CONFIDENCE = 0.99

#: How far a racy rate may fall between the runs that measured it and a later replay: runs are not independent of
#: the machine's load (a stale-cache race measured at 13 of 20 showed in none of 10 fresh runs in 21 of 200 replays
#: on a loaded 2-core machine, and its runs until the first showing reached 43 under three busy processes). A
#: replay says `fixed` only after the runs that would show a bug at a quarter of its rate's lower bound. It is a guess
#: about the machine: with a control run beside the candidate (`controlled_outcome`) no verdict depends on it, only
#: the bound on a controlled replay's runs (`control_pairs`).
RATE_DRIFT = 4
#: The most pairs of runs (candidate, control) a controlled replay makes before it says `undecided` (`control_pairs`).
CONTROL_MAX_PAIRS = 500


@attrs.frozen
class Rate:
    """How often a finding showed: `k` of `n` runs. `deterministic`: the run cannot differ from one time to the next
    (the simulator over in-memory stores), so one run is the verdict."""

    k: int
    n: int
    deterministic: bool = False
    #: The machine when it was measured: the 1-minute load average and the cores (`machine_load`); None when not
    #: recorded (traces saved before rates carried it).
    load1: float | None = None
    cores: int | None = None

    @classmethod
    def now(cls, k: int, n: int, deterministic: bool = False) -> "Rate":
        """k of n runs measured just now: with the machine's load (`machine_load`)."""
        load1, cores = machine_load()  # (rounded as its JSON is: the text and the saved trace say the same load)
        return cls(k, n, deterministic, None if load1 is None else round(load1, 2), cores)

    @property
    def racy(self) -> bool:
        """Whether some measured run did not show it."""
        return not self.deterministic and self.k < self.n

    def runs_to_show(self, confidence: float = CONFIDENCE) -> int:
        """Runs within which a bug still at this rate shows at least once, with probability `confidence`, its rate
        taken at the lower confidence bound of k/n (one run when deterministic)."""
        return 1 if self.deterministic else runs_within(lower_bound(self.k, self.n, confidence), confidence)

    def runs_to_clear(self, confidence: float = CONFIDENCE) -> int:
        """Clean runs after which a replay says `fixed`: had the bug kept a `RATE_DRIFT`th of its rate (of the lower
        bound of k/n, with `confidence`), one of them would have shown it, with probability `confidence`."""
        if self.deterministic:
            return 1
        return runs_within(lower_bound(self.k, self.n, confidence) / RATE_DRIFT, confidence)

    def text(self) -> str:
        if self.deterministic:
            return "deterministic"
        return f"{self.k} of {self.n} runs{self.at_load()}"

    def at_load(self) -> str:
        """" at load L on C cores" (when measured), or ""."""
        return load_text(self.load1, self.cores, " at ")

    def to_json(self) -> dict:
        load = {} if self.load1 is None else {"load1": round(self.load1, 2)}
        cores = {} if self.cores is None else {"cores": self.cores}
        return {"k": self.k, "n": self.n, **({"deterministic": True} if self.deterministic else {}), **load, **cores}

    @classmethod
    def from_json(cls, data: Any) -> "Rate":
        """The rate of a trace's `config.rate`; `ValueError` naming what is wrong."""
        problem = rate_problem(data)
        if problem is not None:
            raise ValueError(f"{problem[0].lstrip('.') or 'rate'}: {problem[1]}")
        return cls(data["k"], data["n"], data.get("deterministic", False), data.get("load1"), data.get("cores"))


@attrs.define
class Finding:
    """The first violation a strategy found (see the module doc)."""

    strategy: str
    violations: list[Violation]
    trace: Trace
    #: The case it was found with (a protocol case, with its `outcome`); None: its trace's (`case`).
    _case: Any = attrs.field(default=None, alias="case")
    outcome: Outcome | None = None
    rate: Rate | None = None
    #: What happened to it since it was found (minimised, confirmed...), in words.
    notes: list[str] = attrs.field(factory=list)
    #: The engine built it 1-minimal (a retention finding: the put, the age, the read); the minimiser leaves it.
    minimal: bool = False

    def __attrs_post_init__(self) -> None:
        if not self.violations:
            raise ValueError("a finding has at least one violation")


    def measured(self, rate: Rate) -> "Finding":
        """This finding with its measured rate, written into its trace (`config.rate`)."""
        self.rate = rate
        self.trace.config["rate"] = rate.to_json()
        return self

    def with_case(self, case: Case, outcome: Outcome) -> "Finding":
        """The same finding for another case of it (a smaller one): its trace rebuilt from the new outcome, with the
        old trace's protocol, client, origin, expectations and notes."""
        old = self.trace
        trace = Trace.from_outcome(outcome, protocol_ref=old.protocol.get("ref"), client=old.client,
                                   origin=old.origin, expect=old.expect)
        trace.notes = old.notes
        return attrs.evolve(self, violations=list(outcome.violations), trace=trace, case=case, outcome=outcome,
                            notes=list(self.notes))

    def lead_with(self, prop: str) -> "Finding":
        """Put the violation of `prop` first (it names the finding and its trace)."""
        self.violations.sort(key=lambda v: v.property != prop)
        return self

    @property
    def case(self) -> Any:
        """The case that shows it, of its kind's type (`model.cases.CODECS`): the one it was found or minimised with
        when one was given, else its trace's (`Trace.case()`, so always the trace's own after a minimiser replaced
        the trace)."""
        return self._case if self._case is not None else self.trace.case()

    @property
    def summary(self) -> str:
        return self.violations[0].summary

    @property
    def property(self) -> str:  # (last: below it, the name `property` is this attribute)
        return self.violations[0].property


def lower_bound(k: int, n: int, confidence: float) -> float:
    """The one-sided lower `confidence` bound on a rate of which `k` of `n` runs were seen (Clopper-Pearson):
    the least p with P(X >= k | n, p) >= 1 - confidence. Bisection on the binomial tail; exact for k == n."""
    if k <= 0:
        return 0.0
    if k == n:
        return (1 - confidence) ** (1 / n)
    lo, hi = 0.0, k / n
    for _ in range(60):
        mid = (lo + hi) / 2
        if _tail(k, n, mid) >= 1 - confidence:
            hi = mid
        else:
            lo = mid
    return lo


def _tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k, n + 1))


def runs_within(p: float, confidence: float = CONFIDENCE) -> int:
    """Runs within which an event of probability `p` per run happens at least once with probability `confidence`."""
    if p >= 1.0:
        return 1
    if p <= 0.0:
        raise ValueError("an event of probability 0 never shows")
    return max(1, math.ceil(math.log(1 - confidence) / math.log(1 - p)))


def machine_load() -> tuple[float | None, int | None]:
    """(the 1-minute load average, the cores) of this machine now; None for what it cannot tell."""
    try:
        load1: float | None = os.getloadavg()[0]
    except (OSError, AttributeError):
        load1 = None
    return load1, os.cpu_count()


def load_text(load1: float | None, cores: int | None, lead: str = "") -> str:
    """"load L on C cores" after `lead`, or "" when the load is unknown."""
    if load1 is None:
        return ""
    return f"{lead}load {load1:.1f}" + (f" on {cores} cores" if cores else "")


# -- a racy replay against a control ----------------------------------------------------------------------------------
def fisher_lower(k1: int, n1: int, k2: int, n2: int) -> float:
    """Fisher's exact test, one-sided: the p-value that arm 1's rate (k1 of n1) is lower than arm 2's (k2 of n2).
    With the margins fixed, the count of arm 1 among the k1 + k2 runs that showed it is hypergeometric; p is
    P(X <= k1), summed exactly in integers (`math.comb`) and divided once."""
    if not (0 <= k1 <= n1 and 0 <= k2 <= n2):
        raise ValueError(f"expected 0 <= k <= n, got {k1}/{n1} and {k2}/{n2}")
    total, shown = n1 + n2, k1 + k2
    lo = max(0, n1 - (total - shown))
    tail = sum(math.comb(shown, x) * math.comb(total - shown, n1 - x) for x in range(lo, k1 + 1))
    return tail / math.comb(total, n1)


def control_showings(confidence: float = CONFIDENCE) -> int:
    """The control's showings (with the candidate clean) before a controlled replay may say `fixed`: the fewest m
    with 2**-m <= 1 - confidence (7 at 99%). See `controlled_outcome`."""
    return math.ceil(math.log2(1 / (1 - confidence)) - 1e-12)


def controlled_outcome(candidate: tuple[int, int], control: tuple[int, int], max_pairs: int,
                       confidence: float = CONFIDENCE) -> str | None:
    """The verdict of a replay that ran the candidate and the recorded subject (the control) alternately, once per
    pair, after the pairs so far: (k, n) of each arm. `reproduces`, `fixed`, `undecided`, or None (run another pair).

    - `reproduces` as soon as the candidate showed the property once: a counterexample on the candidate is a fact,
      whatever the control did (shown on the candidate while the control never showed it is still `reproduces`; a
      candidate whose rate is merely lower than the control's is a race made rarer, not gone).
    - `fixed` when the candidate is clean, its 0 of n is lower than the control's k of n by Fisher's one-sided exact
      test at `confidence` (`fisher_lower`), and the control showed it at least `control_showings` times (7).
    - `undecided` once `max_pairs` pairs were made without either (the control showed it too rarely to tell).

    The error of looking after every pair: `fixed` is said only when the first m = 7 runs that showed the property,
    in either arm, were all the control's. Were the candidate no better than the control (its rate at least the
    control's within each pair: the two run alternately, so the machine's load lowers both alike), each run that
    showed it in a pair where only one arm did is the control's with probability at most 1/2, independently, so
    that happens with probability at most 2**-7 < 1%, however many looks are made (the runs of the candidate that
    showed it in the same pair as the control would have ended the replay as `reproduces`). Fisher's p is then at
    most 2**-k as well (each factor of C(n,k)/C(2n,k) is at most 1/2): the floor of 7 is the binding condition,
    the test is what the verdict reports. `max_pairs` only trades `undecided` for runs; it is fixed before the
    first run (`control_pairs`)."""
    kc, nc = candidate
    kk, nk = control
    if kc:
        return "reproduces"
    if kk >= control_showings(confidence) and fisher_lower(kc, nc, kk, nk) <= 1 - confidence:
        return "fixed"
    if min(nc, nk) >= max_pairs:
        return "undecided"
    return None


def control_pairs(rate: Rate, confidence: float = CONFIDENCE, cap: int = CONTROL_MAX_PAIRS) -> int:
    """The bound, fixed before the first run, on the pairs a controlled replay of a trace with `rate` makes: the
    fewest within which a control at a `RATE_DRIFT`th of the lower `confidence` bound of its rate (the machine's load
    lowers a race's rate) still shows `control_showings` times with probability `confidence` (at most `cap`). The
    bound only trades `undecided` for runs: a guess about the machine here makes no verdict false."""
    need = control_showings(confidence)
    p = lower_bound(rate.k, rate.n, confidence) / RATE_DRIFT
    if p <= 0.0:
        return cap
    for pairs in range(need, cap):
        if _tail(need, pairs, p) >= confidence:
            return pairs
    return cap
