"""What the nemesis found in stock lmcache 0.5.6: store-ops traces with their real faults, measured on every client.

`shardcheck regen findings` runs `build()`: each finding of `FINDINGS` is replayed (`checking.storeops.run`, its faults
struck by `adapters.nemesis` on servers the factory started) on every client of `CLIENTS`; the outcome per client is
its expectation, the run on the client it records is its evidence, and it must be 1-minimal there (removing any one
op, fault ops included, loses its violation). They are written to `counterexamples/nemesis/lmcache-<name>.json` (a
directory of their own: the model client cannot replay real faults) and replayed by
`shardcheck replay counterexamples/nemesis --client NAME --expect`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from adapters.nemesis import control_maker
from checking.faulted import fault_op
from checking.storeops import kept_by_removal, run
from model.trace import Trace
from adapters.catalogue import CLIENTS as registry_clients
from runtime.registry import real_clients

__all__ = ["CLIENTS", "FINDINGS", "OUT_DIR", "trace_of", "build"]

#: The clients every nemesis finding is measured on: every real one.
CLIENTS = real_clients(registry_clients)
OUT_DIR = Path(__file__).resolve().parents[1] / "counterexamples" / "nemesis"
_CONFIG = {"n_ranks": 1, "topology": "per-rank", "use_mla": False, "op_timeout": 1.0}


def _put(key: str, tag: str) -> dict:
    value = bytes((ord(tag[i % len(tag)]) + i) % 256 for i in range(48))
    return {"rank": 0, "op": "put", "key": key, "value": list(value)}


#: name -> (property, ops, summary).
FINDINGS: dict[str, tuple[str, list[dict], str]] = {
    "killed-connection-answers-another-keys-bytes": (
        "fault-integrity",
        [_put("kv:c0", "c0"), fault_op("server_kill_connections", 0), {"rank": 0, "op": "get", "key": "kv:c1"}],
        "After the server drops its client connections (CLIENT KILL, as a proxy or a failover does), a read answers "
        "another key's bytes. Rank 0 stores chunk 0; its server kills the client's connections; rank 0 reads chunk 1, "
        "which nobody wrote: stock lmcache 0.5.6 (RemoteBackend over resp://) answers chunk 0's 48 bytes. The native "
        "RESP client's GET fails on the dead socket, marks the key failed and completes the batch as done "
        "(connector_base.h do_batch_get); ConnectorClientBase._on_ready drops the per-key results of a batch_get "
        "(native_clients/connector_client_base.py:62, `fut.set_result(None)`), so RESPConnector._get returns its memory "
        "object unfilled (connector/redis_connector.py:88-89), and the allocator had handed it the buffer chunk 0's put "
        "had just freed. The native client used directly answers the unfilled 4096-byte buffer as a hit. A load would "
        "use another chunk's KV. Fix 10 in lmcache-patched: GETs read the per-key results (a failed key is a miss).",
    ),
    "never-reconnects-after-connections-killed": (
        "recovery",
        [fault_op("server_kill_connections", 0), {"op": "recover"}],
        "After the server drops its client connections (CLIENT KILL), the client never works again. Rank 0's server "
        "kills the client's connections; 2 s later (the recovery bound) a put of a fresh key still fails 'socket "
        "writev failed', and every later call fails the same way: stock lmcache 0.5.6's native RESP client makes each "
        "worker's connection once, when the worker starts (connector_base.h worker_loop_for_queue, "
        "create_connection()), and never makes it again. The valkey:// connector (valkey-glide) reconnects. Fix 10 "
        "in lmcache-patched: a lost connection renews the native client.",
    ),
    "never-reconnects-after-restart": (
        "recovery",
        [fault_op("server_restart_empty", 0, 0.2), {"op": "recover"}],
        "After an operator restarts the server (killed, back empty on the same port 0.2 s later), the client never "
        "works again: 2 s after the server is back a put still fails 'socket writev failed'. Same root cause as "
        "never-reconnects-after-connections-killed (the native workers never reconnect); fix 10 in lmcache-patched.",
    ),
    "paused-server-call-waits-beyond-its-bound": (
        "fault-hang",
        [_put("kv:c0", "c0"), fault_op("server_pause", 0, 1.5), {"rank": 0, "op": "get", "key": "kv:c0"}],
        "A read on a paused server (SIGSTOP for 1.5 s: a GC pause, a noisy neighbour) waits as long as the server "
        "does, beyond the caller's 1 s bound (an error or a miss would be fine). Rank 0 stores chunk 0, its server is "
        "paused, rank 0 reads chunk 0. The native RESP client has no socket timeout, and RemoteBackend waits "
        "blocking_timeout_secs (10 s by default, remote_backend.py:367; contains waits without a bound, "
        "remote_backend.py:181); the valkey:// connector waits its request_timeout, which defaults to "
        "blocking_timeout_secs (connector/valkey_adapter.py:87-93). DEBUG SLEEP and CLIENT PAUSE show the same. Fix 9 "
        "in lmcache-patched: every native call is bounded (a read answers a miss, a put raises, the client is renewed); "
        "patched_valkey_factory sets request_timeout to a quarter of the op timeout.",
    ),
}


def trace_of(name: str) -> Trace:
    prop, ops, summary = FINDINGS[name]
    return Trace(kind="store-ops", property=prop, summary=summary, protocol={"name": "lmcache-store-client", "ref": None},
                 client="lmcache", config=dict(_CONFIG), ops=[dict(o) for o in ops], verdict={"violations": []},
                 origin="nemesis (adapters.nemesis_findings)")


def _factory(client: str) -> Callable[..., list]:
    from runtime.registry import resolve_client
    from runtime.bounded import BoundedStore

    resolved = resolve_client(client, registry_clients)
    return lambda n, **options: [BoundedStore(s, _CONFIG["op_timeout"]) for s in resolved.stores(n, **options)]


def build(names: Sequence[str] = tuple(FINDINGS), out_dir: Path = OUT_DIR, write: bool = True,
          progress: Callable[[str], None] | None = None) -> dict[str, Trace]:
    """Replay each finding on every client (its faults struck for real), record the outcomes and the stock run, check
    it is 1-minimal on stock lmcache, and write it."""
    control_for = control_maker()
    traces: dict[str, Trace] = {}
    for name in names:
        t = trace_of(name)
        notes: list[str] = []
        for client in CLIENTS:
            records, violations = run(t, _factory(client), control_for)
            outcome = "reproduces" if t.property in {v.property for v in violations} else "fixed"
            why = violations[0].summary if violations else "no violation"
            t.expect[client] = outcome
            notes.append(f"{client}: {outcome} ({why}; run {records[-1].get('total_seconds') if records else '?'} s)")
            if client == t.client:
                if outcome != "reproduces":
                    raise RuntimeError(f"{name} does not show its {t.property} violation on {client}: {why}")
                t.verdict = {"violations": [v.to_json() for v in violations]}
                by_index = {rec["index"]: rec for rec in records if "index" in rec}
                t.ops = [dict(o, **{k: v for k, v in by_index.get(i, {}).items()
                                    if k in ("result", "oracle", "outcome", "seconds", "recovered")})
                         for i, o in enumerate(t.ops)]
            if progress:
                progress(f"{name:44} {client:16} {outcome:10} {why[:100]}")
        kept = kept_by_removal(trace_of(name), _factory(t.client), control_for)
        if kept:
            raise RuntimeError(f"{name} is not minimal on {t.client}: without ops{kept} it still shows its violation")
        t.notes = "Measured with adapters.nemesis_findings on real Valkey servers: " + " | ".join(notes)
        traces[name] = t
        if write:
            t.save(out_dir / f"lmcache-{name}.json", overwrite=True)
    return traces


def main(argv: Any = None) -> int:
    build(progress=print)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
