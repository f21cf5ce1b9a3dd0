"""Hypothesis profiles for the property layers, chosen by `HYPOTHESIS_PROFILE` (default `dev`).

- `dev`: fast, for every local `pytest` run (no explain phase; reports the first bug found, shrunk).
- `ci`: derandomized (Hypothesis's own `derandomize=True`: the same examples every run, no database).
- `nightly`: many examples and longer runs, with every phase (explain too).

`dev` and `nightly` keep an example database: the local directory one, or, with `SHARDCHECK_EXAMPLE_DB` set to a
`redis://` or `valkey://` URL, Hypothesis's own Redis-protocol database on that server, so every worker and machine of a
campaign replays what any of them found (`shardcheck campaign`; pytest-xdist workers share it too).
"""
from __future__ import annotations

import os
from pathlib import Path

from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

__all__ = ["PROFILES", "DEFAULT_PROFILE", "EXAMPLE_DB_ENV", "register", "chosen", "example_database"]

PROFILES = ("dev", "ci", "nightly")
DEFAULT_PROFILE = "dev"
#: The environment variable naming a shared example database (`redis://HOST:PORT` or `valkey://HOST:PORT`).
EXAMPLE_DB_ENV = "SHARDCHECK_EXAMPLE_DB"


def example_database(root: Path | str = ".", environ: dict | None = None) -> ExampleDatabase:
    """The shared Redis-protocol database `SHARDCHECK_EXAMPLE_DB` names, else the directory one under `root`."""
    url = (environ if environ is not None else os.environ).get(EXAMPLE_DB_ENV)
    if not url:
        return DirectoryBasedExampleDatabase(str(Path(root) / ".hypothesis" / "examples"))
    import redis
    from hypothesis.extra.redis import RedisExampleDatabase
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("redis", "valkey"):
        raise ValueError(f"{EXAMPLE_DB_ENV}={url!r}: expected redis://HOST:PORT or valkey://HOST:PORT")
    return RedisExampleDatabase(redis.Redis.from_url(f"redis://{rest}"), key_prefix=b"shardcheck-examples")


def register(root: Path | str = ".") -> None:
    """Register the three profiles (the local example database lives under `root`)."""
    # parent: Hypothesis's own defaults, not whatever profile is loaded now -- with `CI` set in the environment
    # Hypothesis loads its built-in `ci` profile, which would leak into ours
    common = dict(parent=settings.get_profile("default"), deadline=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    # the explain phase and shrinking every distinct bug on its own each multiply the time a failure takes
    # (seconds per failing machine); dev reports the first bug, shrunk, without them
    no_explain = tuple(p for p in Phase if p is not Phase.explain)
    database = example_database(root)
    settings.register_profile("dev", max_examples=40, stateful_step_count=25, phases=no_explain,
                              report_multiple_bugs=False, database=database, **common)
    settings.register_profile("ci", max_examples=100, stateful_step_count=30, print_blob=True, phases=no_explain,
                              derandomize=True, **common)
    settings.register_profile("nightly", max_examples=5000, stateful_step_count=60, print_blob=True,
                              phases=tuple(Phase), database=database, **common)


def chosen(environ: dict | None = None) -> str:
    """The profile `HYPOTHESIS_PROFILE` names (default `dev`); an unknown name raises `ValueError`."""
    name = (environ if environ is not None else os.environ).get("HYPOTHESIS_PROFILE") or DEFAULT_PROFILE
    if name not in PROFILES:
        raise ValueError(f"HYPOTHESIS_PROFILE={name!r}: expected one of {', '.join(PROFILES)}")
    return name
