"""Every property of the contract's "What the harness checks", as a named function over a run's outcome.

Each function takes an `Outcome` (see `model.outcome`) and returns the list of `Violation`s it finds; `CATALOG`
holds every property of every layer as a `Property` record (name, layer, check, demos).
"""
from __future__ import annotations

from typing import Callable

import attrs

from model.codec import preview
from model.outcome import Outcome, Violation

__all__ = ["soundness", "completeness", "prefix", "agreement", "within_plan", "integrity", "maximality",
           "key_consistency", "run_faults", "Property", "CATALOG", "BY_NAME", "CHECKS", "PROPERTIES",
           "STORE_PROPERTIES", "ENGINE_LAYER", "STACK_LAYER", "NEMESIS_PROPERTIES", "check_outcome", "isolation_load", "isolation_lookup", "isolation_eviction"]


def soundness(o: Outcome) -> list[Violation]:
    """The plan never exceeds the longest cached prefix at lookup: `planned <= LCP`."""
    if o.planned is not None and o.planned > o.lcp:
        return [Violation("soundness", f"planned {o.planned} chunks but only {o.lcp} leading chunks were cached "
                          f"(reports {o.reports})", {"planned": o.planned, "lcp": o.lcp, "reports": o.reports})]
    return []


def completeness(o: Outcome) -> list[Violation]:
    """The plan reaches the longest cached prefix: `planned >= LCP` (a real-server fault before the lookup may
    lower the plan: a miss is fine while it lasts)."""
    if o.case.faults.striking("before-lookup"):
        return []
    if o.planned is not None and o.planned < o.lcp:
        return [Violation("completeness", f"planned {o.planned} chunks though the leading {o.lcp} were cached "
                          f"(reports {o.reports})", {"planned": o.planned, "lcp": o.lcp, "reports": o.reports})]
    return []


def _usable(result) -> int | None:
    """`u` when `result` is a mapping whose keys are exactly `0..u-1`, else None."""
    try:
        keys = sorted(result)
    except TypeError:
        return None
    return len(keys) if keys == list(range(len(keys))) else None


def prefix(o: Outcome) -> list[Violation]:
    """Every rank's result is a prefix `{0..u_r-1}`."""
    out = []
    for r, result in sorted(o.results.items()):
        if _usable(result) is None:
            shown = sorted(result) if hasattr(result, "__iter__") else result
            out.append(Violation("prefix", f"rank {r} returned chunks {shown}, not a prefix 0..u-1",
                                 {"rank": r, "chunks": list(shown) if isinstance(shown, list) else repr(shown)}))
    return out


def agreement(o: Outcome) -> list[Violation]:
    """All ranks that finished agree on the usable prefix `u`."""
    us = {r: _usable(res) for r, res in o.results.items()}
    us = {r: u for r, u in us.items() if u is not None}
    if len(set(us.values())) > 1:
        return [Violation("agreement", f"ranks disagree on the usable prefix: {dict(sorted(us.items()))}",
                          {"u": {str(r): u for r, u in us.items()}})]
    return []


def within_plan(o: Outcome) -> list[Violation]:
    """No rank loads beyond the plan: `u <= planned`."""
    return [Violation("within-plan", f"rank {r} loaded {u} chunks, more than the planned {o.planned}",
                      {"rank": r, "u": u, "planned": o.planned})
            for r, res in sorted(o.results.items())
            if (u := _usable(res)) is not None and o.planned is not None and u > o.planned]


def integrity(o: Outcome) -> list[Violation]:
    """Every returned value equals the stored `kv[c]`."""
    out = []
    for r, res in sorted(o.results.items()):
        if not hasattr(res, "items"):
            out.append(Violation("integrity", f"rank {r} returned {type(res).__name__}, not a mapping", {"rank": r}))
            continue
        for c, value in sorted(res.items(), key=lambda kv: repr(kv[0])):
            if not isinstance(c, int) or not 0 <= c < len(o.kv) or value != o.kv[c]:
                out.append(Violation("integrity", f"rank {r} returned wrong bytes for chunk {c} "
                                     f"({preview(value)} instead of {preview(o.kv[c]) if isinstance(c, int) and 0 <= c < len(o.kv) else 'nothing'})",
                                     {"rank": r, "chunk": c}))
                break
    return out


