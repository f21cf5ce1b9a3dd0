"""The pytest option `--runner sim|processes`, the fixture `shardcheck_run` that honours it, and a test the machine
starved skipped as undecided (`pytest_runtest_call`).

`shardcheck_run(protocol, case) -> Outcome` is `model.harness.run_case` (the simulator, default) or, with
`--runner processes`, `adapters.processes.ProcessRunner().run` (one OS process per rank, gloo collectives).
Load it from a conftest: `from adapters.pytest_runner import pytest_addoption, pytest_runtest_call, shardcheck_run`
(or `-p adapters.pytest_runner`).
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

import pytest

from model.timing import HarnessOutcome

__all__ = ["pytest_addoption", "pytest_runtest_call", "shardcheck_run"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("shardcheck", "shardcheck property layers").addoption(
        "--runner", default="sim", choices=("sim", "processes"),
        help="how shardcheck_run runs a case: sim (one process, simulated collectives; default) or processes "
             "(one OS process per rank, torch.distributed gloo collectives)")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """A test the machine starved past its reruns (`model.timing.HarnessOutcome` escaping it) judged nothing: it is
    skipped as undecided, with the reason, never failed (`properties.plugin` does the same for the property tests)."""
    try:
        return (yield)
    except HarnessOutcome as exc:
        pytest.skip(f"undecided: {exc.reason}")


@pytest.fixture
def shardcheck_run(request: pytest.FixtureRequest) -> Iterator[Callable[[Any, Any], Any]]:
    if request.config.getoption("runner") == "sim":
        from model.harness import run_case
        yield run_case
        return
    from adapters.processes import ProcessRunner
    with ProcessRunner() as runner:
        yield runner.run
