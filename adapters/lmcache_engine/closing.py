"""Closing an LMCache deployment so that nothing is left running, whatever LMCache's own closes do.

`close_all(jobs, timeout)` runs every close on its own daemon thread at once and reports what did not return in
`timeout` or raised (the `engine-returns` property judges that). Two things make it safe and quick:

- `wake(path, message)`: LMCache's async lookup client and servers, and the sync servers, park a thread in a
  blocking ZMQ receive; their `close()` waits up to a second for it and then closes the socket under it, which
  can abort the process (a ZMQ assertion, `signaler.cpp`). Before LMCache's own close, the harness clears the
  object's `running` flag and sends one harmless message to that socket, so the thread returns and exits first.
- `unstick(engine)`: stock `RESPConnector.close` awaits `AsyncPQExecutor.shutdown`, a *sync* method that blocks
  the storage manager's event loop thread waiting for a coroutine scheduled on that same loop: the engine's close
  never returns and the loop thread never ends. After the bound has passed (the violation is recorded), the
  harness completes that future from outside, so the loop thread finishes its close and exits instead of holding
  the rank's memory for the rest of the run.
"""
from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any, Callable

from model.timing import had, over_text, wait_judged

__all__ = ["close_all", "wake", "unstick", "quiet_loop", "WAKE_ID"]

#: The lookup id of the messages that wake a parked receive (never a request id of a case).
WAKE_ID = "__shardcheck_wake__"


def close_all(jobs: list[tuple[str, Callable[[], Any]]], timeout: float) -> list[str]:
    """Run every job on its own daemon thread at once; what has not returned within the allowance of `timeout`, or
    raised."""
    errors: list[str] = []
    threads = []
    for what, fn in jobs:
        def run(fn: Callable[[], Any] = fn, what: str = what) -> None:
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - reported as the close's outcome
                errors.append(f"{what} raised {type(exc).__name__}: {exc}")
        t = threading.Thread(target=run, name="shardcheck-engine-close", daemon=True)
        t.start()
        threads.append((what, t))
    t0 = time.monotonic()
    for what, t in threads:  # (judged as every timing is: `model.timing`)
        waited = wait_judged(lambda s, t=t: (t.join(s), not t.is_alive())[1], timeout, what, t0=t0)
        if waited is not None:
            errors.append(f"{what} did not return within {over_text(timeout, waited, waited - had(t0, t0 + waited))}")
    return errors


def wake(path: str, frames: list[bytes], kind: int) -> None:
    """Send `frames` to the ZMQ socket bound at ipc `path` from a socket of a private context (`kind`: zmq.PUSH or
    zmq.DEALER), waiting at most 0.2 s for delivery."""
    import zmq

    ctx = zmq.Context()
    try:
        sock = ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 200)
        sock.setsockopt(zmq.SNDTIMEO, 200)
        sock.connect(f"ipc://{path}")
        try:
            sock.send_multipart(frames)
        except zmq.ZMQError:
            pass
        sock.close()
    finally:
        ctx.term()


def unstick(engine: Any) -> bool:
    """Complete the future stock `AsyncPQExecutor.shutdown` blocks the engine's loop thread on (see the module
    docstring); True when one was found."""
    sm = getattr(engine, "storage_manager", None)
    thread = getattr(sm, "thread", None)
    if thread is None or not thread.is_alive():
        return False
    frame = sys._current_frames().get(thread.ident)  # type: ignore[arg-type]
    while frame is not None:
        if frame.f_code.co_name == "shutdown" and type(frame.f_locals.get("self")).__name__ == "AsyncPQExecutor":
            future = frame.f_locals.get("future")
            if future is not None and not future.done():
                # its waiter returns None; `await None` then raises a TypeError that RemoteBackend.close catches, and
                # the close goes on and stops the loop. (Cancelling would raise CancelledError, which it does not.)
                _UNSTUCK.add(id(future))
                future.set_result(None)
                return True
        frame = frame.f_back
    return False


_UNSTUCK: set[int] = set()


class _UnstuckFutureFilter(logging.Filter):
    """`concurrent.futures` logs a future it cannot mark running; for a future `unstick` completed, that is expected."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not (msg.startswith("Future ") and "in unexpected state" in msg
                    and any(f"Future {i} " in msg for i in _UNSTUCK))


logging.getLogger("concurrent.futures").addFilter(_UnstuckFutureFilter())


def quiet_loop(loop: Any) -> None:
    """While a rank closes, its event loop drops three reports that say nothing about the engine under test: the tasks
    still pending when LMCache stops the loop ('Task was destroyed but it is pending!'), a prefetch answering after its
    lookup server's socket closed (a `ZMQError` never retrieved), and, after `unstick`, the shutdown coroutine's late
    result that asyncio cannot copy into the future `unstick` completed ('Future in unexpected state'). Every other
    report goes to the default handler."""
    def handler(loop: Any, context: dict) -> None:
        exc = context.get("exception")
        if isinstance(exc, RuntimeError) and "unexpected state" in str(exc):
            return
        if str(context.get("message", "")).startswith("Task was destroyed but it is pending"):
            return
        if type(exc).__name__ == "ZMQError" and "Task exception was never retrieved" in str(context.get("message")):
            return  # (a prefetch that answers after its lookup server's socket closed)
        loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
