"""The pytest side of the composition root: hands the pytest plugin (`properties.plugin`) the names its `--client`,
`--engine` and `--nemesis` resolve in, `adapters.catalogue.CATALOGUE`, through the plugin's hook
`pytest_shardcheck_catalogue` (the plugin, a layer below the adapters, cannot import them).

Registered by its `pytest11` entry point of the same name, by `-p shardcheck.pytest_catalogue` in the repository's
pytest options (`pyproject.toml`), and by `shardcheck campaign`.
"""
from __future__ import annotations

from typing import Any

import pytest

__all__ = ["pytest_shardcheck_catalogue"]


@pytest.hookimpl(optionalhook=True)
def pytest_shardcheck_catalogue() -> Any:
    from shardcheck.tables import CATALOGUE
    return CATALOGUE
