"""Serving-engine factories whose deployment is never built in time: the harness's set-up, not the engine's calls."""
from __future__ import annotations

import threading
from typing import Any

__all__ = ["never_built"]


def never_built(n_ranks: int, *, lookup: str, models: Any, **options: Any) -> Any:
    """A factory that never returns (a deployment that cannot be built on this machine in time)."""
    threading.Event().wait()
