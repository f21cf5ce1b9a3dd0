"""Store-ops counterexamples of lmcache 0.5.6: build them, replay them against any client.

`replay(trace, factory) -> (outcome, why)` runs a `store-ops` trace's ops against
`factory(n_ranks, **options)` — the options come from the trace's `config` (`topology`,
`use_mla`, `op_timeout`, `password`) so the replay runs the configuration that was measured —
and checks each op against an in-memory oracle; the outcome is `reproduces` when the trace's
property is violated again, `fixed` otherwise. Ops are `checking.storeops`-shaped
(`{"rank", "op", "key", "value"}`; a value is a list of byte values, or `model.trace.encode`d);
an op may carry `"wait": false`
(a `get_async` fired and not awaited, as an engine's prefetch does).

Properties: `store-hang` (a call did not return / a completion never came within `op_timeout`),
`store-roundtrip` (an answer differs from the oracle's), `store-error` (a call raised, including
the factory itself).

`shardcheck regen findings` measures every finding of `FINDINGS` against the stock
clients, the patched client and the model, and writes `counterexamples/lmcache-<name>.json`
with the measured expectations, after checking that each is 1-minimal on the client it records (removing any one
op loses its violation: `kept_by_removal`); `shardcheck replay counterexamples/lmcache-*.json --client NAME`
replays them.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence


from checking.storeops import kept_by_removal, replay, run  # noqa: F401  (the replay API of the findings)
from model.outcome import Violation
from model.trace import Trace
from adapters.catalogue import CLIENTS as registry_clients
from runtime import reaper
from runtime.registry import real_clients

__all__ = ["ROOT", "CLIENTS", "FINDINGS", "MEASURED", "RECORDED_ON", "trace_of", "build", "CHILD"]

ROOT = Path(__file__).resolve().parents[1]
#: Every named client a finding is measured on: the real ones, then the in-memory model.
CLIENTS = (*real_clients(registry_clients),
           *(c for c in registry_clients if c not in real_clients(registry_clients)))


def _factory(client: str) -> Callable[..., list]:
    from runtime.registry import resolve_client

    resolved = resolve_client(client, registry_clients)
    return lambda n, **options: resolved.stores(n, **options)


# --------------------------------------------------------------------------- the findings

def _v(tag: str, n: int = 64) -> bytes:
    return bytes((ord(tag[i % len(tag)]) + i) % 256 for i in range(n))


def _op(rank: int, op: str, key: str | None = None, value: bytes | None = None, **extra: Any) -> dict:
    d: dict[str, Any] = {"rank": rank, "op": op}
    if key is not None:
        d["key"] = key
    if value is not None:
        # a list of byte values: JSON-able, and `bytes(value)` of it is the value, so the trace
        # replays as is through checking.storeops.run_ops (which passes op["value"] straight to put)
        d["value"] = list(value)
    d.update(extra)
    return d


#: name -> (property, config, ops, summary). The summaries say what ran and what happened; the
#: measured outcome per client and timings are added by `build()`.
FINDINGS: dict[str, tuple[str, dict, list[dict], str]] = {
    "missing-get-hangs": (
        "store-hang", {"n_ranks": 1, "topology": "per-rank", "use_mla": False, "op_timeout": 1.0},
        [_op(0, "get", "kv:c1")],
        "A GET of a key that was never written never returns. Rank 0 reads chunk 1, which nobody "
        "wrote: the answer should be a prompt miss (None), but stock lmcache 0.5.6 (RemoteBackend "
        "over resp://, and its native RESP client used directly) does not answer within the bound. "
        "Measured on the native client: a GET of a missing key into a buffer of 100 bytes or more "
        "(every real KV chunk) never completes, while below 100 bytes it completes at once (as a "
        "hit, the buffer untouched) - consistent with reading a fixed-length '$<size>\\r\\n' header, "
        "which the server's 5-byte nil reply '$-1\\r\\n' never fills. RemoteBackend.get_blocking "
        "gives up only after blocking_timeout_secs (10 s by default) and the parked native worker "
        "stays stuck until its connection closes. The valkey:// connector answers the miss at once. "
        "Fix in lmcache-patched (mitigation, the real fix is in the native nil-reply handling): an "
        "exists-guarded RESPConnector subclass answers misses from EXISTS without issuing the GET, "
        "and bounds the remaining GET.",
    ),
    "async-miss-never-completes": (
        "store-hang", {"n_ranks": 1, "topology": "per-rank", "use_mla": False, "op_timeout": 1.0},
        [_op(0, "get_async", "kv:c3")],
        "An async read of a missing key never completes (a lost completion). Rank 0 issues an "
        "async read of chunk 3, which was never written: the future should resolve to None, but "
        "with stock lmcache 0.5.6 over resp:// (the prefetch path "
        "RemoteBackend.batched_get_non_blocking, and the native client's async get) it does not "
        "resolve within the bound; a caller that waits without a timeout stalls forever "
        "(RemoteBackend's own wait_for gives up after 10 s and reports an empty prefix). Same root "
        "cause as missing-get-hangs; the same mitigation fixes it in lmcache-patched, and the "
        "valkey:// connector resolves the miss at once.",
    ),
    "client-wedged-after-misses": (
        "store-hang", {"n_ranks": 1, "topology": "per-rank", "use_mla": False, "op_timeout": 1.0},
        [_op(0, "get_async", f"kv:missing{i}", wait=False) for i in range(4)] + [_op(0, "put", "kv:c0", _v("c0"))],
        "After a few missed async reads the client is wedged: every later operation, even a PUT, "
        "never returns. Rank 0 fires 4 async reads of keys that do not exist (as a prefetch of a "
        "cold prompt would) without waiting for them, then stores chunk 0: with stock lmcache "
        "0.5.6 over resp:// the put does not return within the bound; with 3 misses it does. Each "
        "miss parks native RESP workers for good (missing-get-hangs): the native client used "
        "directly has 8 workers and is wedged by 8 misses, RemoteBackend by 4 (consistent with two "
        "parked workers per missed prefetch; not traced further). The client is unusable until its "
        "connections are closed. lmcache-patched never issues a GET for an absent key and "
        "replaces the native client when a GET is stuck, so the put completes at once; the "
        "valkey:// connector is not affected.",
    ),
    "mla-rank-put-dropped": (
        "store-roundtrip", {"n_ranks": 2, "topology": "per-rank", "use_mla": True, "op_timeout": 1.0},
        [_op(1, "put", "kv:c1", _v("c1")), _op(1, "contains", "kv:c1")],
        "With an MLA model and more than one rank, every PUT of a rank other than 0 is silently "
        "dropped. Rank 1 stores chunk 1 in its own store and asks whether it is there: stock "
        "lmcache 0.5.6 says no, with both the resp:// and the valkey:// connector. RemoteBackend's "
        "remote_enable_mla_worker_id_as0 mode (on by default for MLA when world_size > 1) skips "
        "the put of worker_id != 0 and rewrites that rank's sync reads to worker 0's key, assuming "
        "tensor parallelism where every rank holds the same KV. Under context parallelism each "
        "rank stores different chunks in its own store, so rank 1's chunks never reach the remote "
        "tier. The native client (no MLA logic) keeps them. Fix in lmcache-patched: LMCache's own "
        "switch remote_enable_mla_worker_id_as0=False.",
    ),
    "mla-sync-reads-rank0-key": (
        "store-roundtrip", {"n_ranks": 2, "topology": "shared", "use_mla": True, "op_timeout": 1.0},
        [_op(0, "put", "kv:c0", _v("rank0-bytes", 60)), _op(1, "get", "kv:c0")],
        "With an MLA model and one store shared by all ranks (the stock deployment), a rank's sync "
        "read returns another rank's value. Rank 0 stores its 60-byte value of chunk 0; rank 1, "
        "which never stored chunk 0 (LMCache keys carry worker_id, so each rank has its own "
        "namespace), reads it: the answer should be a miss, but stock lmcache 0.5.6 returns rank "
        "0's 60 bytes, because the sync read paths (get_blocking, batched_get_blocking, contains) "
        "are rewritten to worker 0's key, while the async path (batched_get_non_blocking, the "
        "prefetch) keeps rank 1's own key name: the 'async GET with the wrong key name' class of "
        "bug, seen from the sync side. Fix in lmcache-patched: remote_enable_mla_worker_id_as0=False.",
    ),
    "valkey-auth-swapped": (
        "store-error", {"n_ranks": 1, "topology": "per-rank", "use_mla": False, "op_timeout": 1.0,
                        "password": "shardcheck-pw"},
        [],
        "LMCache's valkey:// connector cannot authenticate; no op is needed, building the client "
        "is the violation. Against a Valkey server with requirepass, lmcache 0.5.6's "
        "ValkeyWorkerPool calls glide_sync.ServerCredentials(username, password) positionally, but "
        "glide's signature is ServerCredentials(password, username), so the server is sent the "
        "user name as password (NOAUTH / connection refused on every worker) and the factory "
        "raises. The resp:// client and the native client authenticate fine. Workaround in "
        "adapters.patched:patched_valkey_factory: pass the password as valkey_username and "
        "'default' as valkey_password, which the swap puts back in place.",
    ),
}

#: which clients each finding was measured on (others are not meaningful for it)
MEASURED = {
    "missing-get-hangs": CLIENTS,
    "async-miss-never-completes": CLIENTS,
    "client-wedged-after-misses": CLIENTS,
    "mla-rank-put-dropped": CLIENTS,
    "mla-sync-reads-rank0-key": CLIENTS,
    "valkey-auth-swapped": CLIENTS,
}


#: the client whose run a trace records (its verdict and per-op results)
RECORDED_ON = {"valkey-auth-swapped": "lmcache-valkey"}


def trace_of(name: str) -> Trace:
    prop, config, ops, summary = FINDINGS[name]
    return Trace(kind="store-ops", property=prop, summary=summary,
                 protocol={"name": "lmcache-store-client", "ref": None},
                 client=RECORDED_ON.get(name, "lmcache"),
                 config=dict(config), ops=[dict(o) for o in ops],
                 verdict={"violations": []}, origin="checking.scenarios (generic store-client checks)")


def build(names: Sequence[str] = tuple(FINDINGS), out_dir: Path = ROOT / "counterexamples",
          write: bool = True, progress: Callable[[str], None] | None = None) -> dict[str, Trace]:
    """Replay each finding on every client, record outcomes and the stock run's evidence."""
    traces: dict[str, Trace] = {}
    for name in names:
        t = trace_of(name)
        expect: dict[str, str] = {}
        notes: list[str] = []
        for client in MEASURED[name]:
            if client == "lmcache-valkey" and name == "valkey-auth-swapped":
                outcome, why, records, violations = _in_child(name, client)
            else:
                records, violations = run(t, _factory(client))
                if violations and violations[0].detail.get("index") == -1 and t.property != "store-error":
                    raise RuntimeError(f"{name} on {client}: cannot measure, {violations[0].summary}")
                props = [v.property for v in violations]
                outcome = "reproduces" if t.property in props else "fixed"
                why = violations[0].summary if violations else "no violation"
            expect[client] = outcome
            secs = records[-1].get("total_seconds") if records else None
            notes.append(f"{client}: {outcome} ({why}; run {secs} s)")
            if client == t.client and violations:
                t.verdict = {"violations": [v.to_json() for v in violations]}
                by_index = {rec["index"]: rec for rec in records if "index" in rec}
                t.ops = [dict(o, **{k: v for k, v in by_index.get(i, {}).items()
                                    if k in ("result", "oracle", "outcome", "seconds")})
                         for i, o in enumerate(t.ops)]
            if progress:
                progress(f"{name:28} {client:16} {outcome:10} {why}")
        if RECORDED_ON.get(name, "lmcache") != "lmcache-valkey":  # (that one runs in a child, and has no ops)
            kept = kept_by_removal(trace_of(name), _factory(t.client))
            if kept:
                raise RuntimeError(f"{name} is not minimal on {t.client}: without ops{kept} it still shows "
                                   f"its violation; shorten FINDINGS[{name!r}]")
        t.expect = expect
        t.notes = "Measured with adapters.storeops_findings on real Valkey servers: " + " | ".join(notes)
        traces[name] = t
        if write:
            t.save(out_dir / f"lmcache-{name}.json", overwrite=True)
    return traces


