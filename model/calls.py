"""Bounds on calls: entries into protocol code (`protocol_call`, the one hook through which a watchdog,
`runtime.watchdog`, times protocol calls) and the one default bound on a store call (`DEFAULT_OP_TIMEOUT`,
`wait_future`).

Every engine that calls protocol code (`rank_lookup`, `combine`, one step of a rank program) does it inside
`protocol_call()`. The context counts entries in `STEPS`; a watchdog that sees the count stand still while a
contract method stays on the stack raises `Stalled` inside that call. A protocol that catches the `Stalled` and
returns normally has stalled all the same: leaving the context re-raises it (`note_raised` records it).
An engine that forgets the context loses stall detection, so there is no other way to enter protocol code.
"""
from __future__ import annotations

import concurrent.futures
import time
from types import TracebackType
from typing import Any

from model.contract import StoreCallTimeout
from model.timing import had, over_text, starved_error, wait_judged

__all__ = ["STEPS", "Stalled", "protocol_call", "note_raised", "swallowed", "ProtocolRaised", "DEFAULT_OP_TIMEOUT",
           "wait_future"]

#: Seconds one store-client call (or the completion of an async read) may take before it is a hang: the one
#: default every engine, runner and adapter uses unless the user gives `--op-timeout`.
DEFAULT_OP_TIMEOUT = 2.0


def wait_future(future: concurrent.futures.Future, seconds: float, op: str, key: str) -> Any:
    """The result of a store client's future, or `StoreCallTimeout(op, key, seconds)` when it is not done once it
    had its allowance of `seconds` (`model.timing`: the bound, a grace, in the time the machine let it run)."""
    t0 = time.monotonic()
    waited = wait_judged(lambda s: bool(concurrent.futures.wait([future], s).done), seconds,
                         f"the completion of {op}({key!r})", t0=t0)
    if waited is not None:
        raise StoreCallTimeout(op, key, seconds, waited, waited - had(t0, t0 + waited))
    error = future.exception()
    if error is not None:  # (a read that failed with its own timeout: its error, unless the machine starved it)
        starved = starved_error(error, seconds, t0, time.monotonic(), f"the completion of {op}({key!r})")
        if starved is not None:
            raise starved from error
    return future.result()

#: Entries into protocol code so far.
STEPS = [0]
#: [STEPS value, Stalled] of the last stall raised (see `swallowed`).
_RAISED: list = [-1, None]
_CAUGHT = "; it caught the interruption and went on"


class Stalled(BaseException):
    """Protocol code ran `seconds` without returning (a BaseException, so `except Exception` cannot swallow it)."""

    def __init__(self, method: str, rank: int | None, where: str, seconds: float, again: bool = False,
                 waited: float | None = None, taken: float = 0.0) -> None:
        who = f"rank {rank}'s " if rank is not None else ""
        before = "; this line stalled before, so the shorter limit" if again else ""
        within = over_text(seconds, waited, taken) if waited is not None and not again else f"{seconds:g} s"
        super().__init__(f"{who}{method} did not return within {within} (blocked at {where}{before})")
        self.method, self.rank, self.where, self.seconds, self.again = method, rank, where, seconds, again


def note_raised(exc: Stalled) -> None:
    """Record that `exc` was raised in the protocol call now running (the watchdog calls this)."""
    _RAISED[:] = [STEPS[0], exc]


def swallowed(step: int) -> Stalled | None:
    """The `Stalled` raised during protocol call `step` (a `STEPS` value) if the protocol caught it and went on."""
    exc = _RAISED[1] if _RAISED[0] == step else None
    if exc is not None and not exc.args[0].endswith(_CAUGHT):
        exc.args = (exc.args[0] + _CAUGHT,)
    return exc


class ProtocolRaised(Exception):
    """Protocol code raised: names the rank, the method and the protocol's own file:line (`__cause__`: the error)."""

    def __init__(self, rank: int | None, method: str, where: str, error: BaseException) -> None:
        who = f"rank {rank}'s " if rank is not None else ""
        super().__init__(f"{who}{method} raised {type(error).__name__}: {error} (at {where})")
        self.rank, self.method, self.where, self.error = rank, method, where, error


class protocol_call:  # noqa: N801 - used as a context manager, like a function
    """`with protocol_call(rank, "rank_lookup"):` around one call into protocol code.

    Counts the entry (`STEPS`), re-raises a `Stalled` the call swallowed, and turns an exception the protocol
    raised into `ProtocolRaised` naming the rank, the method and the line (`StopIteration`, a finished rank
    program, and `StoreCallTimeout`, a store call that hung, pass as they are).
    """

    __slots__ = ("rank", "method", "step")

    def __init__(self, rank: int | None = None, method: str = "protocol code") -> None:
        self.rank, self.method = rank, method

    def __enter__(self) -> int:
        STEPS[0] += 1
        self.step = STEPS[0]
        return self.step

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: TracebackType | None) -> bool:
        if kind is None or kind is StopIteration:
            caught = swallowed(self.step)
            if caught is not None:
                raise caught
            return False
        if isinstance(exc, Exception) and not isinstance(exc, (ProtocolRaised, StoreCallTimeout)):
            raise ProtocolRaised(self.rank, self.method, _where(tb), exc) from exc
        return False


def _where(tb: TracebackType | None) -> str:
    """file:line of the innermost frame of `tb` (where the protocol raised)."""
    last = None
    while tb is not None:
        last, tb = tb, tb.tb_next
    if last is None:
        return "?"
    return f"{last.tb_frame.f_code.co_filename}:{last.tb_lineno} in {last.tb_frame.f_code.co_name}"
