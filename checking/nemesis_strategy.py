"""The nemesis strategy of `check`: real faults on the servers shardcheck started, at every layer.

For each fault kind of the run's `NemesisPlan` (`--nemesis`), in turn while its time lasts:

1. a store-ops scenario (`nemesis_ops`): keys written, one deleted, the fault struck on rank 0's server, every read
   path while it lasts, the recovery probe, every path again;
2. a concurrent layout (`nemesis_layout`): three callers over the declared paths, the fault struck at the run's third
   op, `NEMESIS_RUNS` runs judged by their rate;
3. protocol cases over the check's runner (built with the plan's control): the fault before the lookup, between
   lookup and load, and before load step 0, on rank 0's server.

Each fault lasts longer than one call's bound where it lasts at all (`fault_seconds`). The first violation is a
`Finding` whose trace strikes the same fault at the same step on replay. A kind the target's servers cannot take
(a process fault on a server shardcheck did not start) is skipped and said so.
"""
from __future__ import annotations

import itertools
import time
from typing import Any, Callable

import attrs

from checking.api import SearchContext
from checking.concurrency import make_layout, measure, thread_safe
from checking.faulted import fault_op
from checking.concurrency_strategy import to_trace
from checking.storeops import run_ops
from model.contract import declared_paths
from model.faults import FAULT_OP_TIMEOUTS, FaultKind, FaultPlan, ServerFault
from model.finding import Finding, Rate
from model.timing import HarnessOutcome
from model.outcome import Case
from model.trace import Trace, violations_of
from runtime.bounded import BoundedStore

__all__ = ["NemesisPlan", "NemesisCoverage", "Nemesis", "NotStruck", "plan_for", "fault_seconds", "nemesis_ops", "run_nemesis_scenarios",
           "nemesis_layout", "nemesis_search", "nemesis_cases", "NEMESIS_RUNS"]

#: Runs of each kind's faulted concurrent layout (each strikes once; a finding is judged by its rate).
NEMESIS_RUNS = 3
_runs = itertools.count()


@attrs.frozen(kw_only=True)
class NemesisPlan:
    """The real faults of a run: the kinds (`--nemesis`), `control_for(stores, kind)` (a `ServerControl` over those
    stores' servers, or None when that kind cannot strike them), the recovery bound (None: twice the op timeout)."""

    kinds: tuple[FaultKind, ...]
    control_for: Callable[[list, FaultKind], Any]
    recovery_seconds: float | None = None
    #: Asked for explicitly (`--nemesis KINDS`): `check` runs the nemesis first.
    first: bool = False

    def control(self, stores: list) -> Any:
        """A control for a protocol case's stores (every kind of the plan strikes through it)."""
        return self.control_for(stores, None)


def plan_for(client: Any, client_options: dict, spec: str | None, *, recovery_seconds: float | None = None,
             nemesis: Callable[..., Any] | None = None) -> NemesisPlan | None:
    """The plan of `--nemesis spec` for `client` (a `runtime.registry.Client`), or None: no real faults, striking
    through `nemesis(user_servers=...) -> control_for(stores, kind)` (`adapters.catalogue.nemesis`, handed down;
    None: there is none, and only the default asks for no faults). Without `spec`, every kind on servers shardcheck
    started (an in-memory client has none); given explicitly, servers passed with `urls` are faulted too (admin
    faults only: process faults need servers shardcheck started). `ValueError` naming what is wrong (an unknown
    kind, a bad bound, an in-memory client asked for faults, no nemesis)."""
    import math
    from model.faults import server_fault_kinds
    if recovery_seconds is not None and (not math.isfinite(recovery_seconds) or recovery_seconds <= 0):
        raise ValueError(f"--recovery-seconds must be a positive number of seconds, got {recovery_seconds:g}")
    kinds = server_fault_kinds("all" if spec is None else spec)
    if not kinds:
        return None
    if client.in_memory:
        if spec is None:
            return None
        raise ValueError(f"client {client.name!r} is in memory: it has no servers to fault")
    if nemesis is None:
        if spec is None:
            return None
        raise ValueError("no nemesis was handed down here to strike real faults with")
    user_servers = spec is not None and "urls" in client_options
    return NemesisPlan(kinds=kinds, control_for=nemesis(user_servers=user_servers),
                       recovery_seconds=recovery_seconds, first=spec is not None)