CHILD = """
import json, os, sys
sys.path.insert(0, {root!r})
from adapters.storeops_findings import run, trace_of, _factory
t = trace_of({name!r})
records, violations = run(t, _factory({client!r}))
print(json.dumps([records, [v.to_json() for v in violations]]), flush=True)
os._exit(0)  # a failed glide connect leaves retrying threads behind: do not wait for them
"""


def _outcome(name: str, violations: list) -> tuple[str, str, list]:
    t = trace_of(name)
    found = [Violation.from_json(v) for v in violations]
    outcome = "reproduces" if t.property in {v.property for v in found} else "fixed"
    return outcome, found[0].summary if found else "no violation", found


#: What an LMCache store client imports (about 5 s of CPU: torch, transformers), imported once before forking.
_LMCACHE_MODULES = ("lmcache.v1.config", "lmcache.v1.metadata", "lmcache.v1.storage_backend.local_cpu_backend",
                    "lmcache.v1.storage_backend.remote_backend", "lmcache.v1.storage_backend.connector.valkey_connector")


def _forked_replay(name: str, client: str, conn: Any) -> None:
    try:
        records, violations = run(trace_of(name), _factory(client))
        conn.send(("ok", [v.to_json() for v in violations]))
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        os._exit(0)  # a failed glide connect leaves retrying threads behind: do not wait for them


