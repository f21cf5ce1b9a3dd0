"""The scale benchmark of issue 12: the reference protocol at PCP8 shape (N=8, K=16, 1 fault, every cached set,
lazy initial state) on 1 and 2 local worker processes. A benchmark, never a test: `shardcheck bench` reports it."""
from __future__ import annotations

from checking.explore.shards import ShardSpec
from checking.explore.workers import explore_workers

__all__ = ["scale_bench"]


def scale_bench(*, n_ranks: int = 8, n_chunks: int = 16, max_faults: int = 1, workers: tuple[int, ...] = (1, 2),
                timeout: float = 600.0) -> dict:
    """{"n8_k16_f1_w1": {states, seconds, workers, peak_rss_mb, verdict, cpu_seconds, critical_cpu_seconds}, ...,
    "speedup": wall time of the first over the last, "cpu_speedup": the same in the busiest process's CPU time}."""
    spec = ShardSpec(protocol="model.protocols:PaperProtocol", n_ranks=n_ranks, n_chunks=n_chunks,
                     max_faults=max_faults, lazy=True)
    out: dict = {}
    for w in workers:
        res = explore_workers(spec, w, timeout=timeout)
        out[f"n{n_ranks}_k{n_chunks}_f{max_faults}_w{w}"] = {
            "states": res.states, "seconds": round(res.seconds, 3), "workers": res.workers,
            "peak_rss_mb": round(res.peak_rss_mb or 0.0, 1), "verdict": res.verdict,
            "cpu_seconds": round(res.cpu_seconds or 0.0, 3), "critical_cpu_seconds": round(res.critical_cpu_seconds or 0.0, 3)}
    first, last = out[f"n{n_ranks}_k{n_chunks}_f{max_faults}_w{workers[0]}"], \
        out[f"n{n_ranks}_k{n_chunks}_f{max_faults}_w{workers[-1]}"]
    out["speedup"] = round(first["seconds"] / last["seconds"], 2) if last["seconds"] else 0.0
    # the speedup on idle cores: one process's CPU time over the busiest shard's (the machine may be shared)
    out["cpu_speedup"] = (round(first["critical_cpu_seconds"] / last["critical_cpu_seconds"], 2)
                          if last["critical_cpu_seconds"] else 0.0)
    return out
