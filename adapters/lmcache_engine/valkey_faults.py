"""Faults on the Valkey servers of an engine deployment: pause, resume, kill, restart (empty).

The smallest thing the engine steps need, against `adapters.valkey_servers.ValkeyServer` (its `proc`, `port`):
pause is SIGSTOP, resume SIGCONT, kill stops the server (its data is gone), restart starts it again on the same
port, empty (the servers keep no data on disk). `resume_all` resumes every paused server; the deployment calls it
in a `finally` on every exit path, so a paused server never outlives a case.
"""
from __future__ import annotations

import contextlib
import os
import signal
from typing import Sequence

__all__ = ["ServerFaults"]


class ServerFaults:
    """The fault state of a deployment's servers (index = rank)."""

    def __init__(self, servers: Sequence[object]) -> None:
        self.servers = list(servers)
        self.paused: set[int] = set()
        self.down: set[int] = set()

    def apply(self, rank: int, action: str) -> None:
        """`pause`, `resume`, `kill` or `restart` rank `rank`'s server (a restart of a paused server resumes it
        first; of a running one stops it first)."""
        server = self.servers[rank]
        if action == "pause":
            if rank not in self.down and rank not in self.paused and server.proc is not None:  # type: ignore[attr-defined]
                os.kill(server.proc.pid, signal.SIGSTOP)  # type: ignore[attr-defined]
                self.paused.add(rank)
        elif action == "resume":
            self._resume(rank)
        elif action == "kill":
            self._resume(rank)
            server.stop()  # type: ignore[attr-defined]
            self.down.add(rank)
        elif action == "restart":
            self._resume(rank)
            server.stop()  # type: ignore[attr-defined]
            server.start()  # type: ignore[attr-defined]  # (the same port: the engine reconnects to it)
            self.down.discard(rank)
        else:
            raise ValueError(f"unknown server fault {action!r}")

    def _resume(self, rank: int) -> None:
        if rank in self.paused:
            self.paused.discard(rank)
            proc = self.servers[rank].proc  # type: ignore[attr-defined]
            if proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)

    def resume_all(self) -> None:
        for rank in sorted(self.paused):
            self._resume(rank)

    def reachable(self, rank: int) -> bool:
        return rank not in self.paused and rank not in self.down
