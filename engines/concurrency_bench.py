"""Figures of the concurrent layer for `shardcheck bench`: the linearizability checker on a 10,000-op history
over 100 keys and 8 callers, and the driver's ops per second on the in-memory client."""
from __future__ import annotations

import random
import time

from engines.concurrency import judge, make_layout, run_layout
from engines.linearizability import check
from model.history import History, Op
from model.store import MemoryStore

__all__ = ["synthetic_history", "bench", "TARGETS"]

TARGETS = {"concurrency.checker_10k_s": 1.0, "concurrency.driver_ops_per_s": 2_000}


def synthetic_history(seed: int, *, n_ops: int = 10_000, n_keys: int = 100, n_callers: int = 8) -> History:
    """A linearizable history: each caller's ops follow one another, ops of different callers overlap, and
    every op takes effect at a random instant inside its interval (results computed in that order)."""
    rng = random.Random(seed)
    clock = [0.0] * n_callers
    placed = []
    for i in range(n_ops):
        c = rng.randrange(n_callers)
        invoked = clock[c] + rng.random() * 0.2
        length = 0.1 + rng.random() * 2.0
        clock[c] = invoked + length
        path = rng.choices(("put", "delete", "get", "get_async", "contains", "get_batch"), (4, 1, 3, 2, 2, 1))[0]
        keys = tuple(f"k{rng.randrange(n_keys)}" for _ in range(2 if path == "get_batch" else 1))
        op = Op(i, f"c{c}", path, keys, f"{keys[0]}|c{c}.{i}|".encode() if path == "put" else None,
                invoked, invoked + length, completions=1)
        placed.append((invoked + rng.random() * length, op))
    state: dict[str, bytes] = {}
    for _, op in sorted(placed, key=lambda t: t[0]):
        if op.path == "put":
            state[op.key] = op.value
        elif op.path == "delete":
            state.pop(op.key, None)
        elif op.path == "contains":
            op.result = op.key in state
        elif op.path == "get_batch":
            op.result = [state.get(k) for k in op.keys]
        else:
            op.result = state.get(op.key)
    return History([op for _, op in sorted(placed, key=lambda t: t[1].id)])


def bench(seconds: float = 2.0) -> dict:
    """Measure both figures (the driver for about `seconds`)."""
    history = synthetic_history(0)
    t = time.perf_counter()
    verdict = check(history)
    checker_s = time.perf_counter() - t
    store = MemoryStore()
    ops = runs = 0
    drive_s = judge_s = 0.0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline or runs == 0:
        layout = make_layout(runs, threads=8, ops=125, keys=20, paths=("get", "get_async", "get_batch", "contains"))
        t = time.perf_counter()
        h = run_layout(store, layout, bound=5.0)
        drive_s += time.perf_counter() - t
        t = time.perf_counter()
        judge(h)
        judge_s += time.perf_counter() - t
        ops += len(h.ops)
        runs += 1
    return {"checker_10k_s": round(checker_s, 4), "checker_linearizable": verdict.linearizable,
            "checker_steps": verdict.steps, "driver_ops_per_s": round(ops / drive_s),
            "driver_and_judge_ops_per_s": round(ops / (drive_s + judge_s)), "driver_runs": runs, "driver_ops": ops}
