"""`Trace`: one run as data, with a versioned JSON round-trip.

Three kinds: `protocol` (a run of a sharding protocol: config, fault plan, schedule, events, verdict),
`store-ops` (a sequence of store-client operations per rank, replayed against a client and an oracle) and
`concurrent` (a layout of ops per caller thread run at once on one store, with its measured rate).
A malformed file raises `TraceError` naming the file and the field.
"""
from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import attrs

from model import effects
from model.faults import Eviction, FaultPlan
from model.harness import Case, Outcome
from model.history import READ_PATHS, WRITE_PATHS
from model.outcome import Violation

SCHEMA = "shardcheck-trace"
VERSION = 1
KINDS = ("protocol", "store-ops", "concurrent")
OUTCOMES = ("reproduces", "fixed")
#: A protocol bug reproduces on the in-memory model whatever the client; on the real clients the
#: expectation is measured (`shardcheck regen` replays there): a stock client's own bug (a GET of a missing key
#: that hangs, a dropped put) can mask the protocol's, and the expectation records that honestly.
PROTOCOL_BUG_EXPECT = {"model": "reproduces", "lmcache": "reproduces", "lmcache-patched": "reproduces"}


class TraceError(Exception):
    """A trace file that cannot be used: names the file and the field."""

    def __init__(self, path: str | Path | None, field: str, message: str) -> None:
        self.path, self.field = str(path) if path else "<trace>", field
        super().__init__(f"{self.path}: field '{field}': {message}")


# -- values ---------------------------------------------------------------------------------------
_EFFECTS = {cls.__name__: cls for cls in (effects.Put, effects.Get, effects.GetAsync, effects.Wait,
                                          effects.AllReduceMin, effects.AllGather, effects.Broadcast)}


