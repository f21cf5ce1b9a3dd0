"""`Trace`: one run as data, with a versioned JSON round-trip.

Five kinds: `protocol` (a run of a sharding protocol: config, fault plan, schedule, events, verdict),
`store-ops` (a sequence of store-client operations per rank, replayed against a client and an oracle),
`concurrent` (a layout of ops per caller thread run at once on one store, with its measured rate), `engine`
(engine steps replayed on a real engine's own lookup-and-load path, `--engine`, with its measured rate) and `stack`
(a stream of requests and faults replayed on a real serving stack, `--engine vllm`, with its measured rate).
A malformed file raises `TraceError` naming the file and the field.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import re
from pathlib import Path
from typing import Any

import attrs

from model.codec import TraceError, decode, encode
from model.engine_case import CaseError, case_from_json
from model.stack_case import stack_case_from_json
from model.cases import CODECS, MAX_CHUNKS, MAX_OTHERS, faults_from_json, faults_to_json, others_from_json, others_to_json
from model.harness import Outcome
from model.outcome import Violation
from model.store import MEMORY_CLIENT
from model.trace_validate import MAX_OPS, MAX_RANKS, need as _need, validate_concurrent, validate_rate, \
    validate_store_ops

__all__ = ["SCHEMA", "VERSION", "KINDS", "OUTCOMES", "TraceError", "encode", "decode", "MAX_OPS",
           "Trace", "NO_PROTOCOL", "faults_to_json", "faults_from_json", "violations_of", "subject_key"]

SCHEMA = "shardcheck-trace"
VERSION = 1
KINDS = ("protocol", "store-ops", "concurrent", "engine", "stack")
OUTCOMES = ("reproduces", "fixed")
#: The `protocol` of a trace whose subject is not a protocol (a client's, a serving engine's).
NO_PROTOCOL = {"name": "-", "ref": None}
#: Caps on what a trace may claim: a hand-edited or hostile file must not make a replay run for minutes.
MAX_FILE_BYTES = 64 * 1024 * 1024


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
    def from_outcome(cls, outcome: Outcome, *, protocol_ref: str | None, client: str = MEMORY_CLIENT,
                     origin: str = "", summary: str = "", expect: dict | None = None) -> "Trace":
        """The trace of a protocol run."""
        case = outcome.case
        first = outcome.violations[0] if outcome.violations else None
        return cls(
            kind="protocol", property=first.property if first else None,
            summary=summary or (first.summary if first else "every property held"),
            protocol={"name": outcome.protocol, "ref": protocol_ref}, client=client,
            config={"n_ranks": case.n_ranks, "n_chunks": case.n_chunks, "salt": case.salt,
                    "step_bound": case.bound(), "seed": case.seed,
                    **({"others": [others_to_json(o) for o in case.others]} if case.others else {})},
            faults=faults_to_json(case.faults),
            schedule=list(outcome.load.schedule) if outcome.load else list(case.schedule),
            events=[{"step": e.step, "rank": e.rank, "time": e.time, "phase": e.phase, "effect": encode(e.effect),
                     "result": encode(e.result), "note": e.note} for e in outcome.events],
            lookup={"reports": outcome.reports, "planned": outcome.planned, "lcp": outcome.lcp,
                    "cached": sorted(outcome.cached)},
            verdict={"violations": [v.to_json() for v in outcome.violations]},
            expect=dict(expect or {}), origin=origin)

    @classmethod
    def of(cls, kind: str, violations: list[Violation], *, client: str, config: dict, summary: str = "",
           verdict: dict | None = None, **fields: Any) -> "Trace":
        """The trace of a run of a layer whose subject is not a protocol (any kind but `protocol`: see
        `from_outcome`): its property, summary (unless given) and verdict from `violations` (with `verdict`'s other
        entries), no protocol."""
        first = violations[0] if violations else None
        return cls(kind=kind, property=first.property if first else None,
                   summary=summary or (first.summary if first else "every property held"), protocol=dict(NO_PROTOCOL),
                   client=client, config=config,
                   verdict={"violations": [v.to_json() for v in violations], **(verdict or {})}, **fields)

    def case(self) -> Any:
        """The typed case that re-runs this trace (`model.cases.CODECS`: a `Case`, the ops, a `Layout`, an
        `EngineCase`, a `StackCase`)."""
        return CODECS[self.kind].read(self)

    # -- JSON ---------------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"schema": SCHEMA, "version": VERSION, **attrs.asdict(self, recurse=False)}

    def expected(self, name: str, patches: Any = ()) -> str | None:
        """The outcome `expect` records for a replay on `name` (a client or engine) with the engine `patches`: the
        entry of its own key (`subject_key`), else, for the very engine and patches an engine trace records, the
        entry of the engine's name alone (what `check` wrote before keys named patches); None when none."""
        own = self.expect.get(subject_key(name, patches))
        if own is not None or not patches or self.kind != "engine":
            return own
        recorded = (self.config.get("engine"), tuple(self.config.get("patches", [])))
        return self.expect.get(name) if (name, tuple(patches)) == recorded else None

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

    def save_unique(self, out_dir: str | Path, *parts: str) -> Path:
        """Save as `<parts>-<content hash>.json` under `out_dir`: an identical file is reused, a different one
        is never overwritten (a `-2`, `-3`... suffix is added)."""
        out_dir = Path(out_dir)
        if out_dir.exists() and not out_dir.is_dir():
            raise FileExistsError(f"{out_dir} is a file, not a directory")
        body = self.dumps()
        stem = "-".join(_slug(p) for p in parts) + "-" + hashlib.sha256(body.encode()).hexdigest()[:12]
        for i in itertools.count(1):
            path = out_dir / (stem + (f"-{i}" if i > 1 else "") + ".json")
            if path.exists() and path.read_text() == body:
                return path
            try:
                return self.save(path)
            except FileExistsError:
                continue
        raise AssertionError("unreachable")

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
        for name, typ in (("origin", str), ("notes", str), ("events", list), ("lookup", dict), ("faults", dict),
                          ("schedule", list), ("ops", list)):
            if name in data:
                _need(data, name, typ, path)
        _validate_verdict(data["verdict"], path)
        if data["kind"] == "protocol":
            _validate_protocol(data, path)
            if "rate" in data["config"]:  # (measured on fresh stores before it was saved)
                validate_rate(data["config"]["rate"], path)
        elif data["kind"] == "concurrent":
            validate_concurrent(data, path)
        elif data["kind"] == "engine":
            _validate_engine(data, path, case_from_json)
        elif data["kind"] == "stack":
            _validate_engine(data, path, stack_case_from_json)
            if not isinstance(data["config"].get("connector"), str) or not data["config"]["connector"]:
                raise TraceError(path, "config.connector", "expected the KV connector's name")
        else:
            validate_store_ops(data, path)
        known = {f.name for f in attrs.fields(cls)}
        unknown = set(data) - known - {"schema", "version"}
        if unknown:
            raise TraceError(path, sorted(unknown)[0], "unknown field")
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        """Read a trace file; a missing, non-JSON or malformed file raises `TraceError`."""
        try:
            size = Path(path).stat().st_size
            if size > MAX_FILE_BYTES:
                raise TraceError(path, "<file>", f"{size:,} bytes; a trace is at most {MAX_FILE_BYTES:,}")
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise TraceError(path, "<file>", f"cannot read: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise TraceError(path, "<file>", f"not UTF-8 text (byte {exc.start}: {exc.reason})") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceError(path, "<json>", f"not valid JSON: {exc}") from None
        return cls.from_json(data, path)


def subject_key(name: str, patches: Any = ()) -> str:
    """What a replay ran on, as a trace's `expect` keys it and a replay's row names it: the client's or engine's
    name, then each engine patch after a `+` (`lmcache-patched+mod:fn`)."""
    return name + "".join(f"+{p}" for p in patches or ())


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-") or "x"


def _validate_verdict(verdict: dict, path: Any) -> None:
    """`verdict.violations`: a list of `{"property": str, "summary": str, "detail"?: object}`."""
    vs = verdict.get("violations", [])
    if not isinstance(vs, list):
        raise TraceError(path, "verdict.violations", f"expected a list, got {type(vs).__name__}")
    for i, v in enumerate(vs):
        if not isinstance(v, dict) or not isinstance(v.get("property"), str) \
                or not isinstance(v.get("summary", ""), str) or not isinstance(v.get("detail", {}), dict):
            raise TraceError(path, f"verdict.violations[{i}]", "expected {'property': str, 'summary': str, "
                             "'detail': object}")


def _validate_engine(data: dict, path: Any, case_reader: Any) -> None:
    """An engine or a stack trace: `config.engine` (the engine's name), `config.case` (`case_reader`'s:
    `model.engine_case`'s ranks, lookup mode, models, prompts, steps, or `model.stack_case`'s), `config.rate`
    `{"k", "n"}`, `config.options` (the factory options) and `config.patches` (the `--engine-patch` functions
    applied); a stack trace also names its `config.connector`."""
    cfg = data["config"]
    if not isinstance(cfg.get("engine"), str) or not cfg["engine"]:
        raise TraceError(path, "config.engine", f"expected the engine's name, got {cfg.get('engine')!r}")
    try:
        case_reader(cfg.get("case"))
    except CaseError as exc:
        raise TraceError(path, f"config.case.{exc.field}" if exc.field != "case" else "config.case",
                         str(exc).split(": ", 1)[-1]) from None
    validate_rate(cfg.get("rate"), path)
    if not isinstance(cfg.get("options", {}), dict):
        raise TraceError(path, "config.options", "expected an object of factory options")
    patches = cfg.get("patches", [])
    if not isinstance(patches, list) or not all(isinstance(p, str) and ":" in p for p in patches):
        raise TraceError(path, "config.patches", "expected a list of MOD:ATTR strings")
    if not isinstance(data.get("events", []), list):
        raise TraceError(path, "events", "expected a list")


def _validate_protocol(data: dict, path: Any) -> None:
    cfg = data["config"]
    for name, lo, hi in (("n_ranks", 1, MAX_RANKS), ("n_chunks", 0, MAX_CHUNKS)):
        if not isinstance(cfg.get(name), int) or isinstance(cfg.get(name), bool) or not lo <= cfg[name] <= hi:
            raise TraceError(path, f"config.{name}", f"expected an integer in {lo}..{hi}, got {cfg.get(name)!r}")
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
    for field, problem in plan.problems(cfg["n_ranks"], cfg["n_chunks"]):
        raise TraceError(path, f"faults.{field}", problem)
    others = cfg.get("others", [])
    if not isinstance(others, list) or len(others) > MAX_OTHERS:
        raise TraceError(path, "config.others", f"expected a list of at most {MAX_OTHERS} prompts")
    for i, o in enumerate(others):
        try:
            others_from_json(o)
        except (TypeError, ValueError) as exc:
            raise TraceError(path, f"config.others[{i}]", str(exc)) from None
    if not isinstance(data["protocol"].get("name"), str):
        raise TraceError(path, "protocol.name", "expected a string")


def violations_of(trace: Trace) -> list[Violation]:
    """The violations recorded in a trace's verdict, detail included."""
    return [Violation.from_json(v) for v in trace.verdict.get("violations", [])]
