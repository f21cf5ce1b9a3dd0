"""`shardcheck campaign`: a Hypothesis campaign across processes (pytest-xdist) and machines, sharing one example
database on a Valkey server, so a counterexample found by any worker is replayed first by every other.

    shardcheck campaign [--url redis://HOST:PORT] [--workers N] [--profile nightly] [-- PYTEST-ARGS...]

Without `--url` an embedded Valkey server is started on a free 127.0.0.1 port and stopped at the end (its database
then lasts for this campaign); with `--url`, every machine pointing at the same server shares the database. The
exit status is pytest's.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from shardcheck.errors import UsageError

__all__ = ["add_arguments", "cmd_campaign"]

ROOT = Path(__file__).resolve().parents[1]


def add_arguments(p: Any) -> None:
    p.add_argument("--url", default=None, help="the shared Valkey/Redis server (redis://HOST:PORT); default: an "
                   "embedded server started for this campaign")
    p.add_argument("--workers", default="auto", help="pytest-xdist workers on this machine (default: auto)")
    p.add_argument("--profile", default="nightly", choices=("dev", "ci", "nightly"),
                   help="the Hypothesis profile (default: nightly)")
    p.add_argument("pytest_args", nargs="*", metavar="PYTEST-ARGS",
                   help="passed to pytest after `--`, e.g. --protocol mymod:P --client lmcache (default: none)")


def cmd_campaign(args: Any) -> int:
    from adapters.valkey_servers import start_servers
    servers = None
    url = args.url
    if url is None:
        servers = start_servers(1)
        url = f"redis://127.0.0.1:{servers.ports[0]}"
    try:
        _reachable(url)
        env = {**os.environ, "SHARDCHECK_EXAMPLE_DB": url, "HYPOTHESIS_PROFILE": args.profile}
        cmd = [sys.executable, "-m", "pytest", str(ROOT / "properties"), "-n", str(args.workers), "-p",
               "no:cacheprovider", "-p", "shardcheck.pytest_catalogue", *args.pytest_args]
        print(f"shardcheck campaign: {' '.join(cmd[2:])} with the example database on {url}", file=sys.stderr,
              flush=True)
        return subprocess.call(cmd, env=env)
    finally:
        if servers is not None:
            servers.stop()


def _reachable(url: str) -> None:
    """`UsageError` unless a Redis-protocol server answers PING at `url` within 2 s."""
    import redis
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("redis", "valkey"):
        raise UsageError(f"--url {url!r}: expected redis://HOST:PORT or valkey://HOST:PORT")
    try:
        redis.Redis.from_url(f"redis://{rest}", socket_timeout=2, socket_connect_timeout=2).ping()
    except (redis.RedisError, OSError, ValueError) as exc:
        raise UsageError(f"--url {url}: no server answers there ({type(exc).__name__}: {exc})") from None
