"""Figures of the concurrent layer for `shardcheck bench`: the linearizability checker on generated histories
(10,000 ops over 100 keys and 8 callers; 100,000 and 1,000,000 ops over 4 keys and 16 callers), the driver's ops per second
on the in-memory client, and the checker over a directory of history JSON files (`check_directory`), which
`write_histories` fills with the same kind of histories so another checker can be run on the same files."""
from __future__ import annotations

import json
import math
import os
import random
import time
from typing import Iterable

from checking.concurrency import make_layout, run_layout
from checking.concurrency_judge import judge
from checking.linearizability import check
from model.history import History, Op
from model.store import MemoryStore

__all__ = ["synthetic_history", "write_histories", "read_history_file", "check_directory", "bench", "TARGETS",
           "SPECS"]

TARGETS = {"concurrency.checker_10k_s": 1.0, "concurrency.checker_100k_s": 1.0, "concurrency.checker_1m_s": 10.0,
           "concurrency.driver_ops_per_s": 2_000}

_PATHS = ("put", "delete", "get", "get_async", "contains", "get_batch")
_WEIGHTS = (4, 1, 3, 2, 2, 1)


def synthetic_history(seed: int, *, n_ops: int = 10_000, n_keys: int = 100, n_callers: int = 8,
                      pending: float = 0.0, stale: bool = False) -> History:
    """A linearizable history: each caller's ops follow one another, ops of different callers overlap, and
    every op takes effect at a random instant inside its interval (results computed in that order); every put
    writes a value unique to its key. `pending`: the fraction of ops that never complete (the caller goes on,
    as with a read left in flight); such a write takes effect, at a random instant after its call, or never,
    each half the time. `stale`: one read in the middle answers a value overwritten before it was called (the
    history is then not linearizable)."""
    rng = random.Random(seed)
    clock = [0.0] * n_callers
    placed = []
    for i in range(n_ops):
        c = rng.randrange(n_callers)
        invoked = clock[c] + rng.random() * 0.2
        length = 0.1 + rng.random() * 2.0
        clock[c] = invoked + length
        path = rng.choices(_PATHS, _WEIGHTS)[0]
        keys = tuple(f"k{rng.randrange(n_keys)}" for _ in range(2 if path == "get_batch" else 1))
        op = Op(i, f"c{c}", path, keys, f"{keys[0]}|c{c}.{i}|".encode() if path == "put" else None,
                invoked, invoked + length, completions=1)
        at = invoked + rng.random() * length
        if pending and rng.random() < pending:
            op.completed, op.completions = None, 0
            at = invoked + rng.random() * length * 20 if rng.random() < 0.5 else None
        if at is not None:
            placed.append((at, op))
        elif op.path in ("put", "delete"):
            placed.append((float("inf"), op))  # never takes effect
        else:
            placed.append((invoked, op))
    state: dict[str, bytes] = {}
    for at, op in sorted(placed, key=lambda t: t[0]):
        if at == float("inf"):
            continue
        if op.path == "put":
            state[op.key] = op.value
        elif op.path == "delete":
            state.pop(op.key, None)
        elif op.pending:
            continue
        elif op.path == "contains":
            op.result = op.key in state
        elif op.path == "get_batch":
            op.result = [state.get(k) for k in op.keys]
        else:
            op.result = state.get(op.key)
    ops = [op for _, op in sorted(placed, key=lambda t: t[1].id)]
    if stale:
        _inject_stale_read(ops)
    return History(ops)


