"""Timing judgments: a call is judged against the bound the subject was handed, plus a grace, in the time the
machine let it run.

Every timing property (`store-hang`, `fault-hang`, `engine-returns`, `termination`, `recovery`, `lost-completion`)
gives the subject its `allowance(bound)`: the bound it was handed (`op_timeout`, the engine's lookup timeout, the
stall limit...) plus `grace(bound)` = max(25%, 0.2 s) for the harness's own overhead (waking up, the GIL, a socket's
own timeout firing a few milliseconds after the bound). A subject that bounds its own calls by exactly the bound it
was given holds.

Time the machine kept from the harness and the subject is not the subject's: `stolen(t0, t1)` is the part of
[t0, t1] that the harness's threads and the processes it started spent runnable but not running (measured by
`runtime.starvation`, which installs itself with `measure_with`; 0 until then). A subject is late only once it
`had(t0, t1)` its whole allowance of the rest. When the machine keeps the harness waiting `STARVED_FACTOR` times the
allowance without the subject having had it, nothing can be judged: `HarnessStarved`. Work that is the harness's
own (building a deployment, starting servers) is bounded by `--setup-timeout` the same way: `SetupTimeout`. Both are
`HarnessOutcome`s: the case is run again (`rerun_starved`) and, if the machine stays starved, the verdict is
`undecided` (exit 4), never `violated`, and nothing is saved.
"""
from __future__ import annotations

import time
from typing import Callable, TypeVar

__all__ = ["GRACE_FRACTION", "GRACE_MIN", "STARVED_FACTOR", "RERUNS", "grace", "allowance", "stolen", "had",
           "measure_with", "over_text", "overran", "starved_error", "wait_judged", "HarnessOutcome", "HarnessStarved", "SetupTimeout",
           "FaultNotEnded", "rerun_starved", "settle_judged", "starved_timeout"]

#: The grace on a bound: this fraction of it, and at least `GRACE_MIN` seconds.
GRACE_FRACTION = 0.25
GRACE_MIN = 0.2
#: Wall seconds, in allowances, the harness waits for a starved subject before it gives up judging it.
STARVED_FACTOR = 8.0
#: Runs of a case whose timing the machine kept the harness from judging, before the outcome is `undecided`.
RERUNS = 3

T = TypeVar("T")


def grace(bound: float) -> float:
    """The harness's grace on `bound` seconds."""
    return max(GRACE_FRACTION * bound, GRACE_MIN)


def allowance(bound: float) -> float:
    """The seconds a subject handed `bound` may take: the bound plus its grace."""
    return bound + grace(bound)


_measure: list[Callable[[float, float], float]] = [lambda t0, t1: 0.0]


def measure_with(fn: Callable[[float, float], float]) -> None:
    """Install the measure of stolen time (`runtime.starvation` does, on its start)."""
    _measure[0] = fn


def stolen(t0: float, t1: float) -> float:
    """Seconds of [t0, t1] (monotonic) the machine kept the harness and its subject's processes off the CPU."""
    return min(max(0.0, t1 - t0), max(0.0, _measure[0](t0, t1)))


def had(t0: float, t1: float) -> float:
    """Seconds of [t0, t1] the subject could run: the wall time less what the machine kept from it."""
    return max(0.0, (t1 - t0) - stolen(t0, t1))


def over_text(bound: float, waited: float, taken: float | None = None) -> str:
    """The words of a timing violation: the bound, the grace, how long the harness waited and what the machine took."""
    took = f"; the machine kept it from running for {taken:.2f} s of that" if taken and taken >= 0.01 else ""
    return f"its bound of {bound:g} s (+{grace(bound):g} s grace; waited {waited:.2f} s{took})"


