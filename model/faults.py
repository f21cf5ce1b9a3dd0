"""Fault plans, and every kind of fault as a record: which keys are evicted when, which completions are lost or late,
and the real faults on the servers (the nemesis).

A `FaultKind` carries everything the strategies need to know about one kind: its `FaultPlan` field (also its key in
a trace), when it strikes, its JSON codec and validation, its text, how it shrinks, how enumeration and random
search generate it, and its hooks: a completion kind's `late` (how late a read completes: what the simulator and the
rank processes are given, `FaultPlan.late`) and `of_late` (the explorer's counterexamples are built from it,
`FaultPlan.of`), a real-server kind's `strike`. The strategies build and read plans by phase (`FaultPlan.of`,
`FaultPlan.at`), never by a kind's field. Adding a kind: a field of `FaultPlan`, a record in `FAULT_KINDS`, its
item's helpers in `model.fault_items` if the item is of a new shape, and the simulator's support for it if it strikes
during the load in a new way (ARCHITECTURE.md; `tests/test_architecture.py` counts it).

Real-server kinds (`family="server"`) are records too: a `ServerFault` item says whose server
(`rank`), where it strikes (`at`: a protocol case's phase, an op of a store-ops run, an op of a concurrent run, an
engine step) and how long it lasts; the record's `strike(control, fault)` hook makes it happen through a
`ServerControl` the strategies are handed (`adapters.nemesis.Nemesis`; the model never starts a process), and its
`loses` says what the key-value register then allows (`model.history.LossyKVModel`).

The serving layers (an engine or a stack case's `fault` step) hold a fault instead: it lasts until a later step ends
it. Their words are `HELD_ACTIONS` (`HELD_MEANINGS`: what each does), and each is the held form of a real-server
kind, said by that kind's record (`held`: the action that strikes it, the one that ends it): `pause`/`resume` of
`server_pause`, `kill`/`restart` of `server_restart_empty`. A deployment's or a stack's `fault(rank, action)` acts
through a `HeldControl` (`adapters.nemesis.Nemesis` again, over the same servers), or its own gate.
"""
from __future__ import annotations

import functools
import math
import random
import typing
from typing import Any, Callable, Iterable, Iterator, Mapping

import attrs

from model.calls import DEFAULT_OP_TIMEOUT
from model.fault_items import (STRIKE_POINTS, Eviction, ServerFault, asyncs, completion_fits, completion_refit,
                              draw_after, draw_delayed, draw_during, draw_lost, earlier, ev_fits, ev_from, ev_json,
                              ev_refit, ev_text, every_copy, load_steps, numbers, sf_fits, sf_from, sf_json,
                              sf_shorter, sf_singles, sf_text)

__all__ = ["Eviction", "FaultPlan", "FaultKind", "FAULT_KINDS", "FAULT_FIELDS", "NEVER", "kind_of",
           "DEFAULT_DELAY", "ServerFault", "ServerControl", "STRIKE_POINTS", "SERVER_KINDS", "SERVER_KIND_NAMES",
           "FAULT_OP_TIMEOUTS", "server_fault_kinds", "HELD_ACTIONS", "HELD_MEANINGS", "HeldControl", "held_kind",
           "check_held"]

#: The delay enumeration gives a delayed completion: twice the reference protocols' wait timeout (1 s).
DEFAULT_DELAY = 2.0
#: How late a completion that never arrives is (`FaultPlan.late`).
NEVER = math.inf


def _tuples(items) -> tuple:
    return tuple(tuple(i) for i in items)