def _inject_stale_read(ops: list[Op]) -> None:
    """Make one completed get in the middle of `ops` answer the value of a put that a later completed put of
    the same key followed, both completed before the get was called: no linearization can order that."""
    done_puts: dict[str, list[Op]] = {}
    for op in sorted(ops, key=lambda o: o.invoked):
        if op.path == "put" and not op.pending:
            done_puts.setdefault(op.key, []).append(op)
    for op in ops[len(ops) // 2:]:
        if op.path not in ("get", "get_async") or op.pending:
            continue
        puts = [p for p in done_puts.get(op.key, ()) if p.completed < op.invoked]
        for later in reversed(puts):
            older = [p for p in puts if p.completed < later.invoked]
            if older:
                op.result = older[-1].value
                return
    raise ValueError("no read to make stale in this history")


def _spec(n: int, k: int, c: int, p: float, s: bool) -> tuple:
    return f"h{n // 1000}k-k{k}-c{c}-p{p:g}{'-stale' if s else ''}", n, k, c, p, s


#: The side-by-side histories: (name, n_ops, n_keys, n_callers, pending fraction, stale read). 1k-100k ops, 4 or
#: 256 keys, 4 or 16 callers, 0 or 1% never completing, each with and without a stale read; at 100k ops also 0.1%
#: and 10% never completing (4 keys with 4 or 16 callers, 256 keys with 16).
SPECS = tuple(_spec(n, k, c, p, s) for n in (1_000, 10_000, 100_000) for k in (4, 256) for c in (4, 16)
              for p, s in ((0.0, False), (0.0, True), (0.01, False), (0.01, True))) \
    + tuple(_spec(100_000, k, c, p, s) for k, c in ((4, 16), (4, 4), (256, 16)) for p in (0.001, 0.1)
            for s in (False, True))


def write_histories(directory: str, specs: Iterable[tuple] = SPECS, *, seed: int = 0) -> list[str]:
    """Write one JSON file per spec into `directory` (created; an existing file is not overwritten: ValueError):
    {"spec": {...}, "history": [op, ...]} with ops as `model.history.Op.to_json` writes them. Returns the paths."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for name, n_ops, n_keys, n_callers, pending, stale in specs:
        path = os.path.join(directory, f"{name}.json")
        if os.path.exists(path):
            raise ValueError(f"{path} exists: not overwritten")
        h = synthetic_history(seed, n_ops=n_ops, n_keys=n_keys, n_callers=n_callers, pending=pending, stale=stale)
        spec = {"name": name, "ops": n_ops, "keys": n_keys, "callers": n_callers, "pending": pending,
                "violation": stale, "seed": seed}
        with open(path, "x") as f:
            json.dump({"spec": spec, "history": h.to_json()}, f)
        paths.append(path)
    return paths


def read_history_file(path: str) -> tuple[dict, History]:
    """(spec, history) of one file: the object `write_histories` writes, or a bare list of ops (spec {})."""
    with open(path) as f:
        data = json.load(f)
    if isinstance(data, list):
        return {}, History.from_json(data)
    if not isinstance(data, dict) or not isinstance(data.get("history"), list):
        raise ValueError(f"{path}: not a history (want a list of ops or an object with a 'history' list)")
    return dict(data.get("spec") or {}), History.from_json(data["history"])


def check_directory(directory: str, *, seconds: float = 60.0, repeat: int = 1, **check_options) -> list[dict]:
    """Run the checker on every `*.json` history in `directory` (sorted by name): one row per file with the
    spec, the verdict and the checker's seconds (reading the file not included); each file is bounded by `seconds`
    (then undecided). With `repeat` > 1 each file is checked that many times and the row holds the least wall and CPU
    seconds (the best of N, as another checker's harness reports it); `verdict_changed` says if a verdict differed."""
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, not {repeat}")
    names = sorted(n for n in os.listdir(directory) if n.endswith(".json"))
    rows = []
    for name in names:
        spec, history = read_history_file(os.path.join(directory, name))
        wall = cpu = math.inf
        seen = set()
        for _ in range(repeat):
            t, c = time.perf_counter(), time.process_time()
            verdict = check(history, seconds=seconds, **check_options)
            cpu = min(cpu, time.process_time() - c)
            wall = min(wall, time.perf_counter() - t)
            seen.add(verdict.linearizable)
        rows.append({"file": name, "spec": spec, "n_ops": len(history.ops), "seconds": round(wall, 6),
                     "cpu_seconds": round(cpu, 6), "runs": repeat, "verdict_changed": len(seen) > 1,
                     "verdict": verdict.to_json()})
    return rows


def _time_check(history: History) -> tuple[float, object]:
    t = time.perf_counter()
    verdict = check(history)
    return time.perf_counter() - t, verdict


def bench(seconds: float = 2.0, *, million: bool = True) -> dict:
    """Measure the checker figures and the driver (for about `seconds`, plus the checker's runs; `million=False`
    leaves out the 1,000,000-op history, whose generation alone takes about 10 s)."""
    checker_s, verdict = _time_check(synthetic_history(0))
    big_s, big = _time_check(synthetic_history(0, n_ops=100_000, n_keys=4, n_callers=16))
    huge_s, huge = _time_check(synthetic_history(0, n_ops=1_000_000, n_keys=4, n_callers=16)) if million else (None, None)
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
            "checker_steps": verdict.steps, "checker_100k_s": round(big_s, 4),
            "checker_100k_linearizable": big.linearizable,
            "checker_1m_s": None if huge_s is None else round(huge_s, 4),
            "checker_1m_linearizable": None if huge is None else huge.linearizable, "driver_ops_per_s": round(ops / drive_s),
            "driver_and_judge_ops_per_s": round(ops / (drive_s + judge_s)), "driver_runs": runs, "driver_ops": ops}
