"""`shardcheck bench`: throughput of the explorer, the Hypothesis layers and the Z3 proofs. A benchmark,
never a test: it measures and reports; targets are printed beside the figures, not asserted."""
from __future__ import annotations

import time
from typing import Any, Callable

__all__ = ["TARGETS", "run_bench", "format_bench", "histories_command"]

TARGETS = {"vllm.start_s": 90.0, "vllm.requests_per_s": 2.0, "vllm.hit_requests_per_s": 2.0,
           "explorer.states_per_s": 500_000, "hypothesis.protocol_steps_per_s": 5_000,
           "hypothesis.protocol_of_ceiling": 0.6, "hypothesis.store_steps_per_s": 5_000, "z3.max_theorem_s": 1.0,
           "concurrency.checker_10k_s": 1.0, "concurrency.checker_100k_s": 1.0, "concurrency.checker_1m_s": 10.0,
           "concurrency.driver_ops_per_s": 2_000}


def run_bench(*, seconds: float = 5.0, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Measure each engine for about `seconds`; the contract's bench JSON."""
    say = progress or (lambda _msg: None)
    say(f"explorer: {seconds:g} s of breadth-first search on the reference protocol ...")
    from checking.explore import bench as explorer_bench
    explorer = explorer_bench(seconds)
    say("hypothesis: rule steps per second on the protocol and store layers ...")
    from properties.layer_rates import measure
    hypothesis = measure(seconds)
    say("z3: every theorem on 10 seeds ...")
    import proofs
    t = time.monotonic()
    results = proofs.run_all(seeds=10)
    z3 = {"max_theorem_s": max(r["seconds"] for r in results), "theorems": len(results),
          "wall_s": round(time.monotonic() - t, 3)}
    say("concurrency: the linearizability checker on 10,000-, 100,000- and 1,000,000-op histories, the driver on "
        "the in-memory client ...")
    from checking.concurrency_bench import bench as concurrency_bench
    concurrency = concurrency_bench(min(seconds, 2.0))
    say("scale: the explorer at N=8, K=16, 1 fault on 1 and 2 worker processes ...")
    from checking.explore.scale import scale_bench
    scale = scale_bench()
    say("real: a --runner processes case and a full `shardcheck tier`, each from a fresh interpreter ...")
    from shardcheck.bench_real import measure_real
    real = measure_real()
    say("engine: a real LMCache deployment's set-up, and its sync and async lookups per second ...")
    from shardcheck.bench_engine import measure_engine
    engine = measure_engine(min(seconds, 3.0))
    say("vllm: a real vLLM stack's start, and its requests per second (misses, then hits) ...")
    vllm = measure_vllm()
    compiled = native_status()
    explorer["compiled"] = compiled["checking.explore"]["compiled"]
    concurrency["compiled"] = compiled["checking.linearizability"]["compiled"]
    return {"explorer": explorer, "hypothesis": hypothesis, "z3": z3, "concurrency": concurrency, "scale": scale,
            "real": real, "engine": engine, "vllm": vllm, "compiled": compiled}


def measure_vllm() -> dict[str, Any]:
    """`vllm.start_s`, `vllm.requests_per_s` (`adapters.vllm_stack.stack_bench`); where vLLM cannot start here, the
    reason in `vllm.unavailable` and no figures (a benchmark reports, it never fails on a missing optional stack)."""
    try:
        from adapters.vllm_stack.stack_bench import bench_vllm
        return {k.removeprefix("vllm."): v for k, v in bench_vllm().items()}
    except Exception as exc:  # noqa: BLE001 -- reported in the output, never a figure
        return {"unavailable": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]}


def native_status() -> dict[str, dict[str, Any]]:
    """Per compiled package (`checking.native`): whether its compiled modules ran, and if not why."""
    import checking.explore  # noqa: F401 -- imported, so that the status covers it
    import checking.linearizability  # noqa: F401
    from checking.native import status
    return status()


def _compiled_line(status: dict[str, dict[str, Any]]) -> str:
    return "(compiled: " + ", ".join(f"{p} {'yes' if s['compiled'] else 'no, ' + s.get('why', '')}"
                                     for p, s in status.items()) + ")"