@attrs.frozen(kw_only=True)
class FaultPlan:
    """Every fault injected into one run (one field per `FaultKind`).

    - `evict_before_lookup`: evictions after the store phase, before lookup (they shape the cached set);
    - `evict_after_lookup`: between lookup and load;
    - `evict_during_load`: before the given load step;
    - `lost`: `(rank, i)`: the completion of that rank's i-th `GetAsync` of the load never arrives;
    - `delayed`: `(rank, i, seconds)`: it arrives `seconds` logical seconds after it was issued.
    """

    evict_before_lookup: tuple[Eviction, ...] = attrs.field(default=(), converter=tuple)
    evict_after_lookup: tuple[Eviction, ...] = attrs.field(default=(), converter=tuple)
    evict_during_load: tuple[Eviction, ...] = attrs.field(default=(), converter=tuple)
    lost: tuple[tuple[int, int], ...] = attrs.field(default=(), converter=_tuples)
    delayed: tuple[tuple[int, int, float], ...] = attrs.field(default=(), converter=_tuples)
    server_pause: tuple = attrs.field(default=(), converter=tuple)
    server_restart_empty: tuple = attrs.field(default=(), converter=tuple)
    server_restart_data: tuple = attrs.field(default=(), converter=tuple)
    server_kill_connections: tuple = attrs.field(default=(), converter=tuple)
    server_debug_sleep: tuple = attrs.field(default=(), converter=tuple)
    server_client_pause: tuple = attrs.field(default=(), converter=tuple)
    server_evict: tuple = attrs.field(default=(), converter=tuple)

    def items(self) -> Iterator[tuple["FaultKind", Any]]:
        """Every fault of the plan with its kind, in `FAULT_KINDS` order."""
        for kind in FAULT_KINDS:
            for item in getattr(self, kind.field):
                yield kind, item

    @classmethod
    def of(cls, *, before_lookup: Iterable[Eviction] = (), after_lookup: Iterable[Eviction] = (),
           during_load: Iterable[Eviction] = (), late: Mapping[tuple[int, int], float] | None = None) -> "FaultPlan":
        """The plan of these evictions at each phase (`during_load`: each at its `step`) and these late completions
        (rank r's i-th `GetAsync` of the load -> how many seconds late, `NEVER`: lost), each fault of the kind that
        strikes so (the kind's `when`, its `of_late` hook)."""
        fields: dict[str, list] = {}
        for when, items in (("before-lookup", before_lookup), ("after-lookup", after_lookup),
                            ("during-load", during_load)):
            fields.setdefault(_eviction_kind(when).field, []).extend(items)
        for (rank, i), seconds in (late or {}).items():
            kind, item = next((k, x) for k in _completion_kinds() for x in [k.of_late(rank, i, seconds)]
                              if x is not None)
            fields.setdefault(kind.field, []).append(item)
        return cls(**fields)

    def plus(self, when: str, *evictions: Eviction) -> "FaultPlan":
        """This plan with `evictions` added at `when` ("before-lookup", "after-lookup", "during-load")."""
        field = _eviction_kind(when).field
        return attrs.evolve(self, **{field: getattr(self, field) + evictions})

    def at(self, when: str) -> tuple:
        """The harness faults (evictions) that strike at `when`: "before-lookup", "after-lookup", "during-load"."""
        return tuple(item for kind, item in self.items() if kind.family == "harness" and kind.when == when)

    def late(self) -> dict[tuple[int, int], float]:
        """(rank, i) -> how many seconds late the completion of rank's i-th `GetAsync` of the load arrives (`NEVER`:
        it never does), from every completion kind's `late` hook; the latest wins where two fall on one read."""
        out: dict[tuple[int, int], float] = {}
        for kind, item in self.items():
            if kind.late is not None:
                read, seconds = kind.late(item)
                out[read] = max(seconds, out.get(read, 0.0))
        return out

    def after_lookup(self) -> bool:
        """Whether any fault happens after the lookup (maximality is only claimed without one)."""
        return any(kind.when_of(item) != "before-lookup" for kind, item in self.items())

    def server_faults(self) -> list[tuple["FaultKind", Any]]:
        """The real-server faults of the plan, with their kinds (they need a `ServerControl` to strike)."""
        return [(kind, item) for kind, item in self.items() if kind.family == "server"]

    def striking(self, at: str, step: int | None = None) -> list[tuple["FaultKind", Any]]:
        """The real-server faults that strike at `at` (and before load `step`, for "during-load")."""
        return [(k, f) for k, f in self.server_faults() if f.at == at and (step is None or f.step == step)]

    def size(self) -> int:
        """How many faults the plan injects (what minimisation shrinks)."""
        return sum(1 for _ in self.items())

    def without(self, field: str, index: int) -> "FaultPlan":
        """This plan less entry `index` of `field`."""
        items = list(getattr(self, field))
        del items[index]
        return attrs.evolve(self, **{field: tuple(items)})

    def restricted(self, n_ranks: int, n_chunks: int) -> "FaultPlan":
        """The faults that still fit `n_ranks` ranks and `n_chunks` chunks."""
        return FaultPlan(**{k.field: tuple(x for x in getattr(self, k.field) if k.fits(x, n_ranks, n_chunks))
                            for k in FAULT_KINDS})

    def refitted(self, n_ranks: int, n_chunks: int, how: str = "owner", *, was: int | None = None) -> "FaultPlan":
        """Every fault re-placed to fit `n_ranks` x `n_chunks` (`FaultKind.refit`), so that a smaller shape keeps
        the fault that made a case fail; one that cannot be re-placed is dropped. `how` (`REFITS`): "owner" moves
        a chunk that no longer exists down to the last chunk with the same owner, "shift" moves every chunk down by
        as many chunks as the shape lost (`was` chunks before; a fault keeps its distance from the end), "last"
        puts it on the last chunk; ranks wrap, a completion's GetAsync index is cut to the rank's share."""
        out = {}
        for k in FAULT_KINDS:
            placed = (x if k.fits(x, n_ranks, n_chunks) and how != "shift"
                      else k.refit(x, n_ranks, n_chunks, how, n_chunks if was is None else was)
                      for x in getattr(self, k.field))
            out[k.field] = tuple(dict.fromkeys(x for x in placed if x is not None and k.fits(x, n_ranks, n_chunks)))
        return FaultPlan(**out)

    def simulator_options(self) -> dict:
        """The load simulator's fault options (`model.sim.Simulator`): what strikes during the load (a real-server
        fault "during-load" comes before its load step, as an eviction does)."""
        during = tuple(f for _, f in self.striking("during-load"))
        return {"evictions": self.at("during-load") + during, "late": self.late()}

    def text(self) -> str:
        """The plan in words."""
        return "; ".join(kind.text(item) for kind, item in self.items()) or "no fault"

    def to_json(self) -> dict:
        """Every harness kind's list, and the real-server kinds that the plan holds."""
        return {kind.field: [kind.to_json(x) for x in getattr(self, kind.field)] for kind in FAULT_KINDS
                if kind.family == "harness" or getattr(self, kind.field)}

    @classmethod
    def from_json(cls, data: Any) -> "FaultPlan":
        """The plan of a trace's `faults` object; `ValueError` naming the kind and the entry when malformed."""
        if not isinstance(data, dict):
            raise ValueError(f"expected an object, got {type(data).__name__}")
        unknown = set(data) - set(FAULT_FIELDS)
        if unknown:
            raise ValueError(f"unknown fault kind {sorted(unknown)[0]!r} (known: {', '.join(FAULT_FIELDS)})")
        fields = {}
        for kind in FAULT_KINDS:
            raw = data.get(kind.field, [])
            if not isinstance(raw, list):
                raise ValueError(f"{kind.field}: expected a list")
            fields[kind.field] = tuple(_decoded(kind, i, x) for i, x in enumerate(raw))
        return cls(**fields)

    def problems(self, n_ranks: int, n_chunks: int) -> list[tuple[str, str]]:
        """(`field[i]`, what is wrong) for every fault outside `n_ranks` x `n_chunks`."""
        return [(f"{kind.field}[{i}]", f"{kind.text(x)} is outside {n_ranks} ranks x {n_chunks} chunks")
                for kind in FAULT_KINDS for i, x in enumerate(getattr(self, kind.field))
                if not kind.fits(x, n_ranks, n_chunks)]


