"""The `recovery` property: once the servers are back from a real fault, a client's calls succeed again within a bound.

`probe(store, ...)` is the one probe every engine runs after a fault is over (a store-ops run, a concurrent run, a
protocol case): from the moment the last fault ended, it writes a fresh key and reads it back through `get`,
`get_async` and `contains`, and repeats that until all of it succeeds or `recovery_seconds` have passed. A client
that stays broken (it raises, it times out, it answers a miss for the key it just wrote) fails it. The store's calls
must already be bounded (`runtime.bounded.BoundedStore`, or a self-bounded client); the wait of `get_async` is
bounded here by `op_timeout`.
"""
from __future__ import annotations

import itertools
import time
from typing import Any, Callable

import attrs

from model.calls import DEFAULT_OP_TIMEOUT, wait_future
from model.timing import overran

__all__ = ["Probe", "probe", "default_recovery_seconds", "RECOVERY_OP_TIMEOUTS"]

#: The default bound of `recovery`: this many op timeouts after the servers are back (`--recovery-seconds`).
RECOVERY_OP_TIMEOUTS = 2.0
_nonce = itertools.count()


def default_recovery_seconds(op_timeout: float = DEFAULT_OP_TIMEOUT) -> float:
    """`--recovery-seconds` when not given: twice the op timeout."""
    return RECOVERY_OP_TIMEOUTS * op_timeout


@attrs.frozen
class Probe:
    """What a recovery probe found: `ok`, the seconds from the end of the fault to the first full success
    (`seconds`), the attempts made, and the last failure (`why`)."""

    ok: bool
    seconds: float | None
    attempts: int
    why: str = ""


def _round(store: Any, key: str, value: bytes, op_timeout: float) -> str:
    """One put-and-read-back of `key`: "" when every call succeeded with the right answer, else what went wrong."""
    try:
        store.put(key, value)
        got = store.get(key)
        if got is None or bytes(got) != value:
            return f"get({key!r}) after put answered {'a miss' if got is None else f'{len(bytes(got))} other bytes'}"
        if callable(getattr(store, "get_async", None)):
            got = wait_future(store.get_async(key), op_timeout, "get_async", key)
            if got is None or bytes(got) != value:
                return f"get_async({key!r}) after put answered {'a miss' if got is None else 'other bytes'}"
        if store.contains(key) is not True:
            return f"contains({key!r}) after put answered false"
    except BaseException as exc:  # noqa: BLE001 - any failure of the client is what the probe reports
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return f"{type(exc).__name__}: {exc}"
    return ""


def probe(store: Any, *, healed_at: float | None, recovery_seconds: float, op_timeout: float = DEFAULT_OP_TIMEOUT,
          clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
          key: str | None = None) -> Probe:
    """Probe `store` until a round succeeds or `recovery_seconds` after `healed_at` (now when None) have passed (their
    allowance, `model.timing`, with the real clock); the probe key is deleted afterwards (best effort)."""
    start = clock() if healed_at is None else healed_at
    deadline = start + recovery_seconds
    key = key or f"shardcheck-recovery-probe:{next(_nonce)}:{int(clock() * 1e6) % 10**9}"
    value = b"recovery-probe|" + key.encode()
    attempts, why = 0, "no attempt was made"
    while True:
        attempts += 1
        why = _round(store, key, value, op_timeout)
        now = clock()
        if not why:
            try:
                store.delete(key)
            except Exception:  # noqa: BLE001 - the probe key is the probe's own: removing it is best effort
                pass
            return Probe(True, round(max(0.0, now - start), 4), attempts)
        if clock is time.monotonic:  # judged as every timing is (`model.timing`)
            over = overran(recovery_seconds, start, now, "the recovery probe")
            if over is not None:
                return Probe(False, None, attempts, f"{why} (still failing past {over})")
        elif now >= deadline:
            return Probe(False, None, attempts, why)
        sleep(0.05 if clock is time.monotonic else min(0.05, max(0.0, deadline - now)))