def format_bench(r: dict[str, Any]) -> str:
    rows = [("explorer.states_per_s", r["explorer"]["states_per_s"]),
            ("hypothesis.protocol_steps_per_s", r["hypothesis"]["protocol_steps_per_s"]),
            ("hypothesis.protocol_of_ceiling", r["hypothesis"].get("protocol_of_ceiling", 0.0)),
            ("hypothesis.store_steps_per_s", r["hypothesis"]["store_steps_per_s"]),
            ("z3.max_theorem_s", r["z3"]["max_theorem_s"])]
    if "concurrency" in r:
        rows += [("concurrency.checker_10k_s", r["concurrency"]["checker_10k_s"]),
                 ("concurrency.checker_100k_s", r["concurrency"]["checker_100k_s"])]
        if r["concurrency"].get("checker_1m_s") is not None:
            rows.append(("concurrency.checker_1m_s", r["concurrency"]["checker_1m_s"]))
        rows.append(("concurrency.driver_ops_per_s", r["concurrency"]["driver_ops_per_s"]))
    rows += [(f"real.{k}", r["real"][k]) for k in ("processes_case_s", "tier_s")] if "real" in r else []
    if "engine" in r:
        rows += [("engine.setup_s", r["engine"]["setup_s"]),
                 ("engine.lookups_per_s.sync", r["engine"]["lookups_per_s"]["sync"]),
                 ("engine.lookups_per_s.async", r["engine"]["lookups_per_s"]["async"])]
    vllm = r.get("vllm", {})
    if "start_s" in vllm:
        rows += [(f"vllm.{k}", vllm[k]) for k in ("start_s", "requests_per_s", "hit_requests_per_s")]
    out = [f"{'figure':<34} {'measured':>12} {'target':>10}  met"]
    from shardcheck.bench_engine import ENGINE_TARGETS
    from shardcheck.bench_real import TARGETS as REAL
    for name, value in rows:
        target = {**TARGETS, **REAL, **ENGINE_TARGETS}[name]
        met = value <= target if name.startswith(("z3", "real", "concurrency.checker_", "engine.setup", "vllm.start")) \
            else value >= target
        out.append(f"{name:<34} {value:>12,.2f} {target:>10,}  {'yes' if met else 'NO'}")
    if "unavailable" in vllm:
        out.append(f"(vllm: not measured: {vllm['unavailable']})")
    if "compiled" in r:
        out.append(_compiled_line(r["compiled"]))
    out.append(f"(explorer: {r['explorer']['states']:,} distinct states in {r['explorer']['seconds']:.2f} s, "
               f"{r['explorer'].get('cpu_seconds', 0.0):.2f} s of CPU)")
    if "protocol_ceiling_steps_per_s" in r["hypothesis"]:
        out.append(f"(hypothesis: the same rules doing nothing run {r['hypothesis']['protocol_ceiling_steps_per_s']:,.0f} "
                   "steps/s in the same run: the ceiling Hypothesis itself puts on the protocol layer)")
    for name, row in r.get("scale", {}).items():
        if isinstance(row, dict):
            out.append(f"scale.{name}: {row['verdict']}, {row['states']:,} states in {row['seconds']:.2f} s on "
                       f"{row['workers']} worker(s), peak {row['peak_rss_mb']:.0f} MB per worker")
        else:
            out.append(f"scale.{name}: {row:.2f}x")
    return "\n".join(out)


def histories_command(directory: str | None, write: str | None, *, as_json: bool, repeat: int | None = None) -> int:
    """`shardcheck bench --histories DIR [--write-histories DIR] [--repeat N]`: the checker on a directory of history
    files (the same files another checker can read), one row per file, each the best of `repeat` runs. Exit 0; 2 on a
    bad directory, file or option."""
    import os
    import sys

    from checking.concurrency_bench import check_directory, write_histories
    from shardcheck.errors import EXIT_USAGE
    if repeat is not None and (repeat < 1 or not directory):
        why = f"--repeat must be at least 1, not {repeat}" if repeat < 1 else "--repeat needs --histories DIR"
        print(f"shardcheck bench: {why}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if write:
            paths = write_histories(write)
            print(f"wrote {len(paths)} histories into {write}", file=sys.stderr)
        rows = check_directory(directory, repeat=repeat or 1) if directory else []
    except (OSError, ValueError) as exc:
        print(f"shardcheck bench: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if directory and not rows:
        print(f"shardcheck bench: no *.json history in {directory}", file=sys.stderr)
        return EXIT_USAGE
    compiled = native_status()["checking.linearizability"]
    for row in rows:
        row["compiled"] = compiled["compiled"]
    if as_json:
        from shardcheck.output import print_json
        print_json(rows)
        return 0
    best = f"best of {repeat}" if repeat and repeat > 1 else "one run"
    print(_compiled_line({"checking.linearizability": compiled}))
    print(f"{'file':<40} {'ops':>8} {'verdict':>10} {'seconds':>9} {'cpu s':>9}  method   ({best})")
    for row in rows:
        v = row["verdict"]
        verdict = {True: "ok", False: "violated", None: "undecided"}[v["linearizable"]]
        methods = ",".join(f"{k}:{n}" for k, n in sorted(v["methods"].items()))
        print(f"{os.path.basename(row['file']):<40} {row['n_ops']:>8,} {verdict:>10} {row['seconds']:>9.4f} "
              f"{row['cpu_seconds']:>9.4f}  {methods}" + (f"  ({v['why']})" if v.get("why") else "")
              + ("  (the verdict changed between runs)" if row["verdict_changed"] else ""))
    return 0