def replays_in_forks(name: str, client: str, runs: int, at_once: int = 5,
                     timeout: float = 120.0) -> list[tuple[str, str]]:
    """(outcome, why) of `runs` replays of finding `name` on `client`, each in a process forked from this one, at most
    `at_once` at a time: the child process of `_in_child` without its 5 s of importing LMCache again. Only for a
    process with no other thread yet (a fork copies none, so none may hold a lock): call it before any client runs."""
    import importlib
    import multiprocessing
    import threading

    if threading.active_count() > 1:
        raise RuntimeError(f"replays_in_forks: {threading.active_count() - 1} other thread(s) run here; forking "
                           "now could copy a lock one of them holds (call it before any client runs)")
    for module in _LMCACHE_MODULES:  # the forks inherit what is imported here
        importlib.import_module(module)
    ctx = multiprocessing.get_context("fork")
    out: list[tuple[str, str]] = []
    for start in range(0, runs, at_once):
        batch = []
        try:
            for _ in range(min(at_once, runs - start)):
                parent, child = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_forked_replay, args=(name, client, child), daemon=True)
                proc.start()
                child.close()
                batch.append((proc, parent))
            out += [_forked_answer(name, client, proc, parent, timeout) for proc, parent in batch]
        finally:  # (a fork that answered has ended; one left by a failure is stopped here)
            for proc, _ in batch:
                proc.join(5)
                if proc.is_alive():
                    proc.kill()
                    proc.join(5)
    return out