def maximality(o: Outcome) -> list[Violation]:
    """Without a fault after the lookup (nor a real-server fault), every rank loads the whole plan: `u == planned`."""
    if o.case.faults.after_lookup() or o.case.faults.server_faults() or o.planned is None or o.load is None \
            or o.load.violations:
        return []
    return [Violation("maximality", f"rank {r} loaded {u} chunks of the planned {o.planned} with no fault "
                      "after the lookup", {"rank": r, "u": u, "planned": o.planned})
            for r, res in sorted(o.results.items())
            if (u := _usable(res)) is not None and u < o.planned]


def key_consistency(o: Outcome) -> list[Violation]:
    """Every key a load reads was written by the store path (of that rank)."""
    if o.load is None:
        return []
    seen, out = set(), []
    for r, key in o.load.reads:
        if key not in o.written.get(r, {}) and (r, key) not in seen:
            seen.add((r, key))
            out.append(Violation("key-consistency", f"rank {r} read key {key!r}, which its store path never wrote",
                                 {"rank": r, "key": key}))
    return out


def isolation_load(o: Outcome) -> list[Violation]:
    """A load returns only bytes stored for this prompt's chunks (never another prompt's: a leak, or poisoning)."""
    out = []
    for r, res in sorted(o.results.items()):
        if not hasattr(res, "items"):
            continue
        for c, value in sorted(res.items(), key=lambda kv: repr(kv[0])):
            whose = o.foreign.get(bytes(value)) if isinstance(value, (bytes, bytearray)) else None
            if whose is not None:
                out.append(Violation("isolation-load", f"rank {r} loaded chunk {c} with the bytes of {whose}, another "
                                     "prompt in the same tier", {"rank": r, "chunk": c, "from": whose}))
                break
    return out


def isolation_lookup(o: Outcome) -> list[Violation]:
    """A lookup never counts a chunk as a hit because another prompt's bytes sit under this prompt's key."""
    if o.planned is None or not isinstance(o.planned, int) or o.planned <= o.lcp:
        return []
    counted = sorted(c for c in o.stale if o.lcp <= c < o.planned)
    if not counted:
        return []
    return [Violation("isolation-lookup", f"planned {o.planned} chunks, counting chunk(s) {counted} whose keys hold "
                      f"another prompt's bytes (this prompt's cached prefix is {o.lcp})",
                      {"planned": o.planned, "lcp": o.lcp, "chunks": counted})]


def isolation_eviction(o: Outcome) -> list[Violation]:
    """Other prompts' evictions change this prompt's plan only through what they evicted of this prompt's chunks."""
    if o.before_other_evictions is None or o.planned is None:
        return []
    cached, planned = o.before_other_evictions
    if cached != o.cached or planned == o.planned:
        return []
    return [Violation("isolation-eviction", f"another prompt's eviction changed the plan from {planned} to "
                      f"{o.planned} chunks, though it evicted none of this prompt's cached chunks",
                      {"before": planned, "after": o.planned})]


def run_faults(o: Outcome) -> list[Violation]:
    """No desync, deadlock, hang, or step-bound exhaustion in the load (found by the simulator)."""
    return list(o.load.violations) if o.load is not None else []


@attrs.frozen(kw_only=True)
class Property:
    """One property: its name, its layer, the check that finds it, and the known-bad demos that violate it.

    `layer`: "protocol" (a run of a sharding protocol), "store" (a store client called one op at a time),
    "concurrency" (a store client called from several callers at once), "stack" (a whole serving stack served a
    stream of requests: `--engine vllm`), "nemesis" (a store client, or a protocol
    over one, through real faults on its servers; a protocol case keeps its own properties there: a fault may lower
    the plan, never raise it, and the ranks still agree) or "engine" (a real engine's own lookup-and-load path,
    `--engine`; its demos are `--engine-patch` functions). `check`: the function over an `Outcome`
    that finds it (protocol layer); None where the engine that runs finds it (the simulator's desync, deadlock,
    hang and termination, reported through `run_faults`; the store layers' runners). `demos`: the name of each
    known-bad protocol or client built to violate it (every property has one, so every check can fail), in the demo
    module of its layer (`shardcheck.tables.DEMO_MODULES`; the model names no module above it).
    """

    name: str
    layer: str
    about: str
    demos: tuple[str, ...]
    check: Callable[[Outcome], list[Violation]] | None = None
    #: `--engine-patch` demos that break a serving stack's own agreement so that the stack violates this property
    #: (an engine property broken in a real stack's own caller: SGLang's MIN all-reduce taking the MAX), in
    #: `shardcheck.tables.DEMO_MODULES["stack-patch"]`, run on the stacks that take them
    #: (`ServingEngineEntry.patch_demos`).
    patches: tuple[str, ...] = ()


