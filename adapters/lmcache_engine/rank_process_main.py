"""The body of one rank process of `--runner processes` (`adapters.lmcache_engine.process_deployment`).

The process builds its rank's `RankSide` (every deployment's `LMCacheEngine` and lookup server for that rank), after
the `--engine-patch` functions, then serves calls from the parent over a pipe: `(id, method, args, kwargs)` ->
`(id, "ok", result)` or `(id, "err", text)`, until `close` (LMCache's own closes of its servers and engines,
without the harness's wake-ups: a close that aborts the process is seen as the process dying) or the parent's end of
the pipe closes. It exits with `os._exit`: LMCache's threads never keep it alive. Importing this module imports
torch and LMCache (the forkserver preloads it, so each rank process starts in moments).
"""
from __future__ import annotations

import os
from typing import Any

os.environ["LMCACHE_TRACK_USAGE"] = "false"
if not os.environ.get("SHARDCHECK_LMCACHE_LOGS"):
    os.environ.setdefault("LMCACHE_LOG_LEVEL", "ERROR")

import torch  # noqa: E402,F401  (preloaded by the forkserver)
from lmcache.v1 import cache_engine  # noqa: E402,F401

from adapters.lmcache_engine.rank_side import RankSide  # noqa: E402
from runtime.tie import tie_to_parent  # noqa: E402

__all__ = ["main"]


def main(conn: Any, spec: dict) -> None:
    """Build the rank, report `("ready", None)` or `("failed", text)`, then serve calls (see the module docstring)."""
    tie_to_parent()
    from adapters.lmcache_engine.zmq_paths import DIR_ENV
    os.environ[DIR_ENV] = spec.pop("rpc_dir")
    try:
        from runtime.serving import apply_engine_patches
        apply_engine_patches(spec.pop("patches", ()))
        side = RankSide(**spec)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        os._exit(1)
    conn.send(("ready", None))
    while True:
        try:
            rid, name, args, kwargs = conn.recv()
        except (EOFError, OSError):
            break
        try:
            if name == "close":
                kwargs["wake_first"] = False
            result: Any = getattr(side, name)(*args, **kwargs)
            conn.send((rid, "ok", result))
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller
            try:
                conn.send((rid, "err", f"{type(exc).__name__}: {exc}"))
            except (OSError, ValueError):
                break
        if name == "close":
            break
    os._exit(0)
