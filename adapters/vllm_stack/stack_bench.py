"""`bench_vllm()`: what `shardcheck bench` reports of the real vLLM stack.

- `vllm.start_s`: wall seconds from the factory's call to a stack ready to serve (the servers, the child's imports,
  the engine's build, the warm-up that compiles the sampler's logprobs op, the first reset);
- `vllm.requests_per_s`: requests served per wall second, each a distinct prompt (a miss: prefill, save to LocalCPU
  and Valkey), `batch` at a time;
- `vllm.hit_requests_per_s`: the same prompts again (hits loaded from LocalCPU);
- `vllm.start_detail`: the child's own account (`import_s`, `build_s`, `warmup_s`), and the load average.
"""
from __future__ import annotations

import os
import random
import time
from typing import Any

from adapters.vllm_stack.lmcache_fixes import PATCHED
from adapters.vllm_stack.serving_stack import VllmStack, vllm_stack
from model.contract import StackRequest

__all__ = ["bench_vllm"]

#: Steps one batch may take (a bound: a batch of this bench ends in far fewer).
_MAX_STEPS = 2000


def _serve(stack: VllmStack, requests: list[StackRequest]) -> float:
    t = time.monotonic()
    for r in requests:
        stack.submit(r)
    ids = {r.id for r in requests}
    done: set[str] = set()
    for _ in range(_MAX_STEPS):
        done |= {r.id for r in stack.step()} & ids
        if done == ids:
            return time.monotonic() - t
    raise RuntimeError(f"{len(ids - done)} bench requests did not end within {_MAX_STEPS} steps")


def bench_vllm(*, requests: int = 32, batch: int = 8, prompt_tokens: int = 256, max_tokens: int = 8,
               connector: str = PATCHED, stack: VllmStack | None = None, **options: Any) -> dict:
    """The figures of the module docstring (on `stack` if given: then `vllm.start_s` is the one it measured)."""
    load = os.getloadavg()[0]
    t = time.monotonic()
    own = stack is None
    st = stack if stack is not None else vllm_stack(1, connector=connector, **options)
    start_s = time.monotonic() - t
    try:
        st.reset()
        rng = random.Random(0)
        prompts = [StackRequest(id=f"bench-{i}", tokens=[rng.randrange(3, 1000) for _ in range(prompt_tokens)],
                                max_tokens=max_tokens) for i in range(requests)]
        miss = sum(_serve(st, prompts[i:i + batch]) for i in range(0, requests, batch))
        again = [StackRequest(id=p.id + "-again", tokens=p.tokens, max_tokens=max_tokens) for p in prompts]
        hit = sum(_serve(st, again[i:i + batch]) for i in range(0, requests, batch))
        st.reset()
        return {"vllm.start_s": round(start_s, 2) if own else round(st.info.get("start_s", 0.0), 2),
                "vllm.requests_per_s": round(requests / miss, 2), "vllm.hit_requests_per_s": round(requests / hit, 2),
                "vllm.start_detail": {k: round(v, 2) for k, v in st.info.items() if k.endswith("_s")}
                | {"load_before": round(load, 1), "load_after": round(os.getloadavg()[0], 1)}}
    finally:
        if own:
            st.close()