def encode(value: Any) -> Any:
    """A JSON-able form of a value that occurs in a run (bytes, handles, effects, int-keyed maps...)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray)):
        return {"$bytes": base64.b64encode(bytes(value)).decode()}
    if value is effects.TIMED_OUT:
        return {"$timed_out": True}
    if isinstance(value, effects.Handle):
        return {"$handle": [value.rank, value.seq, value.key]}
    if type(value).__name__ in _EFFECTS and attrs.has(type(value)):
        return {"$effect": type(value).__name__, **{k: encode(v) for k, v in attrs.asdict(value, recurse=False).items()}}
    if isinstance(value, Eviction):
        return {"$evict": attrs.asdict(value)}
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in value):
            return {k: encode(v) for k, v in value.items()}
        return {"$map": [[encode(k), encode(v)] for k, v in value.items()]}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [encode(v) for v in value]
    return {"$repr": repr(value)}


def decode(value: Any, field: str = "value", path: Any = None) -> Any:
    """The inverse of `encode`."""
    if isinstance(value, list):
        return [decode(v, f"{field}[{i}]", path) for i, v in enumerate(value)]
    if not isinstance(value, dict):
        return value
    try:
        if "$bytes" in value:
            return base64.b64decode(value["$bytes"], validate=True)
        if "$timed_out" in value:
            return effects.TIMED_OUT
        if "$handle" in value:
            r, s, k = value["$handle"]
            return effects.Handle(int(r), int(s), str(k))
        if "$effect" in value:
            cls = _EFFECTS[value["$effect"]]
            return cls(**{k: decode(v, f"{field}.{k}", path) for k, v in value.items() if k != "$effect"})
        if "$evict" in value:
            return Eviction(**value["$evict"])
        if "$map" in value:
            return {_hashable(decode(k, field, path)): decode(v, field, path) for k, v in value["$map"]}
        if "$repr" in value:
            return value["$repr"]
    except (KeyError, TypeError, ValueError) as exc:
        raise TraceError(path, field, f"cannot decode {json.dumps(value)[:80]}: {exc}") from None
    return {k: decode(v, f"{field}.{k}", path) for k, v in value.items()}


def _hashable(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


# -- the trace --------------------------------------------------------------------------------------
@attrs.define
class Trace:
    """One run (or op sequence) as data; see `counterexamples/README.md` for every field."""

    kind: str
    property: str | None
    summary: str
    protocol: dict
    client: str
    config: dict
    faults: dict = attrs.field(factory=dict)
    schedule: list[int] = attrs.field(factory=list)
    events: list[dict] = attrs.field(factory=list)
    lookup: dict = attrs.field(factory=dict)
    ops: list[dict] = attrs.field(factory=list)
    verdict: dict = attrs.field(factory=lambda: {"violations": []})
    expect: dict[str, str] = attrs.field(factory=dict)
    origin: str = ""
    notes: str = ""

    # -- building -----------------------------------------------------------------------------------
    @classmethod
    def from_outcome(cls, outcome: Outcome, *, protocol_ref: str | None, client: str = "model",
                     origin: str = "", summary: str = "", expect: dict | None = None) -> "Trace":
        """The trace of a protocol run."""
        case = outcome.case
        first = outcome.violations[0] if outcome.violations else None
        return cls(
            kind="protocol", property=first.property if first else None,
            summary=summary or (first.summary if first else "every property held"),
            protocol={"name": outcome.protocol, "ref": protocol_ref}, client=client,
            config={"n_ranks": case.n_ranks, "n_chunks": case.n_chunks, "salt": case.salt,
                    "step_bound": case.bound(), "seed": case.seed},
            faults=faults_to_json(case.faults),
            schedule=list(outcome.load.schedule) if outcome.load else list(case.schedule),
            events=[{"step": e.step, "rank": e.rank, "time": e.time, "phase": e.phase, "effect": encode(e.effect),
                     "result": encode(e.result), "note": e.note} for e in outcome.events],
            lookup={"reports": outcome.reports, "planned": outcome.planned, "lcp": outcome.lcp,
                    "cached": sorted(outcome.cached)},
            verdict={"violations": [{"property": v.property, "summary": v.summary, "detail": encode(v.detail)}
                                    for v in outcome.violations]},
            expect=dict(expect or {}), origin=origin)

    def case(self) -> Case:
        """The `Case` that re-runs this trace (protocol traces only)."""
        c = self.config
        return Case(n_ranks=c["n_ranks"], n_chunks=c["n_chunks"], salt=c.get("salt", "s0"),
                    faults=faults_from_json(self.faults), schedule=tuple(self.schedule), seed=c.get("seed"),
                    step_bound=c.get("step_bound"))

    # -- JSON ---------------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"schema": SCHEMA, "version": VERSION, **attrs.asdict(self, recurse=False)}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1, sort_keys=False) + "\n"

    def save(self, path: str | Path, *, overwrite: bool = False) -> Path:
        """Write the trace; refuses to replace an existing file unless `overwrite`."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        mode = "w" if overwrite else "x"
        with open(path, mode) as f:
            f.write(self.dumps())
        return path

    @classmethod
    def from_json(cls, data: Any, path: str | Path | None = None) -> "Trace":
        """Validate and build; every problem names the field."""
        if not isinstance(data, dict):
            raise TraceError(path, "<top>", f"expected a JSON object, got {type(data).__name__}")
        if data.get("schema") != SCHEMA:
            raise TraceError(path, "schema", f"expected {SCHEMA!r}, got {data.get('schema')!r}")
        if data.get("version") != VERSION:
            raise TraceError(path, "version", f"this shardcheck reads version {VERSION}, the file has "
                             f"{data.get('version')!r}")
        _need(data, "kind", str, path)
        if data["kind"] not in KINDS:
            raise TraceError(path, "kind", f"expected one of {KINDS}, got {data['kind']!r}")
        for name, typ in (("summary", str), ("protocol", dict), ("client", str), ("config", dict),
                          ("verdict", dict), ("expect", dict)):
            _need(data, name, typ, path)
        if "property" not in data:
            raise TraceError(path, "property", "missing")
        if data["property"] is not None and not isinstance(data["property"], str):
            raise TraceError(path, "property", "expected a string or null")
        for client, outcome in data["expect"].items():
            if outcome not in OUTCOMES:
                raise TraceError(path, f"expect.{client}", f"expected one of {OUTCOMES}, got {outcome!r}")
        if data["kind"] == "protocol":
            _validate_protocol(data, path)
        elif data["kind"] == "concurrent":
            _validate_concurrent(data, path)
        else:
            _need(data, "ops", list, path)
            for i, op in enumerate(data["ops"]):
                if not isinstance(op, dict) or not isinstance(op.get("op"), str) or not isinstance(op.get("rank"), int):
                    raise TraceError(path, f"ops[{i}]", "expected an object with 'op' (str) and 'rank' (int)")
        known = {f.name for f in attrs.fields(cls)}
        unknown = set(data) - known - {"schema", "version"}
        if unknown:
            raise TraceError(path, sorted(unknown)[0], "unknown field")
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        """Read a trace file; a missing, non-JSON or malformed file raises `TraceError`."""
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise TraceError(path, "<file>", f"cannot read: {exc.strerror or exc}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceError(path, "<json>", f"not valid JSON: {exc}") from None
        return cls.from_json(data, path)


def _need(data: dict, name: str, typ: type, path: Any) -> None:
    if name not in data:
        raise TraceError(path, name, "missing")
    if not isinstance(data[name], typ) or (typ is int and isinstance(data[name], bool)):
        raise TraceError(path, name, f"expected {typ.__name__}, got {type(data[name]).__name__}")


def _validate_concurrent(data: dict, path: Any) -> None:
    """A concurrent trace: `ops` are `{"thread", "path", "keys", "pad"?}`; `config.rate` is `{"k", "n", "seeds"}`."""
    _need(data, "ops", list, path)
    for i, op in enumerate(data["ops"]):
        if not isinstance(op, dict) or not isinstance(op.get("thread"), int) or not isinstance(op.get("path"), str) \
                or not isinstance(op.get("keys"), list) or not op["keys"] or not all(isinstance(k, str) for k in op["keys"]):
            raise TraceError(path, f"ops[{i}]", "expected an object with 'thread' (int), 'path' (str), 'keys' (non-empty list of str)")
        if op["path"] not in READ_PATHS + WRITE_PATHS:
            raise TraceError(path, f"ops[{i}].path", f"unknown path {op['path']!r} (known: {', '.join(READ_PATHS + WRITE_PATHS)})")
    rate = data["config"].get("rate")
    if not isinstance(rate, dict) or not all(isinstance(rate.get(f), int) and not isinstance(rate.get(f), bool)
                                             for f in ("k", "n")) or not 0 < rate["k"] <= rate["n"]:
        raise TraceError(path, "config.rate", f"expected {{'k', 'n', 'seeds'}} with 0 < k <= n, got {rate!r}")


def _validate_protocol(data: dict, path: Any) -> None:
    cfg = data["config"]
    for name, lo in (("n_ranks", 1), ("n_chunks", 0)):
        if not isinstance(cfg.get(name), int) or isinstance(cfg.get(name), bool) or cfg[name] < lo:
            raise TraceError(path, f"config.{name}", f"expected an integer >= {lo}, got {cfg.get(name)!r}")
    for name, typ in (("salt", str), ("step_bound", int), ("seed", int)):
        if cfg.get(name) is not None and (not isinstance(cfg[name], typ) or isinstance(cfg[name], bool)):
            raise TraceError(path, f"config.{name}", f"expected {typ.__name__} or null, got {cfg[name]!r}")
    _need(data, "faults", dict, path)
    if not isinstance(data.get("schedule", []), list) or not all(
            isinstance(r, int) and 0 <= r < cfg["n_ranks"] for r in data.get("schedule", [])):
        raise TraceError(path, "schedule", f"expected a list of ranks in 0..{cfg['n_ranks'] - 1}")
    try:
        plan = faults_from_json(data["faults"])
    except (TypeError, ValueError, KeyError) as exc:
        raise TraceError(path, "faults", str(exc)) from None
    n, k = cfg["n_ranks"], cfg["n_chunks"]
    for field in ("evict_before_lookup", "evict_after_lookup", "evict_during_load"):
        for i, e in enumerate(getattr(plan, field)):
            if not 0 <= e.chunk < k or (e.rank is not None and not 0 <= e.rank < n) or (e.step is not None and e.step < 0):
                raise TraceError(path, f"faults.{field}[{i}]", f"chunk {e.chunk}, rank {e.rank}, step {e.step} is "
                                 f"outside {n} ranks x {k} chunks")
    for field in ("lost", "delayed"):
        for i, x in enumerate(getattr(plan, field)):
            if not 0 <= x[0] < n or x[1] < 0:
                raise TraceError(path, f"faults.{field}[{i}]", f"rank {x[0]}, GetAsync #{x[1]} is outside {n} ranks")
    if not isinstance(data["protocol"].get("name"), str):
        raise TraceError(path, "protocol.name", "expected a string")


def faults_to_json(plan: FaultPlan) -> dict:
    def ev(e: Eviction) -> dict:
        return {k: v for k, v in attrs.asdict(e).items() if v is not None}

    return {"evict_before_lookup": [ev(e) for e in plan.evict_before_lookup],
            "evict_after_lookup": [ev(e) for e in plan.evict_after_lookup],
            "evict_during_load": [ev(e) for e in plan.evict_during_load],
            "lost": [list(x) for x in plan.lost], "delayed": [list(x) for x in plan.delayed]}


def faults_from_json(data: dict) -> FaultPlan:
    if not isinstance(data, dict):
        raise TypeError(f"expected an object, got {type(data).__name__}")
    unknown = set(data) - {"evict_before_lookup", "evict_after_lookup", "evict_during_load", "lost", "delayed"}
    if unknown:
        raise ValueError(f"unknown fault kind {sorted(unknown)[0]!r}")

    def evs(name: str, need_step: bool) -> list[Eviction]:
        out = []
        for i, e in enumerate(data.get(name, [])):
            if not isinstance(e, dict) or not isinstance(e.get("chunk"), int):
                raise ValueError(f"{name}[{i}]: expected an object with an integer 'chunk'")
            if need_step and not isinstance(e.get("step"), int):
                raise ValueError(f"{name}[{i}]: expected an integer 'step'")
            out.append(Eviction(e["chunk"], e.get("rank"), e.get("step")))
        return out

    for name, width in (("lost", 2), ("delayed", 3)):
        for i, x in enumerate(data.get(name, [])):
            if not isinstance(x, list) or len(x) != width or not all(isinstance(v, (int, float)) for v in x):
                raise ValueError(f"{name}[{i}]: expected a list of {width} numbers")
    return FaultPlan(evs("evict_before_lookup", False), evs("evict_after_lookup", False),
                     evs("evict_during_load", True), [tuple(map(int, x)) for x in data.get("lost", [])],
                     [(int(r), int(i), float(d)) for r, i, d in data.get("delayed", [])])


def violations_of(trace: Trace) -> list[Violation]:
    """The violations recorded in a trace's verdict."""
    return [Violation(v["property"], v.get("summary", "")) for v in trace.verdict.get("violations", [])]
