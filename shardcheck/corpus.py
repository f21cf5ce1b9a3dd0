"""The curated counterexample corpus: shrunk counterexamples of every demo variant, regenerated
deterministically (`shardcheck regen corpus`; `--check` fails when a saved file drifts from what the model
produces now)."""
from __future__ import annotations

from pathlib import Path

from checking.minimise import minimise
from checking.search import search
from model.harness import run_case
from model.trace import Trace
from runtime.registry import corpus_clients, protocol_bug_expect
from model.variants import DEMO_VARIANTS
from shardcheck.tables import CLIENTS

__all__ = ["CORPUS", "REAL_CLIENTS", "SEARCH_CASES", "demo_traces", "without_real", "measure_real_expectations"]

CORPUS = Path(__file__).resolve().parents[1] / "counterexamples"
#: The real clients the corpus records measured expectations on.
REAL_CLIENTS = corpus_clients(CLIENTS, real=True)
SEARCH_CASES = 200_000


def demo_traces() -> dict[str, Trace]:
    """File name -> the shrunk counterexample of each demo variant, leading with its intended property."""
    out = {}
    for variant, prop in DEMO_VARIANTS.items():
        protocol = variant()
        budget = iter(range(SEARCH_CASES))
        run = _showing(prop)
        found = search(protocol, runner=run, should_stop=lambda: next(budget, None) is None)
        if found is None:
            raise RuntimeError(f"{variant.__name__}: no violation of {prop} in {SEARCH_CASES} cases")
        small = minimise(protocol, found.lead_with(prop), runner=run)
        small.outcome.violations.sort(key=lambda v: v.property != prop)
        if small.outcome.violations[0].property != prop:
            raise RuntimeError(f"{variant.__name__}: shrunk counterexample violates "
                               f"{small.outcome.violated()}, not {prop}")
        ref = f"{variant.__module__}:{variant.__name__}"
        trace = Trace.from_outcome(small.outcome, protocol_ref=ref, origin=f"demo-variant:{small.strategy}",
                                   expect=protocol_bug_expect(CLIENTS))
        trace.summary = _paragraph(variant, small)
        out[f"demo-{protocol.name}.json"] = trace
    return out


def _showing(prop: str):
    """`run_case`, where only a run that violates `prop` counts as violated (the demo's own property leads)."""
    def run(protocol, case):
        out = run_case(protocol, case)
        if prop not in out.violated():
            out.violations = []
        return out
    return run


def _paragraph(variant: type, found) -> str:
    """A one-paragraph human summary: the bug, the smallest configuration, what went wrong."""
    doc = " ".join((variant.__doc__ or variant.__name__).split())
    case, v = found.case, found.outcome.violations[0]
    faults = case.faults.text()
    return (f"{doc} Smallest case found (by {found.strategy}, then shrunk): {case.n_ranks} rank(s), "
            f"{case.n_chunks} chunk(s), {faults}. Outcome: {v.property}: {v.summary}.")


def without_real(trace: Trace) -> dict:
    """The trace as JSON less the measured real-client expectations (CI checks those by replaying)."""
    data = trace.to_json()
    data["expect"] = {k: v for k, v in data["expect"].items() if k not in REAL_CLIENTS}
    return data


def measure_real_expectations(paths: list[Path]) -> None:
    """Replay `paths` on every real client (real Valkey servers) and record each outcome as its expectation."""
    from shardcheck.replay_cmd import run_replay
    for client in REAL_CLIENTS:
        rows = run_replay([str(p) for p in paths], client)
        for row in rows:
            if row["outcome"] not in ("reproduces", "fixed"):  # (an error, or undecided: no expectation to record)
                raise RuntimeError(f"{row['path']} on {client}: {row['outcome']}: {row['why']}")
            trace = Trace.load(row["path"])
            trace.expect[client] = row["outcome"]
            trace.save(row["path"], overwrite=True)
            print(f"{row['path']}: {client} {row['outcome']} ({row['why']})")
