"""`measure_stack_tier(stack)`: the paper's two-term cost model measured on the real vLLM stack.

Per prompt length n (tokens, whole chunks plus one), `repeats` times each, a fresh prompt is served once with no
cached KV (a miss: time to first token = prefill of n tokens) and then, once its remote writes landed and its chunks
are evicted from LMCache's LocalCPU tier, again, so the hit is loaded from the rank's Valkey server (a hit: the
lookup, the GETs, one token computed). Time to first token is the wall time from `submit` to the request's end with
`max_tokens=1`. Each length's figure is the best of its repeats (the machine's other work only ever adds time); a
"hit" that did not report the whole prefix from the tier is not a hit: it is left out of the fit and counted in the
row (`not_hits`). The model's terms:

- `R` (prefill tokens/s): 1 / the slope of the misses' least-squares line (`model.cost.fit_line`);
- `s` (KV bytes per token and rank): the stack's own (`VllmStack.chunk_bytes / chunk_size`);
- `B` (the tier's bandwidth per rank): GETs of the stack's chunk size through LMCache's own client on the stack's own
  Valkey server (`adapters.tier_measure.measure_tier`, one rank process), measured apart from the stack;
- `T0` (a hit's fixed cost): the intercept of the hits' line.

The prediction for each n is `T0 + n*s/B` for a hit and `n/R` (plus the misses' intercept, the stack's per-request
cost) for a miss; the hits' own slope gives the bandwidth the stack achieved (`B_stack`).
"""
from __future__ import annotations

import random
import statistics
import time
from typing import Any, Callable, Sequence

from model.contract import StackRequest
from model.cost import break_even_bandwidth, fit_line, hit_threshold_tokens, t_hit

__all__ = ["measure_stack_tier", "LENGTHS"]

#: Prompt lengths measured (chunks of the stack's chunk size; one token more, computed on a hit): up to 3,073 tokens,
#: for slopes the machine's noise does not swamp (the tiny model prefills 256 tokens in about 10 ms).
LENGTHS = (4, 12, 24, 36, 47)
#: Steps one request may take (a bound: a request here ends in a few).
_MAX_STEPS = 500


def _ttft(stack: Any, request: StackRequest) -> tuple[float, int | None]:
    t = time.monotonic()
    stack.submit(request)
    for _ in range(_MAX_STEPS):
        for r in stack.step():
            if r.id == request.id:
                if r.status != "finished":
                    raise RuntimeError(f"tier request {request.id} ended {r.status}")
                return time.monotonic() - t, r.reported
    raise RuntimeError(f"tier request {request.id} did not end within {_MAX_STEPS} steps")


def measure_stack_tier(stack: Any, *, lengths: Sequence[int] = LENGTHS, repeats: int = 5, seconds: float = 1.0,
                       progress: Callable[[str], None] | None = None) -> dict:
    """Every figure of the module docstring, and the model's prediction beside each measurement."""
    from adapters.tier_measure import measure_tier
    step = progress or (lambda text: None)
    rng = random.Random(0)
    chunk = stack.chunk_size
    s = stack.chunk_bytes / chunk
    rows = []
    stack.reset()
    step("warming up: one miss and one hit, not counted")
    warm = [rng.randrange(3, 1000) for _ in range(max(lengths) * chunk + 1)]
    _ttft(stack, StackRequest(id="tier-warm-miss", tokens=warm, max_tokens=1))
    _ttft(stack, StackRequest(id="tier-warm-hit", tokens=warm, max_tokens=1))
    stack.reset()
    for chunks in lengths:
        n = chunks * chunk + 1
        step(f"prompts of {n} tokens: {repeats} misses and hits from the server")
        misses, hits, reported = [], [], []
        for i in range(repeats):
            tokens = [rng.randrange(3, 1000) for _ in range(n)]
            miss, _ = _ttft(stack, StackRequest(id=f"tier-{n}-{i}-miss", tokens=tokens, max_tokens=1))
            probe = StackRequest(id=f"tier-{n}-{i}-hit", tokens=tokens, max_tokens=1)
            stack.wait_puts(30.0)  # the hit is read from the server: its chunks must be there
            for rank in range(stack.n_ranks):  # ... and not in LocalCPU
                for key in stack.chunk_keys(rank, probe):
                    stack.evict(rank, key, "local")
            hit, got = _ttft(stack, probe)
            misses.append(miss)
            reported.append(got)
            if got == n - 1:
                hits.append(hit)
        rows.append({"tokens": n, "miss_s": min(misses), "hit_s": min(hits) if hits else None,
                     "reported": reported, "not_hits": repeats - len(hits), "misses": misses, "hits": hits})
        stack.reset()
    fitted = [r for r in rows if r["hit_s"] is not None]
    if len(fitted) < 2:
        raise RuntimeError(f"tier --engine: only {len(fitted)} prompt lengths had a hit served from the tier "
                           f"(reported: {[r['reported'] for r in rows]}): the stack does not load from its server")
    a_miss, miss_slope = fit_line([r["tokens"] for r in rows], [r["miss_s"] for r in rows])
    T0, hit_slope = fit_line([r["tokens"] - 1 for r in fitted], [r["hit_s"] for r in fitted])
    R = 1.0 / miss_slope if miss_slope > 0 else float("inf")
    B_stack = s / hit_slope if hit_slope > 0 else float("inf")
    step("the tier's bandwidth: GETs through LMCache's client on the stack's own server")
    host, port = stack.endpoints[0]
    tier = measure_tier(chunk_bytes=int(stack.chunk_bytes), urls=[f"resp://{host}:{port}"], seconds=seconds,
                        rank_counts=(1,), t0_repeats=5)
    B = tier["bandwidth"]["shared"]["1"]
    for r in rows:
        n = r["tokens"] - 1
        r["predicted_hit_s"] = t_hit(n, s, B, T0)
        r["predicted_miss_s"] = a_miss + r["tokens"] / R
        r["hit_error"] = r["hit_s"] / r["predicted_hit_s"] - 1 if r["hit_s"] is not None else None
        r["miss_error"] = r["miss_s"] / r["predicted_miss_s"] - 1
    return {"s": s, "R": R, "B": B, "B_stack": B_stack, "T0": T0, "miss_intercept": a_miss, "chunk_tokens": chunk,
            "B_star": break_even_bandwidth(s, R), "break_even_tokens": hit_threshold_tokens(s, R, B, T0),
            "rows": rows, "tier_t0": tier["t0"]}
