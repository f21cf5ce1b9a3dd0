"""`--runner processes` for an LMCache deployment: one OS process per rank, the scheduler in this one.

`ProcessDeployment` is `LMCacheDeployment` with its ranks in processes of their own (started by a forkserver that
imported torch and LMCache once: `adapters.lmcache_engine.rank_process_main`), as vLLM runs its workers: each process
holds that rank's engine of every deployment and its lookup server; the scheduler's lookup clients, the Valkey
servers and their faults stay here. Each rank's calls go over a pipe (`RankProxy`, one call at a time); the caller
bounds them. On close every rank runs LMCache's own closes in its process, and a process that dies meanwhile (a ZMQ
assertion aborting it) or does not answer is reported; then every rank process is killed and reaped, whatever
happened (also on errors and Ctrl-C: each is registered with `runtime.reaper`, whose `atexit` hook kills any left;
none starts once the exit began).
"""
from __future__ import annotations

import itertools
import multiprocessing
import signal
import threading
from typing import Any

from adapters.lmcache_engine.deployment import LMCacheDeployment
from adapters.lmcache_engine.zmq_paths import rpc_dir
from runtime import reaper

__all__ = ["ProcessDeployment", "RankProxy", "START_SECONDS"]

#: Seconds a rank process may take to build its engines (the forkserver's first start imports torch and LMCache).
START_SECONDS = 60.0
_CTX: Any = None


def _context() -> Any:
    global _CTX
    if _CTX is None:
        _CTX = multiprocessing.get_context("forkserver")
        _CTX.set_forkserver_preload(["adapters.lmcache_engine.rank_process_main"])
    return _CTX


class RankProxy:
    """`RankSide`'s calls on a rank process (see the module docstring)."""

    def __init__(self, rank: int, spec: dict) -> None:
        from adapters.lmcache_engine import rank_process_main

        self.rank = rank
        ctx = _context()
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=rank_process_main.main, args=(child, spec), name=f"shardcheck-rank-{rank}",
                                daemon=True)
        self.proc.start()
        reaper.own_process(self.proc)
        child.close()
        self.lock = threading.Lock()
        self.ids = itertools.count()
        if not self.conn.poll(START_SECONDS):
            raise RuntimeError(f"rank {rank}'s process did not start within {START_SECONDS:g} s")
        state, detail = self.conn.recv()
        if state != "ready":
            raise RuntimeError(f"rank {rank}'s process could not build its engines: {detail}")

    def _call(self, name: str, *args: Any, wait: float | None = None, **kwargs: Any) -> Any:
        with self.lock:
            rid = next(self.ids)
            self.conn.send((rid, name, args, kwargs))
            while True:
                if wait is not None and not self.conn.poll(wait):
                    raise TimeoutError(f"rank {self.rank}'s process did not answer {name} within {wait:g} s")
                try:
                    got, status, value = self.conn.recv()
                except EOFError:
                    raise RuntimeError(f"rank {self.rank}'s process died during {name} ({self._death()})") from None
                if got == rid:
                    break
        if status == "err":
            raise RuntimeError(f"rank {self.rank}: {value}")
        return value

    def _death(self) -> str:
        self.proc.join(1.0)
        code = self.proc.exitcode
        if code is None:
            return "still running"
        return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args, **kwargs: self._call(name, *args, **kwargs)

    def close(self, timeout: float, wake_first: bool = True) -> list[str]:
        """LMCache's own closes in the rank's process; what did not return, or that the process died."""
        try:
            return list(self._call("close", timeout, wait=timeout + 5.0))
        except TimeoutError as exc:
            return [str(exc)]
        except RuntimeError as exc:
            return [f"{exc}: its close ended the process" if "died" in str(exc) else str(exc)]


class ProcessDeployment(LMCacheDeployment):
    """`LMCacheDeployment` with one OS process per rank (see the module docstring)."""

    runner = "processes"

    def _rank_sides(self) -> list[Any]:
        sides: list[Any] = []
        for r in range(self.n_ranks):
            sides.append(RankProxy(r, {"rank": r, "n_ranks": self.n_ranks, "endpoint": self.endpoints[r],
                                       "engine_ids": list(self.engine_ids), "models": list(self.models),
                                       "lookup": self.lookup_mode, "lookup_timeout_ms": self.lookup_timeout_ms,
                                       "adapter_tag": self.adapter_tag, "patches": list(self.patches),
                                       "rpc_dir": rpc_dir()}))
            self._sides_so_far = sides
        return sides

    def _after_close(self) -> None:
        for side in list(getattr(self, "_sides_so_far", [])) + list(self.rank_sides):
            if isinstance(side, RankProxy):
                reaper.kill_process(side.proc)
