"""The harness's measure of its own lateness: how long this process's threads, and every process it started, were
runnable but kept off the CPU (Linux's per-task run-queue delay: the second field of /proc/PID/task/TID/schedstat).

A subject blocked on a socket, a lock or a sleep waits off the run queue: that time is its own. A subject (or a
server it talks to, or the harness thread waiting for it) kept off the CPU by other work on the machine gathers
run-queue delay: that time is the machine's. `start()` runs one sampler thread (every `PERIOD` s it reads every
task's delay through file descriptors kept open; every `REFRESH` s it lists the tasks again, children included) and
installs `stolen(t0, t1)` as `model.timing`'s measure: the delay the tasks gathered in [t0, t1], summed (two
starved tasks on one path are both late), at most the window. Where schedstat cannot be read, the sampler's own
oversleep stands in for it.

`speed()` is the machine's measured speed: how many times longer than on a quiet machine of the reference kind a
fixed piece of pure-Python work takes here (at least 1); the default `--setup-timeout` scales with it.
"""
from __future__ import annotations

import bisect
import collections
import os
import threading
import time

from model import timing

__all__ = ["PERIOD", "REFRESH", "SETUP_SECONDS", "start", "stolen", "speed", "default_setup_timeout",
           "measures_run_queue", "set_setup_timeout", "setup_timeout"]

#: Seconds between two samples, and between two listings of the tasks.
PERIOD = 0.05
REFRESH = 1.0
#: Samples kept: ten minutes.
KEEP = int(600 / PERIOD)
#: Seconds the harness's set-up (a deployment, servers) may take on a quiet machine of the reference kind.
SETUP_SECONDS = 60.0
#: Seconds the calibration work of `speed()` took on a quiet machine of the reference kind (2-core x86_64).
_REFERENCE_SECONDS = 0.04


class _Sampler:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.times: collections.deque[float] = collections.deque(maxlen=KEEP)
        self.totals: collections.deque[float] = collections.deque(maxlen=KEEP)
        self.fds: dict[tuple[int, int], int] = {}
        self.last: dict[tuple[int, int], int] = {}
        self.total = 0.0
        self.listed = 0.0
        self.schedstat = os.path.exists(f"/proc/{os.getpid()}/task/{threading.get_native_id()}/schedstat")
        self.own = 0
        self.thread = threading.Thread(target=self._loop, name="shardcheck-starvation", daemon=True)

    # -- tasks -------------------------------------------------------------------------------------------------------
    def _tasks(self) -> set[tuple[int, int]]:
        """(pid, tid) of every task of this process and of its descendants, but the sampler's own."""
        out: set[tuple[int, int]] = set()
        todo, seen = [os.getpid()], set()
        while todo:
            pid = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in map(int, tids):
                if tid != self.own:
                    out.add((pid, tid))
                try:
                    with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                        todo.extend(int(c) for c in f.read().split())
                except OSError:
                    pass
        return out

    def _relist(self) -> None:
        tasks = self._tasks()
        for gone in set(self.fds) - tasks:
            os.close(self.fds.pop(gone))
            self.last.pop(gone, None)
        for new in tasks - set(self.fds):
            try:
                fd = os.open(f"/proc/{new[0]}/task/{new[1]}/schedstat", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            self.fds[new] = fd
            delay = self._read(fd)
            if delay is not None:  # a task first seen counts from now on
                self.last[new] = delay

    @staticmethod
    def _read(fd: int) -> int | None:
        try:
            return int(os.pread(fd, 64, 0).split()[1])
        except (OSError, IndexError, ValueError):
            return None

    # -- samples -----------------------------------------------------------------------------------------------------
    def sample(self, now: float) -> None:
        """Add the delay gathered since the last sample (under `lock`)."""
        if self.schedstat:
            if now - self.listed >= REFRESH:
                self.listed = now
                self._relist()
            gained = 0
            for task, fd in self.fds.items():
                delay = self._read(fd)
                if delay is None:
                    continue
                gained += max(0, delay - self.last.get(task, delay))
                self.last[task] = delay
            self.total += gained / 1e9
        elif self.times:
            self.total += max(0.0, now - self.times[-1] - PERIOD)
        self.times.append(now)
        self.totals.append(self.total)

    def _loop(self) -> None:
        self.own = threading.get_native_id()
        while True:
            time.sleep(PERIOD)
            with self.lock:
                self.sample(time.monotonic())

    def _at(self, t: float) -> float:
        """The total delay at `t`, interpolated between samples (the oldest kept before it, the last after it)."""
        times, totals = self.times, self.totals
        i = bisect.bisect_left(times, t)
        if i == 0:
            return totals[0]
        if i >= len(times):
            return totals[-1]
        t_a, t_b = times[i - 1], times[i]
        return totals[i - 1] + (totals[i] - totals[i - 1]) * (t - t_a) / (t_b - t_a)

    def stolen(self, t0: float, t1: float) -> float:
        with self.lock:
            now = time.monotonic()
            if not self.times or now - self.times[-1] > PERIOD / 2:
                self.sample(now)
            return max(0.0, self._at(t1) - self._at(t0))


_sampler: _Sampler | None = None
_start_lock = threading.Lock()


def start() -> None:
    """Start the sampler (once per process) and install its measure in `model.timing`."""
    global _sampler
    with _start_lock:
        if _sampler is not None and _sampler.thread.is_alive():
            return
        _sampler = _Sampler()
        with _sampler.lock:
            _sampler.sample(time.monotonic())
        _sampler.thread.start()
        timing.measure_with(_sampler.stolen)


def stolen(t0: float, t1: float) -> float:
    """`model.timing.stolen`, the sampler started first."""
    start()
    return timing.stolen(t0, t1)


def measures_run_queue() -> bool:
    """Whether the run-queue delay is read (else the sampler's oversleep stands in for it)."""
    start()
    return bool(_sampler and _sampler.schedstat)


_speed: list[float] = []


def speed() -> float:
    """How many times slower than the reference machine this one runs a fixed piece of pure-Python work: the least
    of three tries (the machine's load counts where it lasts), at least 1. Measured once per process."""
    if not _speed:
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            x = 0
            for i in range(200_000):
                x += i * i % 7
            best = min(best, time.perf_counter() - t0)
        _speed.append(max(1.0, best / _REFERENCE_SECONDS))
    return _speed[0]


def default_setup_timeout() -> float:
    """`--setup-timeout` when not given: `SETUP_SECONDS` scaled by the machine's measured `speed()` (at most 5x)."""
    return round(SETUP_SECONDS * min(5.0, speed()), 1)


_setup: list[float] = []


def set_setup_timeout(seconds: float | None) -> None:
    """`--setup-timeout`: the bound of the harness's own set-up in this process (None: the default)."""
    if seconds is not None and not seconds > 0:
        raise ValueError(f"--setup-timeout must be a positive number of seconds, got {seconds!r}")
    _setup[:] = [] if seconds is None else [float(seconds)]


def setup_timeout() -> float:
    """Seconds the harness's own set-up (a deployment, its servers) may take: `--setup-timeout`, else the default."""
    return _setup[0] if _setup else default_setup_timeout()
