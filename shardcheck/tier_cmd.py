"""`shardcheck tier`: measure a KV tier through the real LMCache client and apply the paper's cost model.

Bytes per token come from a model shape (layers x KV heads x head dim x 2 x dtype bytes) or a preset; a chunk
is `--chunk-tokens` (LMCache's 256) tokens of it. The verdict applies `model.cost`: the measured bandwidth B
against B* = s*R, the prompt length above which a hit beats recompute (or none), and rho = lam*bytes/B.
Exit 0 when it measured, 2 on unusable input or an unreachable server (one line).
"""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from shardcheck.errors import EXIT_HELD, UsageError
from shardcheck.output import print_json

__all__ = ["PRESETS", "add_arguments", "cmd_tier", "bytes_per_token", "verdict"]

#: Assumed recompute rate of the open-model presets: 2 * params FLOPs per token at 40% of one H100's dense
#: BF16 peak (989 TFLOP/s). An estimate to start from; pass --recompute-rate with your own prefill throughput.
_H100_AT_40 = 0.4 * 989e12

#: name -> (layers, KV heads, head dim, dtype bytes, params) for the open models; the paper's figures as given.
SHAPES = {"llama-3.1-8b": (32, 8, 128, 2, 8.0e9), "qwen2.5-7b": (28, 4, 128, 2, 7.6e9)}


def bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """KV bytes one token adds: layers x KV heads x head dim x 2 (K and V) x dtype bytes."""
    return layers * kv_heads * head_dim * 2 * dtype_bytes


def _presets() -> dict[str, dict]:
    from model.cost import PAPER
    out = {"paper": {"s": PAPER.s, "R": PAPER.R, "source": "the paper: GLM-5.3 FP8 on 8xB300, PCP8 (model.cost.PAPER)"}}
    for name, (layers, heads, dim, dtype, params) in SHAPES.items():
        out[name] = {"s": float(bytes_per_token(layers, heads, dim, dtype)), "R": _H100_AT_40 / (2 * params),
                     "source": f"{layers} layers x {heads} KV heads x {dim} head dim x 2 x {dtype} bytes (BF16); R "
                               f"assumed: 2 x {params / 1e9:g}B params FLOPs/token at 40% of an H100's 989 TFLOP/s"}
    return out


PRESETS = _presets()


def add_arguments(p: Any) -> None:
    p.add_argument("--url", action="append", default=None, metavar="URL",
                   help="a running server (redis://[:PW@]HOST:PORT); once: one shared server, several: one per rank "
                        "(default: embedded Valkey servers on free 127.0.0.1 ports)")
    p.add_argument("--model", default="paper", choices=sorted(PRESETS), help="bytes/token and recompute-rate preset (default: paper)")
    p.add_argument("--bytes-per-token", type=float, default=None, metavar="S", help="KV bytes per token (default: the preset's)")
    p.add_argument("--recompute-rate", type=float, default=None, metavar="R", help="prefill tokens/s (default: the preset's)")
    p.add_argument("--chunk-tokens", type=int, default=256, help="tokens per chunk (default 256, LMCache's)")
    p.add_argument("--arrival-rate", type=float, default=None, metavar="LAM", help="hits/s for rho (default: paper's)")
    p.add_argument("--hit-tokens", type=float, default=None, help="tokens per hit for rho (default: paper's median)")
    p.add_argument("--seconds", type=float, default=1.5, help="seconds of GETs per measured point (default 1.5)")
    p.add_argument("--plots", default="shardcheck-tier", metavar="DIR", help="where the PNG and SVG plots go (default: shardcheck-tier)")
    p.add_argument("--json", action="store_true", help="print every figure as JSON (default: a report)")
    p.add_argument("--engine", default=None, metavar="NAME",
                   help="measure the model's terms on a real serving stack instead (vllm): R from its misses, s its "
                        "own, B of its own server, T0 from its hits; the prediction beside each measurement "
                        "(default: none, the tier alone)")
    from adapters.vllm_stack.lmcache_fixes import PATCHED  # (light: no vLLM, no LMCache)
    p.add_argument("--connector", default=PATCHED, metavar="NAME",
                   help=f"with --engine: the KV connector (default: {PATCHED})")


def _positive(name: str, value: float | None) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise UsageError(f"{name} must be a positive number, got {value:g}")


def verdict(*, s: float, R: float, T0: float, bandwidths: dict[str, float], lam: float, hit_bytes: float) -> dict:
    """The cost model applied to each measured bandwidth: B vs B*, the break-even prompt length, rho."""
    from model.cost import break_even_bandwidth, hit_threshold_tokens, utilisation
    b_star = break_even_bandwidth(s, R)
    rows = {}
    for name, B in bandwidths.items():
        rho = utilisation(lam, hit_bytes, B)
        rows[name] = {"B": B, "B_over_B_star": B / b_star, "pays": B > b_star,
                      "break_even_tokens": hit_threshold_tokens(s, R, B, T0), "rho": rho, "stable": rho < 1}
    return {"B_star": b_star, "T0": T0, "floor_tokens": R * T0, "lam": lam, "hit_bytes": hit_bytes, "by_setup": rows}