@functools.cache
def _eviction_kind(when: str) -> "FaultKind":
    """The kind of eviction that strikes at `when`."""
    return next(k for k in FAULT_KINDS if k.family == "harness" and k.when == when)


@functools.cache
def _completion_kinds() -> tuple["FaultKind", ...]:
    """The kinds that make a completion late (`FaultKind.of_late`)."""
    return tuple(k for k in FAULT_KINDS if k.of_late is not None)


def _decoded(kind: "FaultKind", i: int, raw: Any) -> Any:
    try:
        return kind.from_json(raw)
    except (TypeError, ValueError, KeyError) as exc:
        raise ValueError(f"{kind.field}[{i}]: {exc}") from None


@attrs.frozen(kw_only=True)
class FaultKind:
    """One kind of fault, everything about it in one place (see the module doc).

    `when`: "before-lookup" (shapes the cached set), "after-lookup", "during-load", or "completion" (of a
    `GetAsync` of the load); "server" for a real-server kind, whose item says where it strikes (`when_of`).
    `level`: the enumeration level that tries every single fault of this kind (None: the kind is enumerated as every
    subset, the cached sets). A completion kind has `late(item)`: ((rank, i), how many seconds late rank's i-th
    `GetAsync` of the load completes, `NEVER`: never), the simulator's hook, and its inverse `of_late(rank, i,
    seconds)`: the item, or None when that lateness is not of this kind. Real-server kinds (`family="server"`) add
    `strike(control, fault)` (the hook that makes it happen through a `ServerControl`), `loses` (what the key-value
    register allows afterwards: "nothing", "all" of the rank's keys, "snapshot": back to the state at the strike,
    "any" key),
    `needs_process` (it acts on the server's process: only servers shardcheck started) and `held`, when the serving
    layers hold it (`HELD_ACTIONS`): the action that strikes it and the one that ends it.
    """

    field: str
    when: str
    level: str | None
    text: Callable[[Any], str]
    to_json: Callable[[Any], Any]
    from_json: Callable[[Any], Any]
    fits: Callable[[Any, int, int], bool]
    singles: Callable[[int, int], Iterator[Any]]
    draw: Callable[[random.Random, int, int], tuple]
    smaller: Callable[[Any], Iterator[Any]] = lambda item: iter(())
    refit: Callable[[Any, int, int, str, int], Any] = lambda item, n, k, how, was: None
    late: Callable[[Any], tuple[tuple[int, int], float]] | None = None
    of_late: Callable[[int, int, float], Any] | None = None
    family: str = "harness"
    strike: Callable[[Any, Any], None] | None = None
    loses: str = "nothing"
    needs_process: bool = False
    held: tuple[str, str] | None = None

    def when_of(self, item: Any) -> str:
        """Where this item strikes: the kind's `when`, or a real-server fault's own `at`."""
        return item.at if self.family == "server" else self.when