def fault_seconds(kind: FaultKind, op_timeout: float) -> float:
    """How long `kind` lasts: a lasting fault longer than one call's bound (`FAULT_OP_TIMEOUTS`), a restart's down time
    a tenth of the op timeout... 0 for the instantaneous ones."""
    default = next(kind.singles(1, 1)).seconds
    if not default:
        return 0.0
    return round(FAULT_OP_TIMEOUTS * op_timeout if default >= 1.0 else 0.2 * op_timeout, 3)


# -- 1. store-ops scenarios ------------------------------------------------------------------------------------
def _value(tag: str, n: int) -> list[int]:
    seed = (tag.encode() * (n // max(1, len(tag)) + 1))[:n]
    return [(b + i) % 256 for i, b in enumerate(seed)]


def nemesis_ops(kind: FaultKind, *, op_timeout: float, batch: bool = True, max_value: int | None = None) -> list[dict]:
    """Keys written (one deleted), `kind` struck on rank 0's server, every read path while it lasts, the recovery,
    and every path again after it, with a write and a delete (rank 1's server is never struck)."""
    def v(tag: str) -> list[int]:
        return _value(tag, 40 if max_value is None else min(40, max_value))

    reads = [{"rank": 0, "op": "get", "key": "sc:n0"}, {"rank": 0, "op": "get", "key": "sc:ndel"},
             {"rank": 0, "op": "contains", "key": "sc:n1"}, {"rank": 0, "op": "get_async", "key": "sc:n0"},
             {"rank": 0, "op": "get_batch", "keys": ["sc:n0", "sc:n1", "sc:ndel"]}]
    ops = [{"rank": 0, "op": "put", "key": "sc:n0", "value": v("n0")},
           {"rank": 0, "op": "put", "key": "sc:n1", "value": v("n1")},
           {"rank": 0, "op": "put", "key": "sc:ndel", "value": v("ndel")},
           {"rank": 0, "op": "delete", "key": "sc:ndel"},
           {"rank": 1, "op": "put", "key": "sc:other", "value": v("other")},
           fault_op(kind.field, 0, fault_seconds(kind, op_timeout)), *reads,
           {"rank": 1, "op": "get", "key": "sc:other"},
           {"op": "recover"}, *reads,
           {"rank": 0, "op": "put", "key": "sc:n2", "value": v("n2")}, {"rank": 0, "op": "get", "key": "sc:n2"},
           {"rank": 0, "op": "delete", "key": "sc:n0"}, {"rank": 0, "op": "get", "key": "sc:n0"}]
    return [op for op in ops if batch or op.get("op") != "get_batch"]


def run_nemesis_scenarios(client: Any, *, op_timeout: float, kinds: tuple[FaultKind, ...], control_for: Any,
                          recovery_seconds: float | None = None, options: dict | None = None,
                          should_stop: Callable[[], bool] = lambda: False,
                          struck: dict | None = None, first_only: bool = False) -> list[Trace]:
    """`nemesis_ops` of every kind on fresh bounded stores of `client`, struck through `control_for(stores, kind)` (a
    `ServerControl`, closed after each, or None: the kind is skipped); the store-ops trace of each that fails.
    `struck` records each kind that ran (True) or could not (False)."""
    found = []
    factory_options = {**client.accepted({"op_timeout": op_timeout}), **(options or {})}
    for kind in kinds:
        if should_stop():
            break
        stores = [BoundedStore(s, op_timeout) for s in client.stores(2, **factory_options)]
        control = violations = None
        try:
            control = control_for(stores, kind)
            if struck is not None:
                struck[kind.field] = control is not None
            if control is None:
                continue
            max_value = min((s.max_value_bytes or 1 << 30) for s in stores)
            batch = all(callable(getattr(s.inner, "get_batch", None)) for s in stores)
            ops = nemesis_ops(kind, op_timeout=op_timeout, batch=batch, max_value=max_value)
            tag = f"nemesis:{next(_runs)}:"
            tagged = [{**op, **({"key": tag + op["key"]} if "key" in op else
                                {"keys": [tag + k for k in op["keys"]]} if "keys" in op else {})} for op in ops]
            _, violations = run_ops(stores, tagged, wait_bound=op_timeout, control=control,
                                    recovery_seconds=recovery_seconds)
        finally:
            if control is not None:
                control.close()
            for s in stores:
                s.close()
        if violations:
            v = violations[0]
            config = {"n_ranks": 2, "op_timeout": op_timeout,
                      **({"recovery_seconds": recovery_seconds} if recovery_seconds is not None else {})}
            found.append(Trace.of("store-ops", [v], summary=f"{kind.field}: {v.summary}", client=client.name,
                                  config=config, ops=ops, expect={client.name: "reproduces"},
                                  origin=f"nemesis:{kind.field}"))
            if first_only:
                break
    return found


# -- 2. concurrent runs --------------------------------------------------------------------------------------
def nemesis_layout(kind: FaultKind, seed: int, *, paths: tuple[str, ...], op_timeout: float) -> tuple[Any, list, float]:
    """A layout of 3 callers over the declared paths, `kind` struck on the server at the run's third op, and the run's
    bound (the fault's length plus three op timeouts and a second)."""
    layout = make_layout(seed, threads=3, ops=6, keys=3, paths=paths)
    seconds = fault_seconds(kind, op_timeout)
    return layout, [(kind, ServerFault(0, "run", 2, seconds))], seconds + 3 * op_timeout + 1.0


def nemesis_search(client: Any, *, kinds: tuple[FaultKind, ...], control_for: Callable[..., Any], seed: int,
                   should_stop: Callable[[], bool], op_timeout: float, recovery_seconds: float | None = None,
                   options: dict | None = None, rates: dict | None = None) -> Trace | None:
    """For each kind, `NEMESIS_RUNS` runs of `nemesis_layout` on a fresh store of `client`, each striking the fault;
    the first that shows a violation, as a concurrent trace with its rate (not minimised: each run costs the fault's
    length). `rates` records k/n per kind that ran."""
    factory_options = {**client.accepted({"op_timeout": op_timeout}), **(options or {})}
    for kind in kinds:
        if should_stop():
            break
        stores = client.stores(1, **factory_options)
        control = None
        try:
            control = control_for(stores, kind)
            if control is None or not thread_safe(stores[0]):
                continue
            layout, strikes, bound = nemesis_layout(kind, seed, paths=declared_paths(stores[0]), op_timeout=op_timeout)
            rate = measure(stores[0], layout, runs=NEMESIS_RUNS, bound=bound, strikes=strikes, control=control,
                           should_stop=should_stop, op_timeout=op_timeout, recovery_seconds=recovery_seconds)
        finally:
            if control is not None:
                control.close()
            for s in stores:
                s.close()
        if rates is not None:
            rates[kind.field] = [rate.k, rate.n]
        if rate.k:
            options = {"op_timeout": op_timeout, **({"recovery_seconds": recovery_seconds}
                                                    if recovery_seconds is not None else {})}
            return to_trace(layout, rate, client=client.name, bound=bound, seeds=[seed], strikes=strikes,
                            origin=f"nemesis:concurrent:{kind.field}", options=options)
    return None


# -- 3. protocol cases ---------------------------------------------------------------------------------------
def nemesis_cases(kind: FaultKind, *, op_timeout: float, n_ranks: int = 2, n_chunks: int = 3) -> list[Case]:
    """The protocol cases of `kind`: every chunk cached, the fault on rank 0's server before the lookup, between lookup
    and load, and before load step 0."""
    seconds = fault_seconds(kind, op_timeout)
    return [Case(n_ranks, n_chunks, faults=FaultPlan(**{kind.field: (ServerFault(0, at, step, seconds),)}))
            for at, step in (("before-lookup", None), ("after-lookup", None), ("during-load", 0))]


# -- the strategy ----------------------------------------------------------------------------------------------
@attrs.define
class NemesisCoverage:
    """What the nemesis struck: per layer, the kinds that ran (and concurrent rates), the protocol cases, the kinds
    the target's servers could not take, or why it did not run."""

    scenarios: dict = attrs.field(factory=dict)
    concurrent: dict = attrs.field(factory=dict)
    cases: int = 0
    case_kinds: list = attrs.field(factory=list)
    skipped: str = ""
    #: Kinds that did not fit in what was left of the strategy's share (each takes its length and three op timeouts).
    did_not_fit: list = attrs.field(factory=list)

    def text(self) -> str:
        if self.skipped:
            return f"not run: {self.skipped}"
        ran = [k for k, ok in self.scenarios.items() if ok]
        cannot = [k for k, ok in self.scenarios.items() if not ok]
        parts = [f"{len(ran)} fault kind(s) in store-ops scenarios",
                 f"{len(self.concurrent)} in concurrent runs ({sum(n for _, n in self.concurrent.values())} runs)",
                 f"{self.cases} protocol case(s) over {len(self.case_kinds)} kind(s)"]
        unfit = self.unfit()
        return ", ".join(parts) + (f"; not on these servers: {', '.join(cannot)}" if cannot else "") + (
            f"; not struck, too long for the strategy's share of the budget: {', '.join(unfit)}" if unfit else "")

    def unfit(self) -> list[str]:
        """The kinds never struck because they did not fit in the time left."""
        return [k for k in dict.fromkeys(self.did_not_fit) if k not in self.scenarios]

    def to_json(self) -> dict:
        return attrs.asdict(self)


class NotStruck(HarnessOutcome):
    """Faults asked for (`--nemesis KINDS`) that the budget left no time to strike: the check is `undecided`."""


class Nemesis:
    """`check`'s strategy of real faults (see the module doc), with a `NemesisPlan` in the context (`--nemesis`): after
    the fixed scenarios on a real target, or first when the faults were asked for explicitly. A fault is struck only
    when what it takes (its length and three op timeouts) fits in the phase: none is cut short."""

    name = "nemesis"

    def search(self, ctx: SearchContext) -> Finding | None:
        """The first finding; `NotStruck` when faults asked for (`--nemesis KINDS`) found none and some asked kind
        was never struck for lack of time: a check that struck none of them has not judged the client under them."""
        cov = ctx.coverage.of(self.name, NemesisCoverage)
        plan = getattr(ctx, "nemesis", None)
        if plan is None or not plan.kinds:
            cov.skipped = "no real faults asked for (--nemesis none, or servers shardcheck did not start)"
            return None
        finding = self._search(ctx, cov, plan)
        unfit = cov.unfit()
        if finding is None and plan.first and unfit:
            raise NotStruck(f"the faults asked for were not all struck: {', '.join(unfit)} (each takes its length "
                            f"and three op timeouts) did not fit in the nemesis's share of the budget; give a longer "
                            f"--budget")
        return finding

    def _search(self, ctx: SearchContext, cov: NemesisCoverage, plan: Any) -> Finding | None:
        t = ctx.target

        def fits(kind: FaultKind, runs: int = 1) -> bool:  # no fault starts that would not end within the phase
            cost = runs * (fault_seconds(kind, ctx.op_timeout) + 3 * ctx.op_timeout + 1.0)
            return not ctx.should_stop() and time.monotonic() + cost < ctx.phase_end

        common = {"op_timeout": ctx.op_timeout, "control_for": plan.control_for,
                  "recovery_seconds": plan.recovery_seconds, "options": dict(t.client_options)}
        for kind in plan.kinds:
            if not fits(kind):
                cov.did_not_fit.append(kind.field)
                continue
            found = run_nemesis_scenarios(t.client, kinds=(kind,), struck=cov.scenarios, **common)
            if found:
                return Finding(strategy=f"nemesis:{kind.field}", violations=violations_of(found[0]), trace=found[0])
        kinds = tuple(k for k in plan.kinds if cov.scenarios.get(k.field))
        for kind in kinds:
            if fits(kind, NEMESIS_RUNS):
                trace = nemesis_search(t.client, seed=ctx.seed, rates=cov.concurrent, kinds=(kind,),
                                       should_stop=ctx.should_stop, **common)
                if trace is not None:
                    return Finding(strategy="nemesis:concurrent", violations=violations_of(trace), trace=trace,
                                   rate=Rate.from_json(trace.config["rate"]))
        if t.runner != "sim":
            cov.case_kinds.append(f"none: real faults in protocol cases need the sim runner, not {t.runner}")
            return None
        for kind in kinds:
            for case in nemesis_cases(kind, op_timeout=ctx.op_timeout, n_ranks=t.rank_cap(2)):
                if not fits(kind):
                    return None
                if not t.allows(case.n_ranks):
                    continue
                cov.cases += 1
                out = ctx.run(t.protocol.obj, case)
                if out.violations:
                    return ctx.protocol_finding(case, out, f"nemesis:{kind.field}")
            cov.case_kinds.append(kind.field)
        return None
