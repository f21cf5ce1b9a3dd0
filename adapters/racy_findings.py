"""Racy findings of lmcache 0.5.6: concurrent-layer traces with their measured rates.

`shardcheck regen findings` measures each finding of `RACY_FINDINGS` on the client it records
(`RUNS` runs of its layout), then judges the trace on every client with `checking.replay.judge` (statistically,
99% confidence) and writes `counterexamples/lmcache-<name>.json` with the rate and the expectations.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from adapters.catalogue import CLIENTS as registry_clients
from adapters.storeops_findings import CLIENTS, ROOT, _factory
from checking.concurrency import Layout, measure
from checking.concurrency_strategy import to_trace
from checking.layers import ReplayOn
from checking.replay import judge
from model.trace import Trace
from runtime.registry import resolve_client

__all__ = ["RACY_FINDINGS", "RUNS", "OPTIONS", "BOUND", "build"]

#: Runs that measure a finding's rate on the client it records.
RUNS = 30
#: Client options and the bound of one run (seconds): a call the client bounds at 1 s is a lost completion.
OPTIONS = {"op_timeout": 1.0}
BOUND = 3.0


def _reads(path: str, n: int) -> list[dict]:
    return [{"path": "put", "keys": ["k0"], "pad": 8}] + [{"path": path, "keys": ["k0"]} for _ in range(n)]


#: name -> (client it is recorded on, property, layout, what it is).
RACY_FINDINGS: dict[str, tuple[str, str, Layout, str]] = {
    "sync-prefix-count-lost-completion": (
        "lmcache", "lost-completion", Layout([_reads("contains_batch", 8)]),
        "RemoteBackend.batched_contains (the scheduler's sync prefix count) of a present key never returns in a "
        "few percent of calls, even on one caller thread: ConnectorClientBase.batch_exists_sync submits to the "
        "native client and registers its future only afterwards, and the loop thread's drain drops a completion "
        "whose future is not registered yet. Fixed in lmcache-patched (fix 4)."),
    "native-sync-get-lost-completion": (
        "lmcache-native", "lost-completion", Layout([_reads("get_sync", 8)]),
        "The native RESP client's sync read (get_sync -> batch_get_sync) of a present key never returns in a "
        "few percent of calls: the same submit-then-register race as batch_exists_sync. No LMCache read path "
        "of the remote backend uses it; the client class exposes it."),
    "put-dropped-while-in-flight": (
        "lmcache", "linearizability",
        Layout([[{"path": "put", "keys": ["k0"], "pad": 8}, {"path": "contains", "keys": ["k0"]}] for _ in range(6)]),
        "Six callers each put one key and then ask whether it exists: a caller is told the key is absent after "
        "its own put completed. RemoteBackend.submit_put_task returns an already-completed future without "
        "writing when a put of the same key is in flight (exists_in_put_tasks), so a put can complete before "
        "the key exists (or never exist, when an eviction lands between). Also on lmcache-valkey. Fixed in "
        "lmcache-patched (fix 7)."),
}


def build(names: Sequence[str] = tuple(RACY_FINDINGS), out_dir: Path = ROOT / "counterexamples", write: bool = True,
          progress: Callable[[str], None] | None = None) -> dict[str, Trace]:
    """Measure each finding's rate on its client, judge it on every client, and write its trace."""
    say = progress or (lambda _msg: None)
    traces = {}
    for name in names:
        client, prop, layout, what = RACY_FINDINGS[name]
        stores = _factory(client)(1, **OPTIONS)
        try:
            rate = measure(stores[0], layout, runs=RUNS, bound=BOUND, want=prop)
        finally:
            for s in stores:
                s.close()
        if not rate.k:
            raise RuntimeError(f"{name}: no {prop} in {rate.n} runs on {client}")
        say(f"{name}: {rate.k}/{rate.n} runs on {client}")
        trace = to_trace(layout, rate, client=client, bound=BOUND, seeds=[layout.seed], origin="adapters.racy_findings",
                         options=OPTIONS)
        trace.summary = f"{what} Measured: {rate.k} of {rate.n} runs of this layout."
        notes = []
        for other in CLIENTS:
            client = resolve_client(other, registry_clients)
            verdict = judge(trace, ReplayOn(client=client, options=client.accepted(OPTIONS)))
            outcome, why = verdict.outcome, verdict.why
            trace.expect[other] = outcome
            notes.append(f"{other}: {outcome} ({why})")
            say(f"  {other:16} {outcome:10} {why}")
        trace.notes = "Measured with adapters.racy_findings on real Valkey servers: " + " | ".join(notes)
        traces[name] = trace
        if write:
            trace.save(out_dir / f"lmcache-{name}.json", overwrite=True)
    return traces