FAULT_KINDS: tuple[FaultKind, ...] = (
    FaultKind(field="evict_before_lookup", when="before-lookup", level=None,
              text=ev_text("before lookup"), to_json=ev_json, from_json=ev_from(False), fits=ev_fits,
              singles=lambda n, k: (Eviction(c) for c in range(k)),
              draw=lambda rng, n, k: tuple(Eviction(c) for c in range(k) if rng.random() < 0.1), refit=ev_refit,
              smaller=every_copy),
    FaultKind(field="evict_after_lookup", when="after-lookup", level="after-lookup",
              text=ev_text("between lookup and load"), to_json=ev_json, from_json=ev_from(False), fits=ev_fits,
              singles=lambda n, k: (Eviction(c) for c in range(k)), draw=draw_after, refit=ev_refit,
              smaller=every_copy),
    FaultKind(field="evict_during_load", when="during-load", level="during-load",
              text=ev_text("before load step"), to_json=ev_json, from_json=ev_from(True), fits=ev_fits,
              singles=lambda n, k: (Eviction(c, step=s) for s in range(load_steps(n, k)) for c in range(k)),
              draw=draw_during, smaller=earlier, refit=ev_refit),
    FaultKind(field="lost", when="completion", level="completions",
              text=lambda x: f"rank {x[0]}'s GetAsync #{x[1]} completion lost", to_json=list,
              from_json=numbers(2, integers=2), fits=completion_fits,
              singles=lambda n, k: ((r, i) for r in range(n) for i in range(asyncs(n, k))), draw=draw_lost,
              refit=completion_refit, late=lambda x: ((x[0], x[1]), NEVER),
              of_late=lambda r, i, s: (r, i) if s == NEVER else None),
    FaultKind(field="delayed", when="completion", level="completions",
              text=lambda x: f"rank {x[0]}'s GetAsync #{x[1]} completion delayed {x[2]:g} s", to_json=list,
              from_json=numbers(3, integers=2), fits=completion_fits,
              singles=lambda n, k: ((r, i, DEFAULT_DELAY) for r in range(n) for i in range(asyncs(n, k))),
              draw=draw_delayed, refit=completion_refit, late=lambda x: ((x[0], x[1]), x[2]),
              of_late=lambda r, i, s: (r, i, s) if s != NEVER else None),
)


