"""`shardcheck bench`'s engine figures: a real LMCache deployment's set-up time and lookups per second.

- `engine.setup_s`: the median seconds to build a 2-rank deployment (Valkey servers, engines, lookup servers, the
  scheduler's client) in this process, once LMCache is imported (the first build, with the imports, is left out);
- `engine.lookups_per_s.sync` / `.async`: scheduler lookups answered per second on a 2-rank deployment holding a
  4-chunk prompt, each in vLLM's order (`lookup_cache`, `lookup`, polling; `clear_lookup_status`; every rank's
  `lookup_unpin`), one request id per lookup. The async client sleeps its backoff (10 ms) in `lookup`.
"""
from __future__ import annotations

import statistics
import time
from typing import Any

__all__ = ["measure_engine", "ENGINE_TARGETS"]

#: Printed beside the figures (never asserted): what a 60 s check needs to run thousands of lookups.
ENGINE_TARGETS = {"engine.setup_s": 1.0, "engine.lookups_per_s.sync": 200, "engine.lookups_per_s.async": 30}


def _lookups(target: Any, mode: str, seconds: float) -> float:
    from checking.serving.engine_run import run_engine_case  # noqa: F401  (the engine run's imports, as check has them)
    from model.contract import EngineRequest
    from model.engine_case import EngineCase, EnginePrompt, prompt_tokens
    from model.engine_oracle import kv_bytes

    case = EngineCase(n_ranks=2, lookup=mode, prompts=(EnginePrompt(name="p0", chunks=4),))
    dep = target.make(case)
    try:
        tokens = prompt_tokens(case, case.prompts[0], dep.chunk_size, "bench-")
        for r in range(dep.n_ranks):
            kv = [kv_bytes(("bench", c), r, c, dep.n_ranks, dep.chunk_bytes) for c in range(4)]
            dep.store(0, r, EngineRequest(id="store", tokens=tokens), kv)
        n, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < seconds:
            req = EngineRequest(id=f"bench-{n}", tokens=tokens)
            got = dep.lookup_cache(0, req)
            if got == -1:
                got = dep.lookup(0, req)
            while got is None or got == -1:
                got = dep.lookup_cache(0, req)
            dep.clear_lookup_status(0, req)
            for r in range(dep.n_ranks):
                dep.lookup_unpin(0, r, req)
            n += 1
        return n / (time.monotonic() - t0)
    finally:
        dep.close()


def measure_engine(seconds: float = 3.0, engine: str | None = None) -> dict[str, Any]:
    """The engine figures (see the module docstring), on `engine` (default: the fixed one, whose close returns)."""
    from runtime.registry import by_verdict
    from shardcheck.tables import SERVING_ENGINES
    from checking.serving.engine_search import engine_target
    from model.engine_case import EngineCase

    target = engine_target(engine or by_verdict(SERVING_ENGINES, "held")[0], engines=SERVING_ENGINES)
    case = EngineCase(n_ranks=2, lookup="sync")
    target.make(case).close()  # the imports and the first build
    builds = []
    for _ in range(3):
        t0 = time.monotonic()
        dep = target.make(case)
        builds.append(time.monotonic() - t0)
        dep.close()
    return {"engine": engine, "setup_s": round(statistics.median(builds), 3), "ranks": 2,
            "lookups_per_s": {mode: round(_lookups(target, mode, seconds), 1) for mode in ("sync", "async")}}
