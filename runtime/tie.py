"""A child process's tie to the harness that started it: the kernel ends the child when its parent goes
(PR_SET_PDEATHSIG = SIGKILL), whatever the child is doing. A thread that polls for the parent cannot do that while
native code holds the GIL: torch's `FileStore` constructor retries an open in a removed rendezvous directory for
300 s without releasing it (seen after a Ctrl-C: a rank process outlived the harness by five minutes).

A child of a `multiprocessing` forkserver has the forkserver as its parent, and inherits the write end of the pipe
whose end tells the forkserver its harness is gone: while any child holds it, the forkserver never ends, and neither
would the tie. `tie_to_parent()` lets go of it, so the forkserver ends with the harness and the kernel then ends the
child.
"""
from __future__ import annotations

import ctypes
import multiprocessing.process
import os
import signal
import sys

__all__ = ["tie_to_parent"]

_PR_SET_PDEATHSIG = 1


def tie_to_parent(exit_code: int = 3) -> bool:
    """In a child: have the kernel SIGKILL this process when its parent goes (and, started by a forkserver, let the
    forkserver end with the harness). Exits at once (`exit_code`) when the parent is gone already. False where the
    kernel offers no such tie (not Linux): the caller's own watch must do."""
    parent = os.getppid()
    harness = multiprocessing.process.parent_process()
    if harness is not None and harness.pid != parent:  # a forkserver's child: its alive pipe is not ours to hold
        from multiprocessing import forkserver
        server = forkserver._forkserver  # type: ignore[attr-defined]
        fd, server._forkserver_alive_fd = server._forkserver_alive_fd, None
        if fd is not None:
            os.close(fd)
    if not sys.platform.startswith("linux"):
        return False
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # the parent went before the tie was made
        os._exit(exit_code)
    return True
