"""Bounding protocol code: a protocol method that does not return becomes the outcome `Stalled`, not a stuck run.

Store calls are bounded one by one (`model.bounded`); protocol methods (`rank_lookup`, `combine`, one step of a
rank program, ...) run on the caller's thread and cannot be. `watching(seconds)` starts a sampler thread that looks
at the main thread's stack every `TICK` seconds: when the same innermost frame has stayed on it, inside a method of
the contract, for `seconds`, it signals the main thread (SIGALRM), whose handler raises `Stalled` right there. The
simulator, the harness and the explorer turn `Stalled` into a termination violation of the rank that stalled, so a
blocking protocol is reported and minimised like any other counterexample. It costs the hot path nothing.

Once a line of protocol code has stalled, a later stall at the same line is called after `again` seconds (default
0.1 s, looking every `FAST_TICK`), so that minimising or shrinking a counterexample that stalls does not wait the full limit on every run.
Code that a signal cannot interrupt (a C call that retries on EINTR, a blocked SIGALRM) is reported on stderr after
a further `hard_grace` seconds, and the process exits with `EXIT_UNINTERRUPTIBLE`: it cannot go on, and must not
hang.

Only the main thread can be interrupted, and only where SIGALRM exists; elsewhere `watching` does nothing.
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
from typing import Iterator

from model.contract import PROTOCOL_METHODS

#: Seconds between two looks at the main thread's stack (FAST_TICK once some line has stalled).
TICK = 0.1
FAST_TICK = 0.02
#: Default limit: seconds one protocol method may run without returning.
STALL_SECONDS = 10.0
#: Seconds, after the signal, before code that ignored it ends the process.
HARD_GRACE = 10.0
#: The exit status of a process ended because protocol code could not be interrupted.
EXIT_UNINTERRUPTIBLE = 3
_BOUNDED_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bounded.py")


class Stalled(BaseException):
    """Protocol code ran `seconds` without returning (a BaseException, so `except Exception` cannot swallow it)."""

    def __init__(self, method: str, rank: int | None, where: str, seconds: float, again: bool = False) -> None:
        who = f"rank {rank}'s " if rank is not None else ""
        before = "; this line stalled before, so the shorter limit" if again else ""
        super().__init__(f"{who}{method} did not return within {seconds:g} s (blocked at {where}{before})")
        self.method, self.rank, self.where, self.seconds = method, rank, where, seconds


def _protocol_frame(frame: FrameType | None) -> FrameType | None:
    """The innermost frame of `frame`'s stack that runs a method of the contract, if any."""
    while frame is not None:
        if frame.f_code.co_name in PROTOCOL_METHODS:
            return frame
        frame = frame.f_back
    return None


def _where(frame: FrameType) -> str:
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


class _Sampler:
    def __init__(self, seconds: float, again: float, hard_grace: float) -> None:
        self.limit, self.again, self.hard_grace = seconds, again, hard_grace
        self.main = threading.main_thread().ident
        self.stop = threading.Event()
        self.paused = threading.Event()  # while an inner watch runs
        self.fired_at: float | None = None
        self.stalled_at: set[tuple[object, int]] = set()  # (code, line) of protocol code that stalled before
        self.pending_limit = seconds
        self.thread = threading.Thread(target=self._loop, name="shardcheck-watchdog", daemon=True)

    def _loop(self) -> None:
        seen, since = None, 0.0
        while not self.stop.wait(FAST_TICK if self.stalled_at else TICK):
            frame = sys._current_frames().get(self.main)
            now = time.monotonic()
            if self.fired_at is not None:
                if now - self.fired_at > self.hard_grace and not self.stop.is_set():
                    self._give_up(frame)
                continue
            proto = None if self.paused.is_set() or frame is None or frame.f_code.co_filename == _BOUNDED_FILE \
                else _protocol_frame(frame)
            if proto is None:
                seen = None  # not in protocol code, or in a store call (bounded on its own)
                continue
            if frame is not seen:
                seen, since = frame, now
                continue
            limit = self.again if (proto.f_code, proto.f_lineno) in self.stalled_at else self.limit
            if now - since >= limit:
                self.fired_at, seen = now, None
                self.pending_limit = limit
                signal.pthread_kill(self.main, signal.SIGALRM)

    def handle(self, signum: int, frame: FrameType | None) -> None:
        """The SIGALRM handler, on the main thread: raise `Stalled` where the protocol method is."""
        if self.fired_at is None:
            return  # not ours (or already handled)
        self.fired_at = None
        proto = _protocol_frame(frame)
        if proto is None:
            return  # the method returned between the look and the signal: not a stall
        again = (proto.f_code, proto.f_lineno) in self.stalled_at
        self.stalled_at.add((proto.f_code, proto.f_lineno))
        rank = proto.f_locals.get("rank")
        where = _where(proto)
        if frame is not None and frame is not proto:
            where += f", inside {_where(frame)}"
        owner = proto.f_locals.get("self")
        method = f"{type(owner).__name__}.{proto.f_code.co_name}" if owner is not None else proto.f_code.co_name
        raise Stalled(method, rank if isinstance(rank, int) else None, where, self.pending_limit, again)

    def _give_up(self, frame: FrameType | None) -> None:
        where = _where(frame) if frame is not None else "?"
        print(f"shardcheck: error: protocol code did not return within {self.pending_limit:g} s and could not be "
              f"interrupted for {self.hard_grace:g} s more (blocked at {where}); ending the process "
              f"(exit {EXIT_UNINTERRUPTIBLE})", file=sys.stderr, flush=True)
        os._exit(EXIT_UNINTERRUPTIBLE)


_watches: list[_Sampler] = []


@contextlib.contextmanager
def watching(seconds: float = STALL_SECONDS, *, again: float = 0.1,
             hard_grace: float = HARD_GRACE) -> Iterator[bool]:
    """Within the block, a protocol method running `seconds` without returning raises `Stalled` in it.

    An inner watch replaces the outer one until it ends. Yields whether the watch is on (False off the main
    thread or where SIGALRM does not exist).
    """
    if not (seconds > 0 and again > 0 and hard_grace > 0):
        raise ValueError(f"watching: seconds, again and hard_grace must be > 0, got {seconds!r}, {again!r}, "
                         f"{hard_grace!r}")
    if not hasattr(signal, "pthread_kill") or threading.current_thread() is not threading.main_thread():
        yield False
        return
    outer = _watches[-1] if _watches else None
    if outer is not None:
        outer.paused.set()
    sampler = _Sampler(seconds, again, hard_grace)
    previous = signal.signal(signal.SIGALRM, sampler.handle)
    _watches.append(sampler)
    sampler.thread.start()
    try:
        yield True
    finally:
        sampler.stop.set()
        sampler.fired_at = None
        sampler.thread.join()
        _watches.pop()
        signal.signal(signal.SIGALRM, previous)
        if outer is not None:
            outer.paused.clear()
