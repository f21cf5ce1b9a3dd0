"""Turn each flawed variant's Z3 model into a replayable Trace: ``counterexamples/z3-<variant>.json``.

The Z3 configuration (N ranks, K chunks, cached set) becomes a harness ``Case``: every chunk outside
the cached set is evicted before lookup, so the simulator sees exactly Z3's cached set.  The run of
the demo protocol class from ``model.variants`` then must report the same violation.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from model.faults import Eviction, FaultPlan
from model.harness import Case, Outcome, run_case
from model.store import MEMORY_CLIENT
from model.trace import Trace
from runtime.registry import load_attr

from .flawed import FLAWED, KMAX, NMAX, VARIANTS
from .runner import TheoremReport, run_theorem

__all__ = ["COUNTEREXAMPLE_DIR", "protocol_ref", "protocol_of", "case_of", "replay", "summary_of", "build_trace",
           "z3_traces"]

COUNTEREXAMPLE_DIR = Path(__file__).resolve().parent.parent / "counterexamples"


def protocol_ref(variant: str) -> str:
    return f"model.variants:{VARIANTS[variant][0]}"


def protocol_of(variant: str) -> Any:
    return load_attr(protocol_ref(variant), "protocol")()


def case_of(witness: dict[str, Any]) -> Case:
    """The harness case realising Z3's configuration: evict every chunk outside the cached set."""
    k, cached = witness["n_chunks"], set(witness["cached"])
    evict = tuple(Eviction(c) for c in range(k) if c not in cached)
    return Case(n_ranks=witness["n_ranks"], n_chunks=k, faults=FaultPlan.of(before_lookup=evict))


def replay(witness: dict[str, Any]) -> Outcome:
    """Run the variant's demo protocol on Z3's configuration in the simulator."""
    return run_case(protocol_of(witness["variant"]), case_of(witness))


def summary_of(w: dict[str, Any]) -> str:
    cached = "{" + ", ".join(map(str, w["cached"])) + "}"
    why = " ".join((type(protocol_of(w["variant"])).__doc__ or "").split()).rstrip(".")
    rel = ">" if w["property"] == "soundness" else "<"
    return (f"Z3 counterexample for {w['variant']} ({w['property']}): with N={w['n_ranks']} ranks, "
            f"K={w['n_chunks']} chunks and cached set {cached} the longest cached prefix is {w['lcp']}, but "
            f"the ranks report {w['reports']} and the scheduler plans {w['planned']} {rel} {w['lcp']}: {why}. "
            f"Found by proofs.flawed (bounded search N<={NMAX}, K<={KMAX}, minimised by N+K, N, evictions) and "
            f"replayed in the simulator with the non-cached chunks evicted before lookup.")


def build_trace(report: TheoremReport, expect: dict[str, str]) -> Trace:
    """The Trace of the simulator run on the report's Z3 counterexample, with the expectation `expect` on each client
    (a protocol bug's, `runtime.registry.protocol_bug_expect` of the command line's clients)."""
    w = report.counterexample
    if w is None:
        raise ValueError(f"{report.theorem}: no counterexample to turn into a trace")
    outcome = replay(w)
    trace = Trace.from_outcome(outcome, protocol_ref=protocol_ref(w["variant"]), client=MEMORY_CLIENT,
                               origin=f"z3:proofs.flawed:{report.theorem}", summary=summary_of(w),
                               expect=dict(expect))
    trace.notes = (f"Z3 model: n_ranks={w['n_ranks']} n_chunks={w['n_chunks']} cached={w['cached']} "
                   f"reports={w['reports']} planned={w['planned']} lcp={w['lcp']}")
    return trace


def z3_traces(*, expect: dict[str, str], seeds: int = 1) -> dict[str, Trace]:
    """File name (`z3-<variant>.json`) -> the trace of every flawed variant's Z3 counterexample (`expect`: as
    `build_trace`)."""
    out = {}
    for th in FLAWED:
        report = run_theorem(th, seeds=seeds)
        out[f"z3-{report.counterexample['variant']}.json"] = build_trace(report, expect)
    return out