def _forked_answer(name: str, client: str, proc: Any, parent: Any, timeout: float) -> tuple[str, str]:
    try:
        if not parent.poll(timeout):
            raise RuntimeError(f"{name} on {client}: a forked replay gave no answer in {timeout:g} s")
        status, violations = parent.recv()
    except EOFError:
        proc.join(5)
        raise RuntimeError(f"{name} on {client}: a forked replay died (exit {proc.exitcode})") from None
    if status != "ok":
        raise RuntimeError(f"{name} on {client}: a forked replay raised {violations}")
    return _outcome(name, violations)[:2]


def _in_child(name: str, client: str) -> tuple[str, str, list, list]:
    import subprocess

    try:
        out = reaper.run_child([sys.executable, "-c", CHILD.format(root=str(ROOT), name=name, client=client)],
                               timeout=120, cwd=str(ROOT))
        records, violations = json.loads(out.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, IndexError, ValueError) as exc:  # the child hung or died: say so
        detail = getattr(exc, "stderr", None) or (out.stderr[-500:] if "out" in locals() else "")
        raise RuntimeError(f"{name} on {client}: the replay in a child process failed ({type(exc).__name__}); "
                           f"{detail}") from None
    outcome, why, found = _outcome(name, violations)
    return outcome, why, records, found
