"""`shardcheck explore`: exhaustive exploration of one configuration, in one process, on local worker processes
(`--workers`) or on a Ray cluster (`--ray auto|ADDRESS`).

Exit 0: every reachable state checked, no violation; 1: a violation (its trace written under `--out`, if given);
2: unusable input (one line naming it), or a run that could not complete (a shard that kept failing, the
`--timeout`). JSON: `{"verdict", "states", "seconds", "workers", "peak_rss_mb", ...}`.
"""
from __future__ import annotations

import argparse
import resource
import sys
import time
from typing import Any, Callable

from shardcheck.errors import EXIT_HELD, EXIT_USAGE, EXIT_VIOLATED, UsageError
from shardcheck.output import print_json

__all__ = ["add_arguments", "cmd_explore", "parse_cached"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `shardcheck explore`."""
    p.add_argument("--protocol", required=True, help="short name or MOD:ATTR of the protocol (required)")
    p.add_argument("--ranks", type=int, required=True, help="N, the number of ranks (required)")
    p.add_argument("--chunks", type=int, required=True, help="K, the number of chunks (required)")
    p.add_argument("--faults", type=int, default=1, help="faults after the lookup per run (default 1)")
    p.add_argument("--cached", default="all", help="'all' (every cached set, default) or the chunks cached: i,j,..")
    p.add_argument("--workers", type=int, default=1, help="local worker processes (default 1: this process)")
    p.add_argument("--shards", type=int, default=None,
                   help="shards to split the work into (default: one per worker); more shards, less memory each")
    p.add_argument("--ray", default=None, metavar="auto|ADDRESS",
                   help="run the shards as Ray tasks: 'auto' starts a local cluster, else the cluster's address "
                        "(default: local processes)")
    p.add_argument("--eager", action="store_true",
                   help="every cached set as its own initial configuration (default: the lazy initial state)")
    p.add_argument("--no-reduction", action="store_true", help="the full interleaving space (no POR) (default: off)")
    p.add_argument("--timeout", type=float, default=None, help="seconds before the run stops as incomplete (default: none)")
    p.add_argument("--out", default=None, help="directory to write a counterexample trace into (default: none)")
    p.add_argument("--json", action="store_true", help="print the result as JSON (default: a summary)")


def parse_cached(text: str, n_chunks: int) -> tuple[int, ...] | None:
    """`all` -> None; `i,j,..` -> the chunk indices (each in 0..K-1). UsageError naming a bad value."""
    if text.strip() == "all":
        return None
    try:
        chunks = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise UsageError(f"--cached {text!r}: expected 'all' or comma-separated chunk indices") from None
    bad = [c for c in chunks if not 0 <= c < n_chunks]
    if bad:
        raise UsageError(f"--cached {text!r}: chunks {bad} are not in 0..{n_chunks - 1}")
    return chunks


def _spec(args: Any):
    from checking.explore.shards import ShardSpec
    for name, value, least in (("--ranks", args.ranks, 1), ("--chunks", args.chunks, 1), ("--faults", args.faults, 0),
                               ("--workers", args.workers, 1)):
        if value < least:
            raise UsageError(f"{name} {value}: must be >= {least}")
    if args.shards is not None and args.shards < 1:
        raise UsageError(f"--shards {args.shards}: must be >= 1")
    if args.timeout is not None and not args.timeout > 0:
        raise UsageError(f"--timeout {args.timeout}: must be > 0")
    cached = parse_cached(args.cached, args.chunks)
    return ShardSpec(protocol=args.protocol, n_ranks=args.ranks, n_chunks=args.chunks, cached=cached,
                     max_faults=args.faults, reduction=not args.no_reduction, lazy=not args.eager and cached is None)


def cmd_explore(args: Any) -> int:
    """Run the exploration `args` describe; print the result; the exit code."""
    from checking.explore import ExploreError
    from checking.explore.shards import resolve_protocol
    spec = _spec(args)
    try:
        resolve_protocol(spec.protocol)  # a bad protocol is unusable input, named before any worker starts
    except ExploreError as exc:
        raise UsageError(str(exc)) from None
    try:
        t0 = time.perf_counter()
        with _bar(quiet=args.json) as progress:
            res = _run(spec, args, progress)
        wall = time.perf_counter() - t0  # set-up included (the search's own `seconds` leaves it out)
    except ExploreError as exc:
        raise UsageError(str(exc)) from None
    peak = res.peak_rss_mb if res.peak_rss_mb is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    report = {"protocol": spec.protocol, "ranks": spec.n_ranks, "chunks": spec.n_chunks, "faults": spec.max_faults,
              "cached": "all" if spec.cached is None else list(spec.cached), "lazy": spec.lazy,
              "reduction": spec.reduction, "verdict": res.verdict, "states": res.states,
              "seconds": round(wall, 3), "workers": res.workers, "peak_rss_mb": round(peak, 1),
              "depth": res.depth}
    if res.failed_shards:
        report["failed_shards"] = [{"shard": i, "error": why} for i, why in res.failed_shards]
    if res.violation is not None:
        report["violation"] = {"property": res.violation.property, "summary": res.violation.summary}
        if args.out:
            try:
                path = res.trace(protocol_ref=spec.protocol).save_unique(
                    args.out, "explore", spec.protocol.rpartition(":")[2], f"{spec.n_ranks}x{spec.n_chunks}",
                    res.violation.property)
            except OSError as exc:
                raise UsageError(f"cannot write the counterexample under --out {args.out}: {exc}") from None
            report["counterexample"] = str(path)
    if args.json:
        print_json(report)
    else:
        _print(report)
    if res.verdict == "violated":
        return EXIT_VIOLATED
    if res.verdict == "held":
        return EXIT_HELD
    why = "; ".join(f"shard {f['shard']}: {f['error']}" for f in report.get("failed_shards", [])) or "stopped"
    print(f"shardcheck explore: error: the exploration did not complete ({why})", file=sys.stderr)
    return EXIT_USAGE


def _run(spec: Any, args: Any, progress: Callable[[dict], None]):
    from runtime.watchdog import STALL_SECONDS
    if args.ray is not None:
        from checking.explore.on_ray import explore_ray
        return explore_ray(spec, args.ray, workers=args.workers if args.workers > 1 else None, shards=args.shards,
                           timeout=args.timeout, stall_seconds=STALL_SECONDS, progress=progress)
    if args.workers > 1 or args.shards:
        from checking.explore.workers import explore_workers
        return explore_workers(spec, args.workers, shards=args.shards, timeout=args.timeout,
                               stall_seconds=STALL_SECONDS, progress=progress)
    from checking.explore import explore
    from checking.explore.shards import resolve_protocol
    deadline = None if args.timeout is None else time.perf_counter() + args.timeout
    return explore(resolve_protocol(spec.protocol), spec.n_ranks, spec.n_chunks, cached=spec.cached,
                   max_faults=spec.max_faults, reduction=spec.reduction, lazy=spec.lazy, progress=progress,
                   should_stop=None if deadline is None else lambda: time.perf_counter() > deadline)


class _bar:  # noqa: N801 - a context manager
    """One aggregated rich progress bar on stderr (shards done of all, with the states found so far)."""

    def __init__(self, quiet: bool) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
        console = Console(stderr=True)
        self.progress = Progress(SpinnerColumn(), TextColumn("explore"), BarColumn(),
                                 TextColumn("{task.fields[text]}"), TimeElapsedColumn(), console=console,
                                 transient=True, disable=quiet or not console.is_terminal)
        self.task = self.progress.add_task("explore", total=None, text="")

    def __enter__(self) -> Callable[[dict], None]:
        self.progress.__enter__()
        return self.update

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def update(self, stats: dict) -> None:
        shards = stats.get("shards")
        text = f"{stats.get('states', 0):,} states"
        if shards:
            text += f", {stats.get('done', 0)}/{shards} shards" + (f", {stats['failed']} failed" if stats.get("failed") else "")
            self.progress.update(self.task, total=shards, completed=stats.get("done", 0), text=text)
        else:
            self.progress.update(self.task, text=text)


def _print(report: dict) -> None:
    line = (f"{report['protocol']} N={report['ranks']} K={report['chunks']} faults={report['faults']} "
            f"cached={report['cached'] if report['cached'] == 'all' else ','.join(map(str, report['cached']))}: "
            f"{report['verdict']} - {report['states']:,} states in {report['seconds']:.2f} s on "
            f"{report['workers']} worker(s), peak {report['peak_rss_mb']:.0f} MB")
    print(line)
    if "violation" in report:
        print(f"  {report['violation']['property']}: {report['violation']['summary']}")
        if "counterexample" in report:
            print(f"  counterexample: {report['counterexample']}")
