"""What an exploration returns (`ExploreResult`) and the error it raises (`ExploreError`)."""
from __future__ import annotations

import attrs

from model.outcome import Case, Outcome, Violation

__all__ = ["ExploreError", "ExploreResult"]


class ExploreError(Exception):
    """The explorer cannot handle the input, or its counterexample does not replay in `run_case`."""


@attrs.define(kw_only=True)
class ExploreResult:
    """What one exploration found.

    `verdict`: "held" (every reachable state checked, no violation), "violated" (`counterexample` and
    `violation` set; BFS order makes it a shortest one in the explored graph) or "incomplete" (stopped by
    `should_stop`). `states`: distinct global states; `transitions`: successors generated; `depth`: the
    BFS depth reached (= moves, in the reduced model). `workers`, `peak_rss_mb` (the largest of any one
    process), `failed_shards` (shards that kept failing: then the verdict is "incomplete"), `cpu_seconds` (all
    shard processes) and `critical_cpu_seconds` (the busiest one: the wall time on idle cores) describe a sharded run.
    """

    verdict: str
    states: int
    transitions: int
    depth: int
    seconds: float
    counterexample: Case | None = None
    violation: Violation | None = None
    outcome: Outcome | None = attrs.field(default=None, repr=False)
    configs: int = 0
    trie_nodes: int = 0
    workers: int = 1
    peak_rss_mb: float | None = None
    cpu_seconds: float | None = None
    critical_cpu_seconds: float | None = None
    failed_shards: list = attrs.field(factory=list)

    def trace(self, protocol_ref: str | None = None, origin: str = "explore"):
        """The counterexample as a `model.trace.Trace` (None when nothing was violated)."""
        if self.outcome is None:
            return None
        from model.trace import Trace
        return Trace.from_outcome(self.outcome, protocol_ref=protocol_ref, origin=origin)

