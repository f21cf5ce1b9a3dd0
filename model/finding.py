"""The one finding type: what any engine found, with the trace that replays it and how often it showed.

Every engine of `check` returns a `Finding` or None. A finding carries its violations (the first is what it is
about), the `Trace` that replays it (any kind: `protocol`, `store-ops`, `concurrent`, `engine`), the engine that
found it, and, once measured, its `Rate`: k of n runs on fresh stores showed it. A protocol finding also carries
its `Case` and `Outcome`, which the case minimiser works on.
"""
from __future__ import annotations

import math
from typing import Any

import attrs

from model.outcome import Case, Outcome, Violation
from model.trace import Trace
from model.trace_validate import rate_problem

__all__ = ["CONFIDENCE", "RATE_DRIFT", "Rate", "Finding", "lower_bound", "runs_within"]

#: The confidence of every statistical verdict (a racy finding's replay, its minimisation).
CONFIDENCE = 0.99

#: How far a racy rate may fall between the runs that measured it and a later replay: runs are not independent of
#: the machine's load (a stale-cache race measured at 13 of 20 showed in none of 10 fresh runs in 21 of 200 replays
#: on a loaded 2-core machine, and its runs until the first showing reached 43 under three busy processes). A
#: replay says `fixed` only after the runs that would show a bug at a quarter of its rate's lower bound.
RATE_DRIFT = 4


@attrs.frozen
class Rate:
    """How often a finding showed: `k` of `n` runs. `deterministic`: the run cannot differ from one time to the next
    (the simulator over in-memory stores), so one run is the verdict."""

    k: int
    n: int
    deterministic: bool = False

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
        return f"{self.k} of {self.n} runs"

    def to_json(self) -> dict:
        return {"k": self.k, "n": self.n, **({"deterministic": True} if self.deterministic else {})}

    @classmethod
    def from_json(cls, data: Any) -> "Rate":
        """The rate of a trace's `config.rate`; `ValueError` naming what is wrong."""
        problem = rate_problem(data)
        if problem is not None:
            raise ValueError(f"{problem[0].lstrip('.') or 'rate'}: {problem[1]}")
        return cls(data["k"], data["n"], data.get("deterministic", False))


@attrs.define
class Finding:
    """The first violation an engine found (see the module doc)."""

    engine: str
    violations: list[Violation]
    trace: Trace
    case: Case | None = None
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