#: How long a lasting fault lasts by default, as a multiple of the op timeout: longer than one call's bound, so a
#: client that waits on a stuck server without a bound of its own is caught.
FAULT_OP_TIMEOUTS = 1.5


class ServerControl(typing.Protocol):
    """What a real-server fault strikes through, rank by rank (`adapters.nemesis.Nemesis`). Each call returns once
    the fault is in place; a lasting one ends by itself after `seconds`. `healed(timeout)`: the time (monotonic)
    the last fault struck so far was over, waiting at most `timeout`; None while one still lasts."""

    def pause(self, rank: int, seconds: float) -> None: ...

    def kill_restart(self, rank: int, *, keep_data: bool, seconds: float) -> None: ...

    def kill_connections(self, rank: int) -> None: ...

    def debug_sleep(self, rank: int, seconds: float) -> None: ...

    def client_pause(self, rank: int, seconds: float) -> None: ...

    def evict_by_policy(self, rank: int) -> None: ...

    def healed(self, timeout: float) -> float | None: ...


#: The held faults of the serving layers (an engine or stack case's `fault` step: JSON words of traces), each with
#: what it does to the rank's server; which real-server kind each is the held form of is that kind's `held`.
HELD_MEANINGS = {
    "pause": "SIGSTOP the server: it holds its connections and answers nothing until `resume`",
    "resume": "SIGCONT a paused server (nothing otherwise)",
    "kill": "SIGKILL the server: down, its data gone, until `restart`",
    "restart": "start the server again on its port, empty (a running one is killed first)",
}
HELD_ACTIONS: tuple[str, ...] = tuple(HELD_MEANINGS)


def check_held(action: str) -> str:
    """`action` if it is one of `HELD_ACTIONS`; `ValueError` naming them otherwise."""
    if action not in HELD_ACTIONS:
        raise ValueError(f"unknown server fault {action!r} (expected one of {', '.join(HELD_ACTIONS)})")
    return action


class HeldControl(typing.Protocol):
    """What a serving layer's held faults act through, rank by rank (`adapters.nemesis.Nemesis`): `hold(rank,
    action)` (one of `HELD_ACTIONS`, in place when it returns), `reachable(rank)` (neither paused nor down),
    `resume_all()` (every paused server resumed: on every exit path, a paused server never outlives a case) and
    `restore_all()` (every server back, a killed one started again empty: a stack reused for the next case).
    The deployment and the stacks hold theirs as this type."""

    def hold(self, rank: int, action: str) -> None: ...

    def reachable(self, rank: int) -> bool: ...

    def resume_all(self) -> None: ...

    def restore_all(self) -> None: ...


