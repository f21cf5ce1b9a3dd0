"""Hypothesis profiles for the property layers, chosen by `HYPOTHESIS_PROFILE` (default `dev`).

- `dev`: fast, for every local `pytest` run (no explain phase; reports the first bug found, shrunk).
- `ci`: derandomized (a fixed seed per test, see `seed_test`) and with a directory example database kept in
  `.hypothesis/ci-examples`, so a failure found once is replayed first on every later run. Hypothesis's own
  `derandomize=True` switches the database off, which is why the seed is fixed by the plugin instead.
- `nightly`: many examples and longer runs, with every phase (explain too).
"""
from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase

__all__ = ["PROFILES", "DEFAULT_PROFILE", "CI_DATABASE", "register", "chosen", "seed_test"]

PROFILES = ("dev", "ci", "nightly")
DEFAULT_PROFILE = "dev"
CI_DATABASE = Path(".hypothesis") / "ci-examples"


def register(root: Path | str = ".") -> None:
    """Register the three profiles (the ci database lives under `root`)."""
    # parent: Hypothesis's own defaults, not whatever profile is loaded now -- with `CI` set in the environment
    # Hypothesis loads its built-in `ci` profile (derandomize=True, no database), which would leak into ours
    common = dict(parent=settings.get_profile("default"), deadline=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    # the explain phase and shrinking every distinct bug on its own each multiply the time a failure takes
    # (seconds per failing machine); dev reports the first bug, shrunk, without them
    no_explain = tuple(p for p in Phase if p is not Phase.explain)
    settings.register_profile("dev", max_examples=40, stateful_step_count=25, phases=no_explain,
                              report_multiple_bugs=False, **common)
    settings.register_profile("ci", max_examples=100, stateful_step_count=30, print_blob=True, phases=no_explain,
                              database=DirectoryBasedExampleDatabase(str(Path(root) / CI_DATABASE)), **common)
    settings.register_profile("nightly", max_examples=5000, stateful_step_count=60, print_blob=True,
                              phases=tuple(Phase), **common)


def chosen(environ: dict | None = None) -> str:
    """The profile `HYPOTHESIS_PROFILE` names (default `dev`); an unknown name raises `ValueError`."""
    name = (environ if environ is not None else os.environ).get("HYPOTHESIS_PROFILE") or DEFAULT_PROFILE
    if name not in PROFILES:
        raise ValueError(f"HYPOTHESIS_PROFILE={name!r}: expected one of {', '.join(PROFILES)}")
    return name


def seed_test(test_id: str) -> None:
    """Make the next Hypothesis test draw from a seed fixed by `test_id` (how the ci profile derandomizes
    while keeping its database: `@seed` and `derandomize=True` would both switch the database off)."""
    from hypothesis import core

    digest = int.from_bytes(hashlib.sha256(test_id.encode()).digest()[:8], "big")
    core.threadlocal._hypothesis_global_random = random.Random(digest)
