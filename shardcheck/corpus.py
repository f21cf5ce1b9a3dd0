"""The curated counterexample corpus: shrunk counterexamples of every demo variant, regenerated
deterministically. `python -m shardcheck.corpus --check` fails when a saved file drifts from what the
model produces now; `--update` rewrites them."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from model.search import minimise, search
from model.trace import Trace
from model.variants import DEMO_VARIANTS

CORPUS = Path(__file__).resolve().parents[1] / "counterexamples"
#: A protocol bug reproduces on the in-memory model whatever the client; on the real clients the
#: expectation is measured (`--update` replays there): a stock client's own bug (a GET of a missing key
#: that hangs, a dropped put) can mask the protocol's, and the expectation records that honestly.
PROTOCOL_BUG_EXPECT = {"model": "reproduces", "lmcache": "reproduces", "lmcache-patched": "reproduces"}
REAL_CLIENTS = ("lmcache", "lmcache-patched")
SEARCH_CASES = 200_000


def demo_traces() -> dict[str, Trace]:
    """File name -> the shrunk counterexample of each demo variant, leading with its intended property."""
    out = {}
    for variant, prop in DEMO_VARIANTS.items():
        protocol = variant()
        budget = iter(range(SEARCH_CASES))
        found = search(protocol, should_stop=lambda: next(budget, None) is None)
        if found is None:
            raise RuntimeError(f"{variant.__name__}: no violation in {SEARCH_CASES} cases")
        small = minimise(protocol, found)
        small.outcome.violations.sort(key=lambda v: v.property != prop)
        if small.outcome.violations[0].property != prop:
            raise RuntimeError(f"{variant.__name__}: shrunk counterexample violates "
                               f"{small.outcome.violated()}, not {prop}")
        ref = f"{variant.__module__}:{variant.__name__}"
        trace = Trace.from_outcome(small.outcome, protocol_ref=ref, origin=f"demo-variant:{small.engine}",
                                   expect=PROTOCOL_BUG_EXPECT)
        trace.summary = _paragraph(variant, small)
        out[f"demo-{protocol.name}.json"] = trace
    return out


def _paragraph(variant: type, found) -> str:
    """A one-paragraph human summary: the bug, the smallest configuration, what went wrong."""
    doc = " ".join((variant.__doc__ or variant.__name__).split())
    case, v = found.case, found.outcome.violations[0]
    faults = describe_faults(case.faults)
    return (f"{doc} Smallest case found (by {found.engine}, then shrunk): {case.n_ranks} rank(s), "
            f"{case.n_chunks} chunk(s), {faults}. Outcome: {v.property}: {v.summary}.")


def describe_faults(plan) -> str:
    """The fault plan in words."""
    parts = [f"chunk {e.chunk} evicted before lookup" for e in plan.evict_before_lookup]
    parts += [f"chunk {e.chunk} evicted between lookup and load" for e in plan.evict_after_lookup]
    parts += [f"chunk {e.chunk} evicted before load step {e.step}" for e in plan.evict_during_load]
    parts += [f"rank {r}'s GetAsync #{i} completion lost" for r, i in plan.lost]
    parts += [f"rank {r}'s GetAsync #{i} completion delayed {d:g} s" for r, i, d in plan.delayed]
    return "; ".join(parts) if parts else "no fault"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m shardcheck.corpus", description=__doc__.splitlines()[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--check", action="store_true", help="exit 1 when a saved file differs")
    g.add_argument("--update", action="store_true", help="rewrite the demo-variant files")
    args = p.parse_args(argv)
    drift = []
    written = []
    for name, trace in demo_traces().items():
        path = CORPUS / name
        if args.update:
            trace.save(path, overwrite=True)
            written.append(path)
        elif not path.exists() or _without_real(Trace.load(path)) != _without_real(trace):
            drift.append(name)
    if args.update:
        measure_real_expectations(written)
    if drift:
        print(f"counterexample corpus drifted: {', '.join(drift)}; regenerate with "
              "`python -m shardcheck.corpus --update` and review the diff", file=sys.stderr)
        return 1
    return 0


def _without_real(trace: Trace) -> dict:
    """The trace as JSON less the measured real-client expectations (CI checks those by replaying)."""
    data = trace.to_json()
    data["expect"] = {k: v for k, v in data["expect"].items() if k not in REAL_CLIENTS}
    return data


def measure_real_expectations(paths: list[Path]) -> None:
    """Replay `paths` on every real client (real Valkey servers) and record each outcome as its expectation."""
    from shardcheck.commands import run_replay
    for client in REAL_CLIENTS:
        _, rows = run_replay([str(p) for p in paths], client)
        for row in rows:
            if row["outcome"] == "error":
                raise RuntimeError(f"{row['path']} on {client}: {row['why']}")
            trace = Trace.load(row["path"])
            trace.expect[client] = row["outcome"]
            trace.save(row["path"], overwrite=True)
            print(f"{row['path']}: {client} {row['outcome']} ({row['why']})")


if __name__ == "__main__":
    sys.exit(main())
