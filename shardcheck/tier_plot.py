"""The two plots of `shardcheck tier` (PNG and SVG): hit vs recompute time over prompt length, with the
measured hits; aggregate GET bandwidth vs rank count, one shared server vs one per rank."""
from __future__ import annotations

from pathlib import Path

__all__ = ["plot_all"]


def plot_all(r: dict, out_dir: Path) -> list[Path]:
    """Write both plots under `out_dir` (created); the paths written."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from model.cost import t_hit, t_recompute
    from shardcheck.errors import UsageError
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--plots {out_dir}: cannot create the directory: {exc.strerror or exc}") from None
    m, v, meas = r["model"], r["verdict"], r["measured"]
    s, R, T0 = m["s"], m["R"], v["T0"]
    paths: list[Path] = []

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=80)
    points = {int(k) * m["chunk_tokens"]: t for k, t in meas["hits"].items()}
    ends = [x for row in v["by_setup"].values() if (x := row["break_even_tokens"]) is not None]
    top = max([64_000, 1.5 * max(points), *(2 * x for x in ends if x < 1e6)])
    ns = [top * i / 200 for i in range(201)]
    ax.plot(ns, [t_recompute(n, R) for n in ns], color="black", label=f"recompute (R = {R / 1e3:.1f}k tok/s)")
    for (name, row), style in zip(v["by_setup"].items(), ("-", "--", ":")):
        ax.plot(ns, [t_hit(n, s, row["B"], T0) for n in ns], style, label=f"hit, {name} ({row['B'] / 1e9:.2f} GB/s)")
    ax.plot(ns, [t_hit(n, s, v["B_star"], T0) for n in ns], color="grey", alpha=0.5, label="hit at B* = s*R")
    ax.scatter(list(points), list(points.values()), color="red", zorder=3, label="measured hits (1 rank)")
    ax.set_xlabel("prompt length (tokens)")
    ax.set_ylabel("seconds")
    ax.set_title(f"remote hit vs recompute, s = {s / 1e3:.1f} KB/token, T0 = {T0 * 1e3:.1f} ms", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths += _save(fig, out_dir / "tier-hit-vs-recompute")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=80)
    for name, label in (("shared", "one shared server"), ("per_rank", "one server per rank")):
        series = meas["bandwidth"].get(name) or {}
        if series:
            ax.plot([int(n) for n in series], [b / 1e9 for b in series.values()], "o-", label=label)
    ax.axhline(v["B_star"] / 1e9, color="grey", linestyle="--", label=f"B* = s*R ({v['B_star'] / 1e9:.2f} GB/s)")
    ax.scatter([1, 8], [r["paper"]["B_single_instance"] / 1e9, r["paper"]["B_sharded"] / 1e9], marker="x",
               color="black", label="the paper (1 instance; 8 per rank)")
    ax.set_xscale("log", base=2)
    ax.set_xticks([1, 2, 4, 8], ["1", "2", "4", "8"])
    ax.set_xlabel("rank processes")
    ax.set_ylabel("aggregate GET GB/s")
    ax.set_title(f"GET bandwidth, {m['chunk_bytes'] / 1e6:.1f} MB chunks, measured on {r['cores']} cores", fontsize=10)
    if r["cores"] < 8:
        ax.text(0.02, 0.6, f"{r['cores']} cores run every server and rank process:\nan 8-way speed-up cannot show here",
                transform=ax.transAxes, fontsize=8, color="dimgrey")
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths += _save(fig, out_dir / "tier-bandwidth")
    plt.close(fig)
    return paths


def _save(fig, stem: Path) -> list[Path]:
    out = []
    for ext in ("png", "svg"):
        path = stem.with_suffix(f".{ext}")
        fig.savefig(path, metadata={"Date": None} if ext == "svg" else None)
        out.append(path)
    return out
