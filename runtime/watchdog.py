"""Bounding protocol code: a protocol call that does not return becomes the outcome `Stalled`, not a stuck run.

Store calls are bounded one by one (`runtime.bounded`); protocol code (`rank_lookup`, `combine`, one step of a rank
program) runs on the caller's thread and cannot be. Within `watching(seconds)` a sampler thread looks at the main
thread every `TICK` seconds. Every engine enters protocol code through `model.calls.protocol_call`, which counts
entries in `STEPS`; when `STEPS` has not moved for `seconds` while a method of the contract stays on the main thread's
stack, that call has not returned, however it spends the time (sleeping, waiting on a lock, spinning, polling a
store). The sampler then signals the main thread (`SIGNAL`), whose handler raises `Stalled` right there. The
simulator, the harness and the explorer turn `Stalled` into a termination violation of the rank that stalled, so
a blocking protocol is reported and minimised like any other counterexample. The limit is judged as every timing
is (`model.timing`): the call stalls once it had the limit plus its grace of the time the machine let it run; when
the machine starves the harness too long to tell, `HarnessStarved` is raised instead (the case runs again, else the
verdict is `undecided`).

Time in store calls made from protocol code counts, so `seconds` must exceed the store time one legitimate call
may take (a lookup that checks k keys on a slow client: k x the per-call time); the command line keeps it at
least 5 s with a real client, and the pytest plugin above `--op-timeout`. A stall raised while Python closes an
abandoned rank program (its `finally` blocks) cannot be reported: Python only prints "Exception ignored".

Once a stall was raised at a line, a call that sits at that same line again (under the same protocol line) for
`again` seconds (default 0.1 s, looking every `FAST_TICK`) is called a stall too, so that minimising or shrinking
a counterexample that stalls does not wait the full limit on every run. Such a verdict is provisional: `forget()`
drops the shortcut, and `check` (and the final run of a Hypothesis failure) re-runs its counterexample at the
full limit before reporting it.

Code that a signal cannot interrupt (a C call that retries on EINTR, a blocked signal) is reported on stderr after
a further `hard_grace` seconds, and the process exits with `EXIT_UNINTERRUPTIBLE`: it cannot go on, and must not
hang; so does a protocol that catches the `Stalled` raised in it and goes on (one that catches it and returns is
reported all the same: `swallowed`). Only the main thread can be interrupted; elsewhere `watching` does nothing.
The pytest plugin watches every test; the command line watches every command.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any, Iterator

import attrs

from model.calls import STEPS, Stalled, note_raised
from model.contract import PROTOCOL_METHODS
from model.timing import STARVED_FACTOR, HarnessStarved, allowance, had

__all__ = ["TICK", "FAST_TICK", "STALL_SECONDS", "HARD_GRACE", "EXIT_UNINTERRUPTIBLE", "SIGNAL", "watching",
           "forget"]

#: Seconds between two looks at the main thread (FAST_TICK once some line has stalled).
TICK = 0.1
FAST_TICK = 0.02
#: Default limit: seconds one protocol call may run without returning.
STALL_SECONDS = 10.0
#: Default seconds, after the signal, before code that ignored it ends the process.
HARD_GRACE = 10.0
#: The exit status of a process ended because protocol code could not be interrupted.
EXIT_UNINTERRUPTIBLE = 3
#: The signal that interrupts the main thread: a real-time one, so SIGALRM stays free (pytest-timeout uses it).
SIGNAL = signal.SIGRTMIN + 3 if hasattr(signal, "SIGRTMIN") else getattr(signal, "SIGUSR2", None)
def _is_protocol(frame: FrameType, checked: bool) -> bool:
    if frame.f_code.co_name not in PROTOCOL_METHODS:
        return False
    if not checked:  # (the sampler thread must not read another thread's f_locals)
        return True
    owner = frame.f_locals.get("self")
    return owner is None or all(callable(getattr(owner, m, None)) for m in ("rank_lookup", "combine", "rank_load"))


def _protocol_frames(frame: FrameType | None, checked: bool = False) -> tuple[FrameType, FrameType] | None:
    """The innermost and the outermost frame of `frame`'s stack that run a method of the contract (`checked`:
    of a protocol), or None. The outermost is the call the harness made; the innermost is where it is."""
    inner = outer = None
    while frame is not None:
        if _is_protocol(frame, checked):
            inner = inner or frame
            outer = frame
        frame = frame.f_back
    return (inner, outer) if inner is not None else None


def _where(frame: FrameType) -> str:
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


@attrs.define
class _Limits:
    seconds: float
    again: float
    hard_grace: float


class _Sampler:
    """The one sampler thread and signal handler; nested `watching` blocks push their limits on `limits`."""

    def __init__(self) -> None:
        self.main = threading.main_thread().ident
        self.limits: list[_Limits] = []
        self.stop = threading.Event()
        #: where stalls were raised: (code, line) of the innermost frame and of the innermost protocol frame
        self.stalled_at: set[tuple[Any, int, Any, int]] = set()
        self.mark: tuple[int, int] | None = None  # (STEPS, id of the entry frame) when the call clock started
        self.since = 0.0
        self.spot: tuple[int, Any, int] | None = None  # (id, code, line) of the innermost frame, since spot_since
        self.spot_since = 0.0
        #: (when, STEPS, limit, again, starved reason or None, waited, taken) of a sent signal
        self.fired: tuple | None = None
        self.raised: tuple[tuple[int, int], float] | None = None  # (mark, when) of the last Stalled raised
        self.previous: Any = None
        self.thread = threading.Thread(target=self._loop, name="shardcheck-watchdog", daemon=True)

    def _loop(self) -> None:
        while not self.stop.wait(FAST_TICK if self.stalled_at else TICK):
            if self.limits:
                self._look(self.limits[-1])  # (a method: no frame of the main thread outlives one look)

    def _look(self, limits: _Limits) -> None:
        now, fired = time.monotonic(), self.fired
        frame = sys._current_frames().get(self.main)
        if fired is not None:
            if now - fired[0] > limits.hard_grace:
                self._give_up(frame, f"did not return within {fired[2]:g} s and could not be interrupted")
            return
        found = _protocol_frames(frame)
        if found is None:
            self.mark = self.spot = None
            return
        proto, entry = found
        mark = (STEPS[0], id(entry))
        raised = self.raised
        if raised is not None and raised[0] == mark and now - raised[1] > limits.hard_grace:
            self._give_up(frame, "caught the Stalled raised in it and went on")
        spot = (id(frame), frame.f_code, frame.f_lineno)
        if spot != self.spot:
            self.spot, self.spot_since = spot, now
        if mark != self.mark:
            self.mark, self.since = mark, now
            return
        # the full limit for the call, judged as every timing is (`model.timing`: its allowance, in the time the
        # machine let it run); the short one only while it sits where a stall was raised before
        again = (frame.f_code, frame.f_lineno, proto.f_code, proto.f_lineno) in self.stalled_at \
            and now - self.spot_since >= limits.again
        starved = None
        if not again:
            limit, waited = allowance(limits.seconds), now - self.since
            if waited < limit:
                return
            got = had(self.since, now)
            if got < limit:
                if waited < STARVED_FACTOR * limit:
                    return
                starved = (f"a protocol call: the machine kept the harness and the subject from running for "
                           f"{waited - got:.1f} of {waited:.1f} s; its limit of {limits.seconds:g} s cannot be judged")
        self.fired = (now, STEPS[0], limits.again if again else limits.seconds, again, starved, now - self.since,
                      0.0 if again else (now - self.since) - had(self.since, now))
        signal.pthread_kill(self.main, SIGNAL)

    def handle(self, signum: int, frame: FrameType | None) -> None:
        """The signal handler, on the main thread: raise `Stalled` in the protocol call that has not returned."""
        fired, self.fired = self.fired, None
        if fired is None:  # not ours: whoever handled this signal before us
            if callable(self.previous):
                self.previous(signum, frame)
            return
        found = _protocol_frames(frame, checked=True)
        if frame is None or found is None or STEPS[0] != fired[1]:
            self.mark = None
            return  # the call returned between the look and the signal, or it is not a protocol's
        proto, entry = found
        self.stalled_at.add((frame.f_code, frame.f_lineno, proto.f_code, proto.f_lineno))
        if self.raised is None or self.raised[0] != (STEPS[0], id(entry)):  # (the first raise in this call)
            self.raised = ((STEPS[0], id(entry)), time.monotonic())
        rank = entry.f_locals.get("rank")
        owner = entry.f_locals.get("self")
        method = f"{type(owner).__name__}.{entry.f_code.co_name}" if owner is not None else entry.f_code.co_name
        where = _where(proto) + (f", inside {_where(frame)}" if frame is not proto else "")
        if fired[4] is not None:  # the machine, not the protocol: nothing to judge
            raise HarnessStarved(fired[4])
        exc = Stalled(method, rank if isinstance(rank, int) else None, where, fired[2], fired[3], fired[5], fired[6])
        note_raised(exc)
        raise exc

    def _give_up(self, frame: FrameType | None, what: str) -> None:
        where = _where(frame) if frame is not None else "?"
        print(f"shardcheck: error: protocol code {what} (at {where}); ending the process "
              f"(exit {EXIT_UNINTERRUPTIBLE})", file=sys.stderr, flush=True)
        os._exit(EXIT_UNINTERRUPTIBLE)


_sampler: _Sampler | None = None


@contextlib.contextmanager
def watching(seconds: float = STALL_SECONDS, *, again: float = 0.1,
             hard_grace: float = HARD_GRACE) -> Iterator[bool]:
    """Within the block, a protocol call running `seconds` without returning raises `Stalled` in it.

    Nested blocks use the innermost block's limits. Yields whether the watch is on (False off the main thread
    or where the signal does not exist).
    """
    global _sampler
    again = min(again, seconds)
    if not (seconds > 0 and again > 0 and hard_grace > 0):
        raise ValueError(f"watching: seconds, again and hard_grace must be > 0, got {seconds!r}, {again!r}, "
                         f"{hard_grace!r}")
    if SIGNAL is None or threading.current_thread() is not threading.main_thread():
        yield False
        return
    outermost = _sampler is None
    if outermost:
        _sampler = _Sampler()
        _sampler.previous = signal.signal(SIGNAL, _sampler.handle)
        _sampler.thread.start()
    sampler = _sampler
    sampler.limits.append(_Limits(seconds, again, hard_grace))
    try:
        yield True
    finally:
        sampler.limits.pop()
        sampler.fired = sampler.mark = sampler.raised = None
        if outermost:
            sampler.stop.set()
            sampler.thread.join()
            # (None: the previous handler was not installed from Python and cannot be put back)
            signal.signal(SIGNAL, sampler.previous if sampler.previous is not None else signal.SIG_DFL)
            _sampler = None


def forget() -> None:
    """Drop the shortcut for lines that stalled before: the next stall is judged at the full limit again."""
    if _sampler is not None:
        _sampler.stalled_at.clear()
