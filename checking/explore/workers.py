"""Shards on local worker processes: at most `workers` at a time, each shard in a fresh process.

Every wait is bounded (`TICK`); a shard whose process dies or raises is retried `retries` times and then
reported in `failed_shards` (the verdict is then "incomplete", never a silently smaller count); `timeout`
bounds the whole run the same way. Once a shard reports a violation at level L, the others stop after
expanding level L (all the merge needs of them, `checking.explore.shards`). On Ctrl-C (or any error) every child is terminated, then killed, and
joined before the exception goes on: no process is left behind. Children ignore SIGINT (the parent ends
them) and watch protocol code (`runtime.watchdog`), so a protocol call that stalls is a violation, as in
one process. Processes are spawned, not forked: a child starts clean, without the parent's threads.
"""
from __future__ import annotations

import multiprocessing
import signal
import time
from multiprocessing.connection import wait
from typing import Any, Callable

from runtime.watchdog import STALL_SECONDS, watching

from checking.explore.result import ExploreError, ExploreResult
from checking.explore.shards import ShardResult, ShardSpec, incomplete, merge, run_shard

__all__ = ["explore_workers", "TICK"]

#: Seconds of one wait for messages from the children (the longest the parent blocks at once).
TICK = 0.2
#: Seconds between two progress messages of one child.
PROGRESS_EVERY = 0.5
#: Seconds a terminated child gets to exit before it is killed.
GRACE = 2.0


def _child(conn: Any, spec: ShardSpec, index: int, count: int, stall_seconds: float, stop_level: Any) -> None:
    """A worker process: run one shard, sending progress and then its result (or its error). `stop_level`: a
    shared int, the level of the least violation found so far (-1: none), past which the shard may stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    last = [0.0]

    def progress(stats: dict) -> None:
        now = time.monotonic()
        if now - last[0] >= PROGRESS_EVERY:
            last[0] = now
            conn.send(("progress", stats["states"]))

    try:
        with watching(stall_seconds):
            result = run_shard(spec, index, count, progress=progress,
                               stop_after=lambda: None if stop_level.value < 0 else stop_level.value)
        conn.send(("done", result))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which retries or reports the shard
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def explore_workers(spec: ShardSpec, workers: int, *, shards: int | None = None, retries: int = 1,
                    timeout: float | None = None, stall_seconds: float = STALL_SECONDS,
                    progress: Callable[[dict], None] | None = None) -> ExploreResult:
    """Explore `spec` in `shards` shards (default: `workers`) on at most `workers` local processes, merged.

    `progress(stats)`: called about every `TICK` with {"states", "shards", "done", "failed", "workers"}.
    """
    if workers < 1 or (shards is not None and shards < 1) or retries < 0:
        raise ExploreError(f"need workers >= 1, shards >= 1, retries >= 0 (got {workers}, {shards}, {retries})")
    count = shards or workers
    ctx = multiprocessing.get_context("spawn")
    t0 = time.perf_counter()
    todo = list(range(count))
    attempts = {i: 0 for i in range(count)}
    running: dict[Any, tuple[Any, int]] = {}  # connection -> (process, shard)
    states: dict[int, int] = {}
    results: dict[int, ShardResult] = {}
    failed: list[tuple[int, str]] = []
    stop_level = ctx.Value("i", -1, lock=False)  # written by this process only

    def failure(index: int, why: str) -> None:
        states.pop(index, None)
        if attempts[index] <= retries:
            todo.insert(0, index)
        else:
            failed.append((index, why))

    try:
        while todo or running:
            while todo and len(running) < workers:
                index = todo.pop(0)
                attempts[index] += 1
                parent, child = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_child, args=(child, spec, index, count, stall_seconds, stop_level),
                                   name=f"shardcheck-shard-{index}", daemon=True)
                proc.start()
                child.close()
                running[parent] = (proc, index)
            if timeout is not None and time.perf_counter() - t0 > timeout:
                for conn, (proc, index) in list(running.items()):
                    failed.append((index, f"timed out after {timeout:g} s"))
                failed.extend((index, "not started before the timeout") for index in todo)
                todo.clear()
                break
            for conn in wait(list(running), timeout=TICK):
                proc, index = running[conn]
                try:
                    kind, body = conn.recv()
                except (EOFError, OSError):  # the process died without a result
                    proc.join(GRACE)
                    del running[conn]
                    conn.close()
                    failure(index, f"worker process exited with code {proc.exitcode} without a result")
                    continue
                if kind == "progress":
                    states[index] = body
                    continue
                del running[conn]
                conn.close()
                proc.join(GRACE)
                if kind == "done":
                    results[index] = body
                    states[index] = body.states
                    if body.key is not None and (stop_level.value < 0 or body.key[1] < stop_level.value):
                        stop_level.value = body.key[1]  # the others need not search past this level
                else:
                    failure(index, body)
            if progress is not None:
                progress({"states": sum(states.values()), "shards": count, "done": len(results),
                          "failed": len(failed), "workers": workers})
    finally:
        _end(running)
    wall = time.perf_counter() - t0
    if failed:
        return incomplete(list(results.values()), failed, seconds=wall, workers=workers)
    return merge(spec, [results[i] for i in range(count)], seconds=wall, workers=workers)


def _end(running: dict) -> None:
    """Terminate, then kill, every child still running, and join it."""
    for conn, (proc, _) in running.items():
        if proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + GRACE
    for conn, (proc, _) in running.items():
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(GRACE)
        conn.close()
    running.clear()