class HarnessOutcome(BaseException):
    """The harness could not judge: its own work or the machine, not the subject (a BaseException, so that the
    subject's `except Exception` and the harness's own handlers of the subject's errors let it through)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class HarnessStarved(HarnessOutcome):
    """The machine kept the harness (or the subject's processes) off the CPU too long to judge a call's timing."""


class SetupTimeout(HarnessOutcome):
    """The harness's own set-up (a deployment, servers, processes) did not finish within `--setup-timeout`."""


class FaultNotEnded(HarnessOutcome):
    """The harness could not end a fault it struck (a server it killed did not start again on its port): the client
    cannot be judged on recovering from it."""


def overran(bound: float, t0: float, t1: float, what: str, *, ended: bool = False) -> str | None:
    """The words of an overrun (`over_text`) when a call handed `bound` seconds, running over [t0, t1], had its whole
    allowance of the machine's time by `t1`; None while it did not. A call still running (not `ended`) that the
    machine kept from having it for `STARVED_FACTOR` allowances of wall time is `HarnessStarved`."""
    waited, limit = t1 - t0, allowance(bound)
    if waited < limit:
        return None
    got = had(t0, t1)
    if got >= limit:
        return over_text(bound, waited, waited - got)
    if not ended and waited >= STARVED_FACTOR * limit:
        raise HarnessStarved(f"{what}: the machine kept the harness and the subject from running for "
                             f"{waited - got:.1f} of {waited:.1f} s; its bound of {bound:g} s cannot be judged")
    return None


def starved_error(exc: BaseException, bound: float, t0: float, t1: float, what: str) -> HarnessStarved | None:
    """A subject's own timeout (`exc`: a `TimeoutError`, or a `StoreCallTimeout` of a self-bounded client, over
    [t0, t1]) while the machine kept it from running for more than the grace of that span: the machine's doing, not
    the subject's (`HarnessStarved`, to run again); None otherwise (its own timeout on a machine that let it run is
    its own answer). `bound` is the bound the subject was handed (the subject's own may be shorter)."""
    if not (isinstance(exc, TimeoutError) or type(exc).__name__ == "StoreCallTimeout"):
        return None
    return _starved(bound, t0, t1, what)


def starved_timeout(bound: float, t0: float, t1: float, what: str) -> HarnessStarved | None:
    """A subject that may have given up at its own timeout of `bound` seconds (it took that long, over [t0, t1])
    while the machine kept it from running for more than the grace of that span: `HarnessStarved`; None otherwise."""
    return None if t1 - t0 < bound else _starved(bound, t0, t1, what)


def _starved(bound: float, t0: float, t1: float, what: str) -> HarnessStarved | None:
    taken = stolen(t0, t1)
    if taken <= grace(min(bound, t1 - t0)):
        return None
    return HarnessStarved(f"{what} gave up at its own timeout after {t1 - t0:.2f} s, while the machine kept it from "
                          f"running for {taken:.2f} s of that")


def wait_judged(wait: Callable[[float], bool], bound: float, what: str, *, t0: float | None = None,
                clock: Callable[[], float] = time.monotonic) -> float | None:
    """Wait, through `wait(seconds) -> done`, for a call handed `bound` seconds (started at `t0`, default now):
    None once done; the wall seconds waited once the subject had its whole `allowance(bound)` of the machine's time
    and was not done (the caller reports the overrun with `over_text`). `HarnessStarved` when the machine kept it
    from having that within `STARVED_FACTOR` allowances of wall time."""
    t0 = clock() if t0 is None else t0
    limit = allowance(bound)
    while True:
        now = clock()
        if overran(bound, t0, now, what) is not None:
            return now - t0
        got = now - t0 if now - t0 < limit else had(t0, now)
        if wait(max(0.001, min(limit - got, STARVED_FACTOR * limit - (now - t0)))):
            return None


def settle_judged(settled: Callable[[], bool], bound: float, what: str, *, t0: float | None = None,
                  step: float = 0.05) -> bool:
    """Poll `settled()` until it holds, or until the subject had its `allowance(bound)` of the machine's time since
    `t0` (default now): whether it held (`wait_judged`: `HarnessStarved` when the machine kept it from having that).
    What must settle within a bound after the last request (pins released, leaks gone) is judged so, never by the
    wall clock of a loaded machine."""
    def wait(seconds: float) -> bool:
        end = time.monotonic() + seconds
        while not settled():
            left = end - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(step, left))
        return True
    return wait_judged(wait, bound, what, t0=t0) is None


def rerun_starved(run: Callable[[], T], *, attempts: int = RERUNS, on_rerun: Callable[[HarnessOutcome], None] =
                  lambda exc: None) -> T:
    """`run()`, run again (after `on_rerun(exc)`) while it ends in a `HarnessOutcome`, at most `attempts` times in
    all; the last `HarnessOutcome` propagates (the caller's verdict is `undecided`)."""
    for i in range(attempts):
        try:
            return run()
        except HarnessOutcome as exc:
            if i == attempts - 1:
                raise
            on_rerun(exc)
    raise AssertionError("unreachable")
