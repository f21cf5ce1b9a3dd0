"""The explorer as a strategy of `check`: every interleaving and fault choice of small configurations, smallest first
(`EXPLORE_SIZES`), in this process or shared out to local worker processes; a violation is re-run by the check's
own runner, so it is reported (and minimised) like any protocol case."""
from __future__ import annotations

import time

import attrs

from checking.api import SearchContext
from checking.explore.explorer import explore
from checking.explore.result import ExploreError
from model.calls import Stalled
from model.finding import Finding
from runtime.watchdog import forget

__all__ = ["EXPLORE_SIZES", "Explorer", "ExploreCoverage"]

#: Explorer configurations (ranks, chunks, faults after lookup), every cached set, smallest first.
EXPLORE_SIZES = tuple((n, k, 1) for n, k in ((1, 1), (2, 1), (2, 2), (1, 3), (3, 2), (2, 3), (3, 3), (2, 4), (4, 3),
                                             (3, 4), (4, 4), (3, 5), (4, 5), (5, 5), (4, 6), (5, 6), (4, 7))) + \
    tuple((n, k, 2) for n, k in ((2, 2), (2, 3), (3, 3), (3, 4), (4, 4), (4, 5)))


@attrs.define
class ExploreCoverage:
    """Configurations explored to the end (every interleaving), their states, and why the explorer stopped early."""

    exhausted: list[dict] = attrs.field(factory=list)
    states: int = 0
    stopped: str = ""

    def text(self) -> str:
        done = ", ".join(f"{d['ranks']}x{d['chunks']}/{d['faults']}f" for d in self.exhausted[-4:]) or "none"
        why = f"; stopped: {self.stopped}" if self.stopped else ""
        return (f"{len(self.exhausted)} configurations exhausted (every interleaving; last: {done}); "
                f"{self.states:,} states{why}")

    def to_json(self) -> dict:
        return {"exhausted": list(self.exhausted), "states": self.states, "stopped": self.stopped,
                "largest": [self.exhausted[-1][k] for k in ("ranks", "chunks", "faults")] if self.exhausted else None}


class Explorer:
    """`check`'s exhaustive explorer over in-memory clients (it runs its own store model)."""

    name = "explore"

    def search(self, ctx: SearchContext) -> Finding | None:
        cov = ctx.coverage.of(self.name, ExploreCoverage)
        protocol = ctx.target.protocol
        for n, k, faults in EXPLORE_SIZES:
            if ctx.should_stop():
                break
            if not ctx.target.allows(n):
                continue
            try:
                res = self._one(ctx, protocol, n, k, faults)
            except ExploreError as exc:  # a configuration the explorer cannot handle (too big, not deterministic)
                cov.stopped = f"refused {n}x{k}: {exc}"
                return None
            except Stalled as exc:  # in its set-up (store phase or lookups): the case strategies report the stall
                cov.stopped = f"stalled in {n}x{k}'s set-up: {exc}"
                forget()  # the case strategies after it judge the stall at the full limit
                return None
            if res is None or res.verdict == "incomplete":
                break
            cov.states += res.states
            if res.verdict == "held":
                cov.exhausted.append({"ranks": n, "chunks": k, "faults": faults, "states": res.states})
            elif res.verdict == "violated":
                out = ctx.run(protocol.obj, res.counterexample)
                if out.violations:  # (a runner other than the simulator may not show it: the other strategies go on)
                    return ctx.protocol_finding(res.counterexample, out, self.name)
        return None

    @staticmethod
    def _one(ctx: SearchContext, protocol, n: int, k: int, faults: int):
        if ctx.explore_workers > 1:  # the configuration shared out to local worker processes
            from checking.explore.shards import ShardSpec
            from checking.explore.workers import explore_workers
            left = ctx.phase_end - time.monotonic()
            if left <= 0:
                return None
            return explore_workers(ShardSpec(protocol=protocol.ref, n_ranks=n, n_chunks=k, max_faults=faults),
                                   ctx.explore_workers, timeout=left)
        return explore(protocol.obj, n, k, max_faults=faults, should_stop=ctx.should_stop)
