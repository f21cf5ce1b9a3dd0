"""Z3 proofs of the sharded KV-cache protocol (T1..T5) and refutations of flawed variants.

`run_all(seeds=10)` returns one row per theorem, the `shardcheck prove --json` shape:
`{"theorem", "expected", "result", "seconds", "rlimit", "seeds", "vacuity"}`; `format_table(rows)`
renders them.  Every proof is split into quantifier-free obligations (see `proofs.theorems`),
checked in a fresh Z3 context per seed under a fixed `rlimit`, never a wall-clock timeout.
"""
from __future__ import annotations

from typing import Any

from .runner import TheoremReport, format_table, run_reports

__all__ = ["run_all", "run_reports_all", "format_table", "all_theorems"]


def all_theorems() -> tuple:
    """T1..T5 followed by the flawed variants (expected: counterexample)."""
    from .flawed import FLAWED
    from .theorems import THEOREMS
    return (*THEOREMS, *FLAWED)


def run_reports_all(*, seeds: int = 10) -> list[TheoremReport]:
    """Full reports (per-seed checks, counterexample configurations) for every theorem."""
    return run_reports(all_theorems(), seeds=seeds)


def run_all(*, seeds: int = 10) -> list[dict[str, Any]]:
    """Run every theorem on `seeds` solver seeds; one `prove --json` row per theorem."""
    return [r.row() for r in run_reports_all(seeds=seeds)]
