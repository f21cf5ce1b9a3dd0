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
#: A protocol bug does not depend on the store client: it reproduces on every known client.
PROTOCOL_BUG_EXPECT = {"model": "reproduces", "lmcache": "reproduces", "lmcache-patched": "reproduces"}
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
    for name, trace in demo_traces().items():
        path = CORPUS / name
        text = trace.dumps()
        if args.update:
            path.write_text(text)
            print(f"wrote {path}")
        elif not path.exists() or path.read_text() != text:
            drift.append(name)
    if drift:
        print(f"counterexample corpus drifted: {', '.join(drift)}; regenerate with "
              "`python -m shardcheck.corpus --update` and review the diff", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
