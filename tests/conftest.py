"""Test-suite options: `--runner sim|processes` (see `adapters.pytest_runner`)."""
from adapters.pytest_runner import pytest_addoption, shardcheck_run  # noqa: F401
