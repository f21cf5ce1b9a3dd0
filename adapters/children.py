"""What every child process of shardcheck shares (the rank processes of `adapters.processes`, the tier's
workers): it ends when its parent is gone, and its parent reaps it within a bound, killing it if need be."""
from __future__ import annotations

import os
import threading
import time
from typing import Any, Sequence

from runtime.tie import tie_to_parent

__all__ = ["die_with_parent", "reap"]


def die_with_parent(parent_pid: int, *, every: float = 0.5, exit_code: int = 3) -> None:
    """In a child: the kernel's tie to its parent (`runtime.tie`), and a daemon thread that ends this process
    (`exit_code`) once `parent_pid` is gone (where the kernel offers no tie, or a parent that is not `parent_pid`
    lives on)."""
    tie_to_parent(exit_code)
    def watch() -> None:
        while True:
            time.sleep(every)
            try:
                os.kill(parent_pid, 0)
            except ProcessLookupError:
                os._exit(exit_code)
            except PermissionError:
                pass

    threading.Thread(target=watch, name="shardcheck-die-with-parent", daemon=True).start()


def reap(procs: Sequence[Any], *, seconds: float) -> None:
    """In the parent: join every process within `seconds` in all, then kill and join what is left."""
    deadline = time.monotonic() + seconds
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(2.0)