def _server_kind(field: str, what: str, strike: Callable[[Any, ServerFault], None], *, seconds: float,
                 loses: str = "nothing", needs_process: bool = False, held: tuple[str, str] | None = None) -> FaultKind:
    return FaultKind(field=field, when="server", level="nemesis", text=sf_text(what), to_json=sf_json,
                     from_json=sf_from, fits=sf_fits, singles=sf_singles(seconds), draw=lambda rng, n, k: (),
                     smaller=sf_shorter, family="server", strike=strike, loses=loses, needs_process=needs_process,
                     held=held, refit=lambda f, n, k, how, was: attrs.evolve(f, rank=f.rank % n))


_LASTS = FAULT_OP_TIMEOUTS * DEFAULT_OP_TIMEOUT
#: The real-server kinds, in the order `check --nemesis all` strikes them.
SERVER_KINDS: tuple[FaultKind, ...] = (
    _server_kind("server_pause", "paused (SIGSTOP, then SIGCONT)", lambda c, f: c.pause(f.rank, f.seconds),
                 seconds=_LASTS, needs_process=True, held=("pause", "resume")),
    _server_kind("server_kill_connections", "dropped its client connections (CLIENT KILL)",
                 lambda c, f: c.kill_connections(f.rank), seconds=0.0),
    _server_kind("server_restart_empty", "killed and restarted empty on its port",
                 lambda c, f: c.kill_restart(f.rank, keep_data=False, seconds=f.seconds), seconds=0.2, loses="all",
                 needs_process=True, held=("kill", "restart")),
    _server_kind("server_restart_data", "saved, killed and restarted with its snapshot",
                 lambda c, f: c.kill_restart(f.rank, keep_data=True, seconds=f.seconds), seconds=0.2,
                 loses="snapshot", needs_process=True),
    _server_kind("server_debug_sleep", "slowed (DEBUG SLEEP)", lambda c, f: c.debug_sleep(f.rank, f.seconds),
                 seconds=_LASTS),
    _server_kind("server_client_pause", "holding its clients (CLIENT PAUSE ALL)",
                 lambda c, f: c.client_pause(f.rank, f.seconds), seconds=_LASTS),
    _server_kind("server_evict", "evicting by its own policy (maxmemory, allkeys-lru, filled by another prompt)",
                 lambda c, f: c.evict_by_policy(f.rank), seconds=0.0, loses="any"),
)
#: `--nemesis` names: a kind's field without its `server_` prefix, with dashes.
SERVER_KIND_NAMES = {k.field.removeprefix("server_").replace("_", "-"): k for k in SERVER_KINDS}

FAULT_KINDS = FAULT_KINDS + SERVER_KINDS
FAULT_FIELDS = tuple(k.field for k in FAULT_KINDS)
#: The ways `FaultPlan.refitted` re-places a fault in a smaller shape.
REFITS = ("owner", "shift", "last")


def server_fault_kinds(spec: str) -> tuple[FaultKind, ...]:
    """The real-server kinds `--nemesis` names: `all`, `none`, or a comma-separated list of `SERVER_KIND_NAMES`;
    `ValueError` naming an unknown one."""
    spec = spec.strip()
    if spec == "all":
        return SERVER_KINDS
    if spec in ("none", ""):
        return ()
    out = []
    for name in (p.strip() for p in spec.split(",")):
        if name not in SERVER_KIND_NAMES:
            raise ValueError(f"unknown fault kind {name!r} (known: {', '.join(SERVER_KIND_NAMES)}, all, none)")
        out.append(SERVER_KIND_NAMES[name])
    return tuple(dict.fromkeys(out))


def held_kind(action: str) -> FaultKind:
    """The real-server kind whose held form `action` is (`FaultKind.held`); `ValueError` for an unknown action."""
    check_held(action)
    return next(k for k in SERVER_KINDS if k.held is not None and action in k.held)


def kind_of(field: str) -> FaultKind:
    """The kind whose `FaultPlan` field is `field`."""
    for kind in FAULT_KINDS:
        if kind.field == field:
            return kind
    raise KeyError(field)