def _protocol(name: str, about: str, check: Callable | None, *demos: str) -> Property:
    return Property(name=name, layer="protocol", about=about, check=check, demos=demos)


def _store(name: str, about: str, *demos: str) -> Property:
    return Property(name=name, layer="store", about=about, demos=demos)


def _engine(name: str, about: str, *demos: str, patches: tuple[str, ...] = ()) -> Property:
    return Property(name=name, layer="engine", about=about, demos=demos, patches=patches)


def _concurrent(name: str, about: str, *demos: str) -> Property:
    return Property(name=name, layer="concurrency", about=about, demos=demos)


def _stack(name: str, about: str, *demos: str) -> Property:
    """A property of a whole serving stack (`--engine vllm`, `model.stack_oracle`); its demos are KV connectors
    (`--connector MOD:ATTR`, their module is `shardcheck.tables.DEMO_MODULES["stack"]`)."""
    return Property(name=name, layer="stack", about=about, demos=demos)


def _nemesis(name: str, about: str, *demos: str) -> Property:
    """A property under real faults on the servers (`model.faults.SERVER_KINDS`); its demos are real clients (their
    module is `shardcheck.tables.DEMO_MODULES["nemesis"]`), since only a real server can be paused, killed or
    filled."""
    return Property(name=name, layer="nemesis", about=about, demos=demos)