def _scaling_note(cores: int, measured: dict) -> str:
    per, shared = measured["bandwidth"].get("per_rank", {}), measured["bandwidth"]["shared"]
    top = max(per, key=int) if per else None
    told = (f"one server per rank at N={top}: {per[top] / shared['1']:.2f}x one rank on one server, "
            f"{per[top] / shared[top]:.2f}x {top} ranks on one shared server" if top else "no per-rank servers measured")
    if cores < 8:
        return (f"{told}, on {cores} core(s) that also run every server and rank process: N processes here cannot "
                f"show an 8-way speed-up, so this neither confirms nor refutes the paper's 6.3x (10.76 vs 1.71 GB/s)")
    return f"{told}, on {cores} cores (the paper: 6.3x, 10.76 vs 1.71 GB/s with one Valkey per rank on 8 ranks)"


def run_tier(args: Any, progress: Any = None) -> dict:
    """`shardcheck tier` as a function: every figure, the verdict and the plot paths (a dict)."""
    from model.cost import PAPER
    for name in ("bytes_per_token", "recompute_rate", "arrival_rate", "hit_tokens", "seconds"):
        _positive("--" + name.replace("_", "-"), getattr(args, name))
    if args.chunk_tokens < 1:
        raise UsageError(f"--chunk-tokens must be at least 1, got {args.chunk_tokens}")
    preset = PRESETS[args.model]
    s = args.bytes_per_token or preset["s"]
    R = args.recompute_rate or preset["R"]
    lam = args.arrival_rate or PAPER.lam
    hit_tokens = args.hit_tokens or PAPER.bytes_per_hit / PAPER.s
    chunk_bytes = int(round(args.chunk_tokens * s))
    from adapters.tier_measure import TierError, Unreachable, measure_tier, parse_url
    try:
        for u in args.url or ():
            parse_url(u)
        measured = measure_tier(chunk_bytes=chunk_bytes, urls=args.url, seconds=args.seconds, progress=progress)
    except (ValueError, Unreachable) as exc:
        raise UsageError(str(exc)) from None
    except TierError as exc:
        raise UsageError(f"the measurement failed: {exc}") from None
    bw = measured["bandwidth"]
    setups = {"1 rank, 1 server": bw["shared"]["1"]}
    for name, label in (("shared", "1 shared server"), ("per_rank", "1 server per rank")):
        if bw.get(name):  # the best of N = 1..8 rank processes
            best = max(bw[name], key=lambda n: bw[name][n])
            setups[f"{best} rank{'s' if best != '1' else ''}, {label} (best N)"] = bw[name][best]
    cores = measured["cores"] or 1
    out = {"model": {"preset": args.model, "s": s, "R": R, "chunk_tokens": args.chunk_tokens,
                     "chunk_bytes": chunk_bytes, "source": preset["source"] if not (args.bytes_per_token or
                                                                                   args.recompute_rate) else "given"},
           "measured": measured, "cores": cores, "scaling": _scaling_note(cores, measured),
           "verdict": verdict(s=s, R=R, T0=measured["t0"], bandwidths=setups, lam=lam, hit_bytes=hit_tokens * s),
           "paper": {"B_single_instance": PAPER.B_single_instance, "B_sharded": PAPER.B_sharded, "T0": PAPER.T0,
                     "B_star": PAPER.break_even_bandwidth()}}
    from shardcheck.tier_plot import plot_all
    out["plots"] = [str(p) for p in plot_all(out, Path(args.plots))]
    return out


def _gb(x: float) -> str:
    return f"{x / 1e9:.2f} GB/s"


