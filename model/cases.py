"""The case of every trace kind, one codec each (`CODECS`, keyed by `model.trace.KINDS`): `read(trace)`, the typed
case that re-runs a trace (`Trace.case()`); `parts(case)`, its reducible parts, what the one delta-debugging shrinker
(`checking.minimise.ddmin`) drops; `rebuild(case, parts)`, the case of those parts only.

| kind | case | parts |
|---|---|---|
| `protocol` | `model.harness.Case` | its faults, each with its kind |
| `store-ops` | the ops, in order | the ops |
| `concurrent` | `model.concurrent_case.Layout` | the ops of every thread |
| `engine` | `model.engine_case.EngineCase` | the steps |
| `stack` | `model.stack_case.StackCase` | the steps |

Also here: the JSON of a protocol case's faults and of its other prompts (`config.others`).
"""
from __future__ import annotations

from typing import Any, Callable

import attrs

from model.concurrent_case import Layout
from model.engine_case import case_from_json
from model.faults import FaultPlan
from model.harness import Case
from model.outcome import OtherPrompt
from model.stack_case import stack_case_from_json

__all__ = ["CaseCodec", "CODECS", "MAX_CHUNKS", "MAX_OTHERS", "others_to_json", "others_from_json",
           "faults_to_json", "faults_from_json"]

#: Caps on what a trace may claim: a hand-edited or hostile file must not make a replay run for minutes.
MAX_CHUNKS, MAX_OTHERS = 1024, 16


@attrs.frozen(kw_only=True)
class CaseCodec:
    """The case of one trace kind (see the module doc)."""

    kind: str
    read: Callable[[Any], Any]
    parts: Callable[[Any], list]
    rebuild: Callable[[Any, list], Any]


# -- protocol cases ---------------------------------------------------------------------------------------------------
def _read_protocol(trace: Any) -> Case:
    c = trace.config
    return Case(n_ranks=c["n_ranks"], n_chunks=c["n_chunks"], salt=c.get("salt", "s0"),
                faults=faults_from_json(trace.faults), schedule=tuple(trace.schedule), seed=c.get("seed"),
                others=tuple(others_from_json(o) for o in c.get("others", [])), step_bound=c.get("step_bound"))


def _protocol_rebuild(case: Case, parts: list) -> Case:
    fields: dict[str, list] = {}
    for kind, item in parts:
        fields.setdefault(kind.field, []).append(item)
    return attrs.evolve(case, faults=FaultPlan(**fields))


# -- the others -------------------------------------------------------------------------------------------------------
def _layout_seed(trace: Any) -> int:
    seeds = trace.config.get("rate", {}).get("seeds") or [0]
    return int(seeds[0])


def _steps_rebuild(case: Any, parts: list) -> Any:
    return attrs.evolve(case, steps=tuple(parts))


#: Every kind's codec, in `model.trace.KINDS` order.
CODECS: dict[str, CaseCodec] = {codec.kind: codec for codec in (
    CaseCodec(kind="protocol", read=_read_protocol, parts=lambda case: list(case.faults.items()),
              rebuild=_protocol_rebuild),
    CaseCodec(kind="store-ops", read=lambda trace: list(trace.ops), parts=list,
              rebuild=lambda case, parts: list(parts)),
    CaseCodec(kind="concurrent",
              read=lambda trace: Layout.from_ops(trace.ops, seed=_layout_seed(trace)),
              parts=lambda layout: layout.to_ops(), rebuild=lambda layout, ops: Layout.from_ops(ops, seed=layout.seed)),
    CaseCodec(kind="engine", read=lambda trace: case_from_json(trace.config["case"]),
              parts=lambda case: list(case.steps), rebuild=_steps_rebuild),
    CaseCodec(kind="stack", read=lambda trace: stack_case_from_json(trace.config["case"]),
              parts=lambda case: list(case.steps), rebuild=_steps_rebuild),
)}


# -- JSON of a protocol case's parts ----------------------------------------------------------------------------------
def others_to_json(other: OtherPrompt) -> dict:
    """A trace's entry for another prompt in the tier (`config.others`)."""
    return {"salt": other.salt, "n_chunks": other.n_chunks, "shared": other.shared, "after": other.after,
            "evicted": list(other.evicted)}


def others_from_json(data: Any) -> OtherPrompt:
    """The other prompt of a `config.others` entry; `ValueError` naming what is wrong."""
    if not isinstance(data, dict) or set(data) - {"salt", "n_chunks", "shared", "after", "evicted"}:
        raise ValueError("expected an object with salt, n_chunks, shared, after, evicted")
    k = data.get("n_chunks")
    if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= MAX_CHUNKS:
        raise ValueError(f"n_chunks: expected an integer in 0..{MAX_CHUNKS}, got {k!r}")
    shared, evicted = data.get("shared", 0), data.get("evicted", [])
    if not isinstance(shared, int) or isinstance(shared, bool) or not 0 <= shared <= k:
        raise ValueError(f"shared: expected an integer in 0..{k}, got {shared!r}")
    if not isinstance(evicted, list) or not all(isinstance(c, int) and 0 <= c < k for c in evicted):
        raise ValueError(f"evicted: expected chunks in 0..{k - 1}")
    if not isinstance(data.get("salt", "t1"), str) or not isinstance(data.get("after", False), bool):
        raise ValueError("salt: expected a string; after: expected true or false")
    return OtherPrompt(salt=data.get("salt", "t1"), n_chunks=k, shared=shared, after=data.get("after", False),
                       evicted=tuple(evicted))


def faults_to_json(plan: FaultPlan) -> dict:
    """A trace's `faults` object (`FaultPlan.to_json`)."""
    return plan.to_json()


def faults_from_json(data: dict) -> FaultPlan:
    """The plan of a trace's `faults` object (`FaultPlan.from_json`)."""
    return FaultPlan.from_json(data)
