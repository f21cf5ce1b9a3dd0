"""The pytest option `--runner sim|processes` and the fixture `shardcheck_run` that honours it.

`shardcheck_run(protocol, case) -> Outcome` is `model.harness.run_case` (the simulator, default) or, with
`--runner processes`, `adapters.processes.ProcessRunner().run` (one OS process per rank, gloo collectives).
Load it from a conftest: `from adapters.pytest_runner import pytest_addoption, shardcheck_run  # noqa: F401`.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

import pytest

__all__ = ["pytest_addoption", "shardcheck_run"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("shardcheck", "shardcheck property layers").addoption(
        "--runner", default="sim", choices=("sim", "processes"),
        help="how shardcheck_run runs a case: sim (one process, simulated collectives; default) or processes "
             "(one OS process per rank, torch.distributed gloo collectives)")


@pytest.fixture
def shardcheck_run(request: pytest.FixtureRequest) -> Iterator[Callable[[Any, Any], Any]]:
    if request.config.getoption("runner") == "sim":
        from model.harness import run_case
        yield run_case
        return
    from adapters.processes import ProcessRunner
    with ProcessRunner() as runner:
        yield runner.run