def format_tier(r: dict) -> str:
    """The human summary: figures, the scaling caveat, the verdict in plain words."""
    m, v, meas = r["model"], r["verdict"], r["measured"]
    lines = [f"tier: {meas['source']} servers, chunk {m['chunk_tokens']} tokens x {m['s'] / 1e3:.1f} KB/token = "
             f"{m['chunk_bytes'] / 1e6:.1f} MB, recompute R = {m['R'] / 1e3:.1f}k tokens/s ({m['preset']})",
             f"{'ranks':>5}  {'shared GET':>12}  {'per-rank GET':>12}  {'p50/p99 shared':>16}  {'p50/p99 per rank':>16}"]
    for n in meas["bandwidth"]["shared"]:
        per = meas["bandwidth"].get("per_rank", {}).get(n)
        ls, lp = meas["latency"]["shared"][n], meas["latency"].get("per_rank", {}).get(n)
        lines.append(f"{n:>5}  {_gb(meas['bandwidth']['shared'][n]):>12}  {_gb(per) if per else '-':>12}  "
                     f"{ls['p50'] * 1e3:6.1f}/{ls['p99'] * 1e3:5.1f} ms  "
                     + (f"{lp['p50'] * 1e3:6.1f}/{lp['p99'] * 1e3:5.1f} ms" if lp else "-"))
    lines.append(f"cores: {r['cores']}. {r['scaling']}")
    lines.append(f"T0 (one-chunk hit through the client, end to end): {v['T0'] * 1e3:.1f} ms (the paper's engine-level "
                 f"T0: {r['paper']['T0']:.2f} s); hit floor R*T0 = {v['floor_tokens']:,.0f} tokens")
    lines.append(f"B* = s*R = {_gb(v['B_star'])}; rho at {v['lam']:g} hits/s of {v['hit_bytes'] / 1e9:.2f} GB:")
    for name, row in v["by_setup"].items():
        be = row["break_even_tokens"]
        pays = (f"a hit beats recompute above {be:,.0f} tokens" if be is not None
                else "no prompt length makes a hit beat recompute")
        lines.append(f"  {name}: B = {_gb(row['B'])} {'>' if row['pays'] else '<='} B*: {pays}; rho = {row['rho']:.2f} "
                     f"({'stable' if row['stable'] else 'unstable: synchronous loading falls behind'})")
    lines.append("plots: " + ", ".join(r["plots"]))
    return "\n".join(lines)


def run_stack_tier(args: Any, progress: Any = None) -> dict:
    """`shardcheck tier --engine vllm`: the cost model's terms measured on the stack, its predictions beside the
    measurements (`adapters.vllm_stack.stack_tier`); the stack is started and closed here."""
    if args.engine != "vllm":
        raise UsageError(f"tier --engine {args.engine!r}: only vllm has a KV tier to measure (a Valkey per rank)")
    if args.url:
        raise UsageError("tier --engine vllm measures the stack's own servers: --url does not apply")
    from adapters.vllm_stack import vllm_stack
    from adapters.vllm_stack.stack_tier import measure_stack_tier
    step = progress or (lambda text: None)
    step("starting the vLLM stack (about a minute)")
    stack = vllm_stack(1, connector=args.connector)
    try:
        out = measure_stack_tier(stack, seconds=args.seconds, progress=step)
    finally:
        left = stack.close()
    out.update({"engine": args.engine, "connector": args.connector, "left_running": left})
    return out


def format_stack_tier(r: dict) -> str:
    """The stack's terms, then per prompt length the measured time to first token beside the model's."""
    be = r["break_even_tokens"]
    rate = (lambda v: "not measurable (no slope above the noise)" if v == float("inf") else f"{v / 1e3:.1f}k tokens/s")
    lines = [f"tier on the {r['engine']} stack ({r['connector']}): s = {r['s'] / 1e3:.1f} KB/token, "
             f"R = {rate(r['R'])} (misses), B = {_gb(r['B'])} (GETs of its server), "
             f"T0 = {r['T0'] * 1e3:.1f} ms (hits' intercept); the hits' own slope gives {_gb(r['B_stack'])}",
             f"B* = s*R = {_gb(r['B_star'])}: " + (f"a hit beats recompute above {be:,.0f} tokens" if be is not None
                                                   else "no prompt length makes a hit beat recompute here"),
             "(each figure the best of its repeats; a hit not served whole from the tier is left out and counted)",
             f"{'tokens':>7}  {'miss':>9} {'n/R+c':>9} {'err':>6}   {'hit':>9} {'T0+ns/B':>9} {'err':>6}  not hits"]
    for row in r["rows"]:
        hit = (f"{row['hit_s'] * 1e3:7.1f}ms {row['predicted_hit_s'] * 1e3:7.1f}ms {row['hit_error']:+6.0%}"
               if row["hit_s"] is not None else f"{'-':>9} {row['predicted_hit_s'] * 1e3:7.1f}ms {'-':>6}")
        lines.append(f"{row['tokens']:>7}  {row['miss_s'] * 1e3:7.1f}ms {row['predicted_miss_s'] * 1e3:7.1f}ms "
                     f"{row['miss_error']:+6.0%}   {hit}  {row['not_hits']}/{len(row['reported'])}")
    return "\n".join(lines)


def cmd_tier(args: Any) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    steps = (3 + 5 + 1) if args.engine else 2 + 2 * (1 + 4) + 1 + (1 if args.url else 0)
    with Progress(TextColumn("{task.description:<48}"), BarColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("measuring the tier", total=steps)
        advance = lambda text: bar.update(task, advance=1, description=text)  # noqa: E731
        result = run_stack_tier(args, advance) if args.engine else run_tier(args, progress=advance)
    if args.json:
        print_json(result)
    else:
        print(format_stack_tier(result) if args.engine else format_tier(result))
    sys.stdout.flush()
    return EXIT_HELD
