"""`python -m proofs [--seeds N] [--json]`: print the proof table; exit 0 iff every theorem has its
expected result."""
from __future__ import annotations

import argparse
import json
import sys

from . import format_table, run_all


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m proofs", description=__doc__)
    ap.add_argument("--seeds", type=int, default=10, help="solver seeds per theorem (default 10)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--write-counterexamples", metavar="DIR", nargs="?", const="counterexamples",
                    help="also write the flawed variants' Z3 counterexamples as traces z3-<variant>.json")
    args = ap.parse_args(argv)
    if args.write_counterexamples:
        from .traces import write_counterexamples
        for path in write_counterexamples(args.write_counterexamples):
            print(f"wrote {path}", file=sys.stderr)
    rows = run_all(seeds=args.seeds)
    print(json.dumps(rows, indent=2) if args.json else format_table(rows))
    return 0 if all(r["result"] == r["expected"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
