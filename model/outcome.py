"""The records of a run: `Case` (what to run), `Outcome` (what it produced), `Violation`, `Event`, `SimResult`."""
from __future__ import annotations

from typing import Any

import attrs

from model.codec import decode, encode
from model.faults import FaultPlan

__all__ = ["Violation", "Event", "SimResult", "OtherPrompt", "Case", "Outcome", "leading_run", "default_step_bound"]


@attrs.define
class Violation:
    """One property a run violated: its name, a one-line summary, and structured detail."""

    property: str
    summary: str
    detail: dict = attrs.field(factory=dict)

    def to_json(self) -> dict:
        """The one JSON shape of a violation (a trace's `verdict.violations[i]`)."""
        return {"property": self.property, "summary": self.summary, "detail": encode(self.detail)}

    @classmethod
    def from_json(cls, data: Any) -> "Violation":
        """The violation of a trace's verdict entry, detail included; `ValueError` naming what is wrong."""
        if not isinstance(data, dict) or not isinstance(data.get("property"), str):
            raise ValueError("expected an object with a string 'property'")
        detail = decode(data.get("detail") or {})
        return cls(data["property"], str(data.get("summary", "")), detail if isinstance(detail, dict) else {})


@attrs.define
class Event:
    """One thing that happened: `rank` did `effect` (at `step`, logical `time`) and got `result`."""

    step: int
    rank: int | None
    time: float
    phase: str
    effect: Any
    result: Any = None
    note: str = ""


@attrs.define
class SimResult:
    """What a simulated phase produced."""

    results: dict[int, Any]
    events: list[Event]
    schedule: list[int]
    violations: list[Violation]
    steps: int
    reads: list[tuple[int, str]]
    collectives: list[list[tuple[str, int | None]]]


def default_step_bound(n_ranks: int, n_chunks: int) -> int:
    """A generous bound on load steps: a terminating load needs about 2 * n_chunks + 3 * n_ranks."""
    return 20 * (n_chunks + n_ranks) + 50


@attrs.frozen(kw_only=True)
class OtherPrompt:
    """Another prompt in the same shared tier as the checked one (the tier outlives one prompt).

    It shares the checked prompt's first `shared` chunks (hashes and KV bytes: the same prefix, as requests with a
    common system prompt do) and then diverges under `salt` (a tenant, a model, or other text); it is stored before
    the checked prompt's store phase (`after=False`) or after it, and its chunks `evicted` are evicted from every
    store after all store phases, before the lookup.
    """

    salt: str = "t1"
    n_chunks: int = 0
    shared: int = 0
    after: bool = False
    evicted: tuple[int, ...] = attrs.field(default=(), converter=tuple)


@attrs.frozen
class Case:
    """One configuration to run: sizes, the salt of its keys, faults, schedule and step bound, and the other prompts
    that share its stores."""

    n_ranks: int
    n_chunks: int
    salt: str = "s0"
    faults: FaultPlan = FaultPlan()
    schedule: tuple[int, ...] = attrs.field(default=(), converter=tuple)
    seed: int | None = None
    step_bound: int | None = None
    others: tuple[OtherPrompt, ...] = attrs.field(default=(), converter=tuple)

    def bound(self) -> int:
        return self.step_bound if self.step_bound is not None else default_step_bound(self.n_ranks, self.n_chunks)


@attrs.define
class Outcome:
    """Everything one run produced, and the violations found in it."""

    case: Case
    protocol: str
    hashes: list[str]
    kv: list[bytes]
    written: dict[int, dict[str, int]]
    cached: frozenset[int]
    lcp: int
    reports: list[int] | None = None
    planned: int | None = None
    load: SimResult | None = None
    events: list[Event] = attrs.field(factory=list)
    violations: list[Violation] = attrs.field(factory=list)
    #: Bytes other prompts stored that this prompt never did -> which prompt and chunk (isolation).
    foreign: dict[bytes, str] = attrs.field(factory=dict)
    #: Chunks whose keys this prompt wrote are present but hold another prompt's bytes at the lookup.
    stale: frozenset[int] = frozenset()
    #: (cached set, planned) of a lookup made before the other prompts' evictions, when there were some.
    before_other_evictions: tuple[frozenset[int], Any] | None = None

    @property
    def results(self) -> dict[int, Any]:
        return self.load.results if self.load else {}

    def violated(self) -> list[str]:
        return sorted({v.property for v in self.violations})


def leading_run(cached: frozenset[int] | set[int], n_chunks: int) -> int:
    """The length of the leading run of cached chunks."""
    u = 0
    while u < n_chunks and u in cached:
        u += 1
    return u