#: Every property, in the order a run's violations are reported: the first names what is broken, so a protocol
#: run's come first those that name a cause (another prompt's chunk counted, evicted or loaded; a key no store path
#: wrote), then the wrong answers (plan, collectives, results, bytes), and last what is only lost (completeness,
#: maximality), which those before often explain. Adding one: a record here (and its check), and a demo that
#: violates it, first (ARCHITECTURE.md).
CATALOG: tuple[Property, ...] = (
    _protocol("isolation-lookup", "a lookup never counts another prompt's chunk as a hit", isolation_lookup,
              "PositionKeys"),
    _protocol("isolation-eviction", "another prompt's eviction changes this prompt's plan only through this prompt's "
              "chunks", isolation_eviction, "PositionMarkedLookup"),
    _protocol("isolation-load", "a load returns only bytes stored for this prompt's chunks", isolation_load,
              "PositionKeyedLoad"),
    _protocol("key-consistency", "a load reads only keys its store path wrote", key_consistency, "WrongAsyncKey"),
    _protocol("soundness", "planned <= LCP", soundness, "MaxCombine"),
    _protocol("desync", "the k-th collectives of all ranks match", None, "EarlyExitOnMiss"),
    _protocol("deadlock", "some rank can always progress", None, "SkipEmptyGather"),
    _protocol("hang", "no rank waits forever on a completion", None, "UnboundedWaitAsync"),
    _protocol("termination", "the load ends within the step bound; protocol code returns", None,
              "RetryUntilPresent"),
    _protocol("prefix", "every rank's result is a prefix 0..u-1", prefix, "GappyLoad"),
    _protocol("agreement", "all ranks agree on u", agreement, "GiveUpOnLocalMiss"),
    _protocol("within-plan", "u <= planned", within_plan, "AlignedPlanGreedyLoad"),
    _protocol("integrity", "every returned value equals the stored KV", integrity, "ByteOffByOne"),
    _protocol("completeness", "planned >= LCP", completeness,
              "OwnCountReport", "EmptyRankReportsZero", "MismatchedOwnership"),
    _protocol("maximality", "u == planned without a fault after the lookup", maximality, "PessimisticLoad"),
    _store("store-hang", "every call and completion returns within the op timeout",
           "blocking_miss_factory", "lost_async_factory"),
    _store("store-roundtrip", "every answer equals the oracle's, on every read path",
           "truncating_factory", "async_key_mismatch_factory", "shared_server_factory", "delete_keeps_cache_factory"),
    _store("store-error", "no call raises; the client stays usable", "unusable_after_miss_factory"),
    _store("wrong-key", "a read never answers a key with a value put for another key", "mget_drops_misses_factory"),
    _store("retention", "a value put and never deleted is still readable --retention seconds later (or as long as "
           "the client declares it keeps values)", "expiring_factory"),
    _store("shared-tier", "every client of the same servers sees the others' writes and evictions, and the "
           "server's own, at once", "local_read_cache_factory"),
    _concurrent("lost-completion", "every op of overlapping callers completes within the bound", "lost_wakeup_factory"),
    _concurrent("double-completion", "no completion is delivered twice", "double_completion_factory"),
    _concurrent("wrong-caller", "no result reaches another caller", "crossed_replies_factory"),
    _concurrent("linearizability", "every history is linearizable against a key-value register per key",
                "stale_cache_factory"),
    _engine("engine-soundness", "a lookup never answers more than the minimum over ranks of each rank's stored "
            "prefix, whatever failed", "take_max", patches=("agree_max",)),
    _engine("engine-completeness", "with nothing failed, a lookup answers exactly the minimum over ranks of each "
            "rank's stored prefix", "one_chunk_short", "memoise_sync_lookup"),
    _engine("engine-integrity", "a retrieve returns exactly the stored bytes of the planned prefix (never freed "
            "memory, never fewer chunks with nothing failed)", "flip_retrieved_byte"),
    _engine("engine-isolation", "under the engine's own key scheme, a lookup never counts and a retrieve never "
            "returns the KV of another tenant, model, adapter or image", "drop_request_tags"),
    _engine("pins", "every pin a lookup takes is released when its request ends, whatever the minimum was",
            "drop_lookup_unpin"),
    _engine("engine-returns", "every call of the engine, close included, returns an answer within its bound",
            "stuck_close"),
    _stack("output-equality", "every request's greedy output equals that of the same prompt with no KV cache at "
           "all, whatever was cached, evicted or faulted", "SwappedLoads"),
    _stack("hit-accuracy", "the tokens reported as cached equal the longest prefix every rank holds when nothing "
           "failed, and never exceed it", "OverReporting"),
    _stack("request-returns", "every request ends within its bound, under tier faults too (a failed load falls back "
           "to recompute)", "NeverFinishedLoad"),
    _stack("kv-leaks", "once every request ended no pin is held and the KV block pool is whole", "HeldBlocks"),
    _nemesis("fault-hang", "while a real fault lasts every call returns within its bound (an error or a miss is fine)",
             "no_timeout_factory"),
    _nemesis("fault-integrity", "under real faults nothing wrong is returned: the last completed put's bytes or a miss, "
             "never another key's bytes, never a value from before a delete", "stale_on_error_factory"),
    _nemesis("recovery", "once the server is back, the client's calls succeed again within --recovery-seconds",
             "never_reconnect_factory"),
)
BY_NAME: dict[str, Property] = {p.name: p for p in CATALOG}

#: The protocol layer's checks, in report order (`run_faults` stands for the simulator's properties).
CHECKS: tuple[Callable[[Outcome], list[Violation]], ...] = tuple(dict.fromkeys(
    p.check or run_faults for p in CATALOG if p.layer == "protocol"))

#: Every property name a protocol run's violation can carry.
PROPERTIES = tuple(p.name for p in CATALOG if p.layer == "protocol")
#: The store layer's properties.
STORE_PROPERTIES = tuple(p.name for p in CATALOG if p.layer == "store")
#: The engine layer's properties (found by `checking.serving.engine_run` with `model.engine_oracle`).
ENGINE_LAYER = tuple(p.name for p in CATALOG if p.layer == "engine")
#: The properties of a whole serving stack (found by `checking.serving.stack_run` with `model.stack_oracle`).
STACK_LAYER = tuple(p.name for p in CATALOG if p.layer == "stack")
#: The properties under real faults on the servers (every layer's runs judge them once a fault struck).
NEMESIS_PROPERTIES = tuple(p.name for p in CATALOG if p.layer == "nemesis")


def check_outcome(o: Outcome) -> list[Violation]:
    """Every violation of every check, in the order of `CHECKS`. (The explorer memoises it on exactly the fields of
    the outcome the checks read, `checking.explore.terminal.Terminals.violations`: a check that reads another field
    must be named there too.)"""
    return [v for check in CHECKS for v in check(o)]
