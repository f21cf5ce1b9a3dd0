"""What the tests share: the repository root, the command line in a subprocess (`run_cli`), the real Valkey
server fixtures (`shardcheck_servers`, `shardcheck_server_factory`), and the `--runner sim|processes` option with
its `shardcheck_run` fixture (`adapters.pytest_runner`), `default_signals` for the children a test sends Ctrl-C or
a hang-up to; a test the machine starved is skipped as undecided (`adapters.pytest_runner.pytest_runtest_call`)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from adapters.pytest_fixtures import shardcheck_server_factory, shardcheck_servers  # noqa: F401  (fixtures)
from adapters.pytest_runner import pytest_addoption, pytest_runtest_call, shardcheck_run  # noqa: F401  (option, hook, fixture)

ROOT = Path(__file__).resolve().parents[1]

# Tests that import vLLM in this process make torch's Inductor cache dir, by default /tmp/torchinductor_USER, left
# behind: it is a temp dir of this process instead, removed at its exit.
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    from runtime import reaper
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = reaper.temp_dir("shardcheck-inductor-")


def default_signals() -> None:
    """`preexec_fn` of a child a test sends SIGINT or SIGHUP to: their default actions, whatever the test run
    inherited (started in the background of a shell without job control, or under nohup, it ignores both, and so
    would the child)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def run_cli(*args: str, cwd: Path | None = None, env_extra: list[str] | None = None, timeout: float = 120,
            profile: str | None = None) -> subprocess.CompletedProcess:
    """`python -m shardcheck ARGS` from the repository root (or `cwd`), bounded by `timeout` seconds; `env_extra`
    directories join PYTHONPATH, `profile` sets HYPOTHESIS_PROFILE."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *(env_extra or [])])}
    if profile:
        env["HYPOTHESIS_PROFILE"] = profile
    return subprocess.run([sys.executable, "-m", "shardcheck", *args], capture_output=True, text=True,
                          cwd=cwd or ROOT, env=env, timeout=timeout)
