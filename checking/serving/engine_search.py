"""The search of the serving layers: cases until the budget ends; findings minimised, judged by their rate, and
written as `engine` (or `stack`) traces.

`engine_search(source, ...)` runs a `CaseSource`'s enumeration, then its seeded random cases: engine cases on a fresh
deployment each (`deployment_source`: `checking.serving.engine_cases`, `checking.serving.engine_run`) or stack cases on
one stack (`checking.serving.stack_search.stack_source`). A case that violates a property not found yet is a finding: run
again to tell a deterministic one from a race, minimised (`checking.serving.serving_minimise.minimise_case`: fewest
ranks, then steps by delta debugging, then chunks, then prompts and deployments), its rate measured, and returned as the
one `model.finding.Finding` (its case, first failing outcome, rate and trace, written for the source's `TraceSubject`);
the search goes on for the properties not found yet (one finding per property), so one run reports every distinct bug.

Findings are judged by their rate (`model.finding.Rate`): a minimisation candidate of a racy finding gets the runs
its rate needs to show at 99% (at most `checking.minimise.CANDIDATE_RUNS`); a replay (`checking.replay.judge`, the `engine`
session `engine_session`) runs a trace's case on fresh deployments until its property shows (`reproduces`) or
until the clean runs its recorded rate asks for (`fixed`).

`EngineCases` is the engine of `check` for a serving engine under test (`checking.api.target_kind` "deployment"):
its target's `engine` is an `EngineTarget` (the resolved serving engine, its lookup modes, factory options and
rank cap).
"""
from __future__ import annotations

import contextlib
import os
import random
import re
import sys
import time
from typing import Any, Callable, Iterator

import attrs

from checking.api import SearchContext
from checking.minimise import runs_per_candidate
from checking.serving.engine_cases import FIRST_CASES, enumeration, random_case
from checking.serving.engine_run import Bounds, EngineOutcome, run_engine_case
from checking.serving.serving_minimise import minimise_case
from model.engine_case import EngineCase
from model.finding import Finding, Rate
from model.outcome import Violation
from model.timing import HarnessOutcome
from model.trace import Trace, encode, subject_key

__all__ = ["CaseSource", "TraceSubject", "deployment_source", "finding_key", "call_of", "shows", "leading",
           "EngineStats", "ServingTarget", "EngineTarget", "EngineCases", "engine_target", "engine_search",
           "facts_of", "facts_note", "measure_rate", "engine_finding", "engine_session", "serving_minimised"]

Make = Callable[[EngineCase], Any]


@attrs.frozen(kw_only=True)
class TraceSubject:
    """What a serving layer's trace names as its subject: the engine (`--engine`), its factory options, patches and
    runner, a stack's connector (a `stack` trace; None: an `engine` trace), and the expectations to record (default:
    `reproduces` on the subject)."""

    engine: str
    options: dict = attrs.field(factory=dict)
    patches: tuple[str, ...] = ()
    runner: str = "in-process"
    connector: str | None = None
    expect: dict | None = None

    @property
    def kind(self) -> str:
        """The trace kind of its findings: `stack` for a stack's (a connector named), `engine` otherwise."""
        return "engine" if self.connector is None else "stack"


@attrs.define
class EngineStats:
    """What the engine search covered (JSON through `to_json`)."""

    cases: int = 0
    steps: int = 0
    by_origin: dict[str, int] = attrs.field(factory=dict)
    by_shape: dict[str, int] = attrs.field(factory=dict)
    seconds_per_case: float = 0.0
    minimise_runs: int = 0
    found: list[str] = attrs.field(factory=list)
    enumeration_done: bool = False

    def count(self, origin: str, case: EngineCase, seconds: float) -> None:
        self.cases += 1
        self.steps += len(case.steps)
        kind = origin.split("@")[0]
        self.by_origin[kind] = self.by_origin.get(kind, 0) + 1
        shape = f"{case.n_ranks} ranks {getattr(case, 'lookup', 'stack')}"
        self.by_shape[shape] = self.by_shape.get(shape, 0) + 1
        self.seconds_per_case += (seconds - self.seconds_per_case) / self.cases

    def to_json(self) -> dict:
        return {**attrs.asdict(self), "seconds_per_case": round(self.seconds_per_case, 3)}


@attrs.frozen(kw_only=True)
class CaseSource:
    """What the search runs on one serving layer (engine cases on deployments, stack cases on a stack): `run(case,
    salt=None, quick=False) -> EngineOutcome` (`quick`: minimising, so a stuck close is not waited for), `cases()`
    (the enumeration: (origin, case) pairs), `random_case(rng, i)`, and `first_level` (enumerated cases run before
    random ones are mixed in)."""

    run: Callable[..., EngineOutcome]
    cases: Callable[[], Iterator[tuple[str, Any]]]
    random_case: Callable[[random.Random, int], Any]
    first_level: int
    #: What its findings' traces name as their subject.
    subject: TraceSubject
    #: Whether a finding may be cut down to fewer ranks (not on a stack: its ranks are the stack's).
    shrink_ranks: bool = True


def deployment_source(make: Make, *, subject: TraceSubject, lookups: tuple[str, ...], max_ranks: int,
                      bounds: Bounds = Bounds(), call: str | None = None) -> CaseSource:
    """The `CaseSource` of a serving engine's deployments: engine cases on a fresh deployment each (`make(case)`);
    while minimising a finding that is not about `close`, a stuck close is not waited for."""
    def run(case: EngineCase, salt: str | None = None, quick: bool = False) -> EngineOutcome:
        return run_engine_case(make, case, bounds=_quick_bounds(bounds, call) if quick else bounds, salt=salt)

    def random_of(rng: random.Random, i: int) -> EngineCase:
        return random_case(rng, rng.randint(1, max_ranks), lookups[i % len(lookups)])
    return CaseSource(run=run, cases=lambda: enumeration(max_ranks, lookups), random_case=random_of,
                      first_level=FIRST_CASES * max_ranks * len(lookups), subject=subject)


def engine_search(source: CaseSource, *, strategy: str, seed: int, should_stop: Callable[[], bool],
                  stats: EngineStats, minimise: bool = True,
                  minimise_stop: Callable[[], bool] | None = None, measure_runs: int = 4,
                  random_after: Callable[[], bool] | None = None, faults: bool = True,
                  one: bool = False, minimise_seconds: float = 30.0,
                  stop_before: float | None = None, by_origin: bool = False) -> list[Finding]:
    """Run the source's cases until `should_stop()`; one finding per property (just the first with `one`).
    `random_after()` true ends the enumeration early (random cases take the rest); `faults=False` leaves out the cases
    that pause, kill or restart a server (servers shardcheck did not start). Each finding is minimised and measured
    for at most `minimise_seconds` (and never past `minimise_stop()`); with `minimise=False` it is returned as found,
    unmeasured (`check`'s row minimises it: `serving_minimised`). `by_origin`: `pins` and `engine-completeness`
    once per kind of case (recurring, pause, again, ..., random), `engine-returns` once per call, the others once."""
    findings: list[Finding] = []
    enumerated = source.cases()
    rng = random.Random(seed)
    i = 0
    while not should_stop():
        if stop_before is not None and time.monotonic() + 2 * max(1.0, stats.seconds_per_case) > stop_before:
            break  # a case started now would end past the phase
        item = None
        if not (random_after is not None and random_after()) and (stats.cases < source.first_level
                                                                  or stats.cases % 2 == 0):
            item = next(enumerated, None)
            stats.enumeration_done = item is None
        if item is None:
            i += 1
            item = (f"random:{seed}:{i}", source.random_case(rng, i))
        origin, case = item
        if not faults and any(s.kind == "fault" for s in case.steps):
            continue
        # (a stuck close found already: do not wait on it again)
        out = source.run(case, salt=f"{seed}-{stats.cases}-",
                         quick=any(k.startswith("engine-returns@close") for k in stats.found))
        stats.count(origin, case, out.seconds)
        if os.environ.get("SHARDCHECK_ENGINE_TRACE"):
            print(f"[engine] {origin} {case.n_ranks}r {out.seconds}s {out.violated()}", file=sys.stderr, flush=True)
        kind = origin.split("@")[0].split(":")[0].split("-")[0] if by_origin else ""
        new = [v for v in out.violations if finding_key(v, kind) not in stats.found]
        if not new:
            continue
        prop, call = new[0].property, call_of(new[0])
        stats.found.append(finding_key(new[0], kind))
        if minimise:
            outer = minimise_stop or should_stop
            t0 = time.monotonic()
            finding = _finding(source, strategy, case, out, prop, origin, call=call, stats=stats,
                               stop=lambda: outer() or time.monotonic() >= t0 + 0.7 * minimise_seconds,
                               measure_stop=lambda: outer() or time.monotonic() >= t0 + minimise_seconds,
                               measure_runs=measure_runs)
        else:
            finding = engine_finding(source.subject, strategy, case, out, leading(out.violations, prop, call), None,
                                     origin)
        findings.append(finding)
        if one:
            break
    return findings


def serving_minimised(source: CaseSource, finding: Finding, *, stop: Callable[[], bool],
                      measure_stop: Callable[[], bool], stats: EngineStats, measure_runs: int = 4) -> Finding:
    """A serving layer's finding as found (its case, the run that showed it) told a race from a deterministic one and
    minimised until `stop()`, then its rate measured until `measure_stop()` (`MIN_MEASURE_RUNS` at least): what
    `check`'s engine and stack rows do (`checking.layers`)."""
    assert finding.case is not None and isinstance(finding.outcome, EngineOutcome)
    origin = finding.trace.origin.removeprefix("check:engine:")
    return _finding(source, finding.strategy, finding.case, finding.outcome, finding.property, origin,
                    call=call_of(finding.violations[0]), stats=stats, stop=stop, measure_stop=measure_stop,
                    measure_runs=measure_runs)


def _about(source: CaseSource, call: str | None) -> Callable[..., EngineOutcome]:
    """The source's run while minimising a finding about `call`: quick unless it is about `close`."""
    return lambda case, salt=None: source.run(case, salt=salt, quick=call != "close")


def finding_key(v: Any, kind: str) -> str:
    """What makes a finding new: its property, and with `by_origin` the kind of case it came from (for a call that
    did not return, which call it was, whatever the case)."""
    if not kind or v.property in ("engine-integrity", "engine-isolation", "engine-soundness"):
        return v.property  # (one root cause each so far: no need to tell their kinds of case apart)
    if v.property == "engine-returns":
        return f"{v.property}@{call_of(v)}"
    return f"{v.property}@{kind}"


def call_of(v: Any) -> str | None:
    """Which call an `engine-returns` violation is about, without its request and rank (`lookup_cache`, `close`,
    `retrieve`, ...); None for the other properties."""
    if v.property != "engine-returns":
        return None
    call = re.sub(r"\b(q\d+|rank \d+)\b", "", str(v.detail.get("call", ""))).split("(")[0].split(": ")[-1]
    return "-".join(call.split())


def shows(violations: Any, prop: str, call: str | None = None) -> bool:
    """Whether `violations` has one of `prop` (and, given `call`, about that call)."""
    return any(v.property == prop and (call is None or call_of(v) == call) for v in violations)


def leading(violations: Any, prop: str, call: str | None = None) -> list[Violation]:
    """`violations` as `model.outcome.Violation`s, the first of `prop` (about `call`) first: what names a finding."""
    first = next(v for v in violations if shows([v], prop, call))
    return [Violation(v.property, v.summary, v.detail) for v in [first] + [v for v in violations if v is not first]]


def _shows(run: Callable[..., EngineOutcome], case: Any, prop: str, call: str | None, runs: int,
           stop: Callable[[], bool], stats: EngineStats) -> EngineOutcome | None:
    """The first of up to `runs` runs of `case` that violates `prop` (about `call`), or None."""
    for _ in range(runs):
        if stop():
            return None
        stats.minimise_runs += 1
        out = run(case)
        if shows(out.violations, prop, call):
            return out
    return None


def _finding(source: CaseSource, strategy: str, case: Any, out: EngineOutcome, prop: str, origin: str, *,
             stop: Callable[[], bool], measure_stop: Callable[[], bool], measure_runs: int, stats: EngineStats,
             call: str | None = None) -> Finding:
    """Tell a race from a deterministic finding and minimise it until `stop()`, measure its rate until
    `measure_stop()`. An `engine-returns` finding stays about its `call` (a case cut down to one whose close hangs is
    another finding). The harness starved meanwhile: the case as found, the runs made so far, and a note."""
    run = _about(source, call)
    notes: list[str] = []
    again = tried = 0  # (of the runs made again of the case as found: how many showed it, how many were made)
    small = case
    try:
        for _ in range(2):
            if stop():
                break
            tried += 1
            again += _shows(run, case, prop, call, 1, stop, stats) is not None
        runs = runs_per_candidate(source.subject.kind, 1 + again, 1 + tried)
        small = minimise_case(lambda c: _shows(run, c, prop, call, runs, stop, stats) is not None, case, stop,
                              kind=source.subject.kind, ranks=source.shrink_ranks)
        k, n, first = measure_rate(run, small, prop, measure_runs, stop=measure_stop, call=call)
        if first is None and small is not case:  # the minimised case lost its rate: keep the case as found
            small = case
            k, n, first = measure_rate(run, small, prop, measure_runs, stop=measure_stop, call=call)
    except HarnessOutcome as exc:  # (it was judged when found; only its minimising and measuring stopped)
        notes.append(f"minimising and measuring stopped: {exc.reason}")
        small, first = case, None
    if first is None:  # no time left to measure: the runs made so far
        k, n, first = 1 + again, 1 + tried, out
    ranks = f"{case.n_ranks} ranks, " if source.shrink_ranks else ""
    small_ranks = f"{small.n_ranks} ranks, " if source.shrink_ranks else ""
    notes.insert(0, f"minimised from {ranks}{len(case.steps)} steps to {small_ranks}{len(small.steps)} steps")
    return engine_finding(source.subject, strategy, small, first, leading(first.violations, prop, call),
                          Rate.now(k, n), origin, notes=notes)


def _quick_bounds(bounds: Bounds, call: str | None) -> Bounds:
    """While minimising a finding that is not about closing, a stuck close is not waited for."""
    return bounds if call == "close" else attrs.evolve(bounds, close=min(bounds.close, 0.3))


#: Runs a finding's rate is measured by, whatever the budget left.
MIN_MEASURE_RUNS = 3


def measure_rate(run: Callable[..., EngineOutcome], case: Any, prop: str, runs: int, *,
                 stop: Callable[[], bool] = lambda: False, call: str | None = None) -> tuple:
    """(k, n, the first failing outcome or None): how many of `runs` runs of `case` (`run(case)`) violate `prop`
    (about `call`) (fewer runs when `stop()` ends it; at least `MIN_MEASURE_RUNS`: no rate rests on one run)."""
    k, n, first = 0, 0, None
    for i in range(max(runs, MIN_MEASURE_RUNS)):
        if i >= MIN_MEASURE_RUNS and (i >= runs or stop()):
            break
        out = run(case)
        n += 1
        if shows(out.violations, prop, call):
            k += 1
            first = first or out
    return k, n, first


# -- traces ----------------------------------------------------------------------------------------------------------
def engine_finding(subject: TraceSubject, strategy: str, case: Any, outcome: EngineOutcome,
                   violations: list[Violation], rate: Rate | None, origin: str, *, notes: list[str] = ()) -> Finding:
    """The `Finding` of a serving layer's `case` whose run `outcome` showed `violations` (the first names it) in
    `rate` (None: not measured yet): with its `engine` trace, or the `stack` trace of a serving stack's (its
    `connector` named; see `counterexamples/README.md`)."""
    how = f"{case.lookup} lookup" if subject.connector is None else f"connector {subject.connector}"
    summary = f"{violations[0].summary} -- {case.n_ranks} rank(s), {how}, {len(case.steps)} steps"
    if rate is not None:
        summary += "; in " + (f"{rate.k} of {rate.n} runs" if rate.k < rate.n else f"every one of {rate.n} runs")
    stack = {} if subject.connector is None else {"connector": subject.connector}
    trace = Trace.of(subject.kind, violations, summary=summary, client="-",
                     config={"engine": subject.engine, **stack, "case": case.to_json(),
                             "options": dict(subject.options), "patches": list(subject.patches),
                             "runner": subject.runner},
                     events=[{k: encode(v) for k, v in e.items()} for e in outcome.events],
                     expect=dict(subject.expect or {subject_key(subject.engine, subject.patches): "reproduces"}),
                     origin=f"check:engine:{origin}")
    found = Finding(strategy=strategy, violations=violations, trace=trace, case=case, outcome=outcome,
                    notes=list(notes))
    return found if rate is None else found.measured(rate)


class ServingTarget:
    """What the targets of the serving layers share (`EngineTarget`, `checking.serving.stack_search.StackTarget`): the
    name, whether cases may strike faults, and the subject their traces name."""

    engine: Any
    options: dict
    runner: str

    @property
    def name(self) -> str:
        return self.engine.name

    @property
    def faults(self) -> bool:
        """Whether cases may pause, kill and restart servers: only those shardcheck starts (no `urls`)."""
        return "urls" not in self.options

    @property
    def subject(self) -> TraceSubject:
        return TraceSubject(engine=self.name, options=self.options, patches=tuple(self.engine.patches),
                            runner=self.runner, connector=getattr(self, "connector", None))


@attrs.frozen(kw_only=True)
class EngineTarget(ServingTarget):
    """A serving engine under test: `engine` (`runtime.serving.ServingEngine`), the lookup modes to drive, the
    factory options (`--engine-option`), the most ranks a case uses, and the runner (`in-process`)."""

    engine: Any
    lookups: tuple[str, ...] = ("sync", "async")
    options: dict = attrs.field(factory=dict)
    max_ranks: int = 4
    runner: str = "in-process"

    def source(self) -> CaseSource:
        """Its engine cases, each on a fresh deployment."""
        return deployment_source(self.make, subject=self.subject, lookups=self.lookups, max_ranks=self.max_ranks)

    def make(self, case: EngineCase) -> Any:
        """A fresh deployment for `case` (with `runner` and `patches` where the factory takes them)."""
        ours = {"patches": tuple(self.engine.patches)} if self.engine.patches else {}
        if self.runner != "in-process":
            ours["runner"] = self.runner
        return self.engine.deployment(case.n_ranks, lookup=case.lookup, models=case.models, **ours, **self.options)


def engine_target(spec: Any, *, lookup: str = "both", options: dict | None = None, patches: Any = (),
                  max_ranks: int | None = None, runner: str = "in-process", engines: Any = None) -> EngineTarget:
    """The `EngineTarget` a user named: `--engine` (a name of `engines`, the named serving engines handed down, or
    `MOD:ATTR`), `--lookup sync|async|both`, `--engine-option` (`ranks=N`: the most ranks of a case, default 4; the
    rest go to the factory), `--engine-patch` (`ResolveError` when unusable)."""
    from runtime.options import check_engine_options
    from runtime.registry import ResolveError
    from runtime.serving import resolve_serving_engine
    if lookup not in ("sync", "async", "both"):
        raise ResolveError(f"--lookup {lookup!r}: expected sync, async or both")
    opts = dict(options or {})
    ranks = opts.pop("ranks", None)
    if ranks is not None and (not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1):
        raise ResolveError(f"--engine-option ranks={ranks!r}: expected a whole number of ranks, at least 1")
    engine = resolve_serving_engine(spec, patches, engines)
    lookups = ("sync", "async") if lookup == "both" else (lookup,)
    missing = [m for m in lookups if m not in engine.lookups]
    if missing:
        raise ResolveError(f"engine {engine.name!r} offers no {missing[0]} lookup (it offers {', '.join(engine.lookups)})")
    shardchecks = {"runner", "patches"}  # (given by shardcheck itself, never by --engine-option)
    unknown = sorted(set(opts) - (set(engine.options) - shardchecks)) if engine.options is not None else \
        sorted(set(opts) & shardchecks)
    if unknown:
        raise ResolveError(f"engine {engine.name!r} takes no option {unknown[0]!r} (it takes ranks, "
                           f"{', '.join(o for o in engine.options or () if o not in shardchecks)})")
    check_engine_options(opts)
    if runner == "processes" and engine.options is not None and "runner" not in engine.options:
        raise ResolveError(f"engine {engine.name!r} cannot run its ranks in processes (--runner processes)")
    cap = ranks or max_ranks or (len(opts["urls"]) if opts.get("urls") else 4)
    if opts.get("urls") and len(opts["urls"]) < cap:  # (a case of n ranks is given the first n urls, one per rank)
        raise ResolveError(f"--engine-option urls names {len(opts['urls'])} server(s): cases of up to {cap} ranks "
                           "need one per rank (give more urls, or a smaller --max-ranks / ranks=)")
    return EngineTarget(engine=engine, lookups=lookups, options=opts, max_ranks=cap, runner=runner)


@attrs.define
class EngineCasesCoverage:
    """What `EngineCases` ran (`EngineStats` in words and as data)."""

    stats: EngineStats = attrs.field(factory=EngineStats)
    #: What its cases are, in words.
    what: str = "engine cases"

    @property
    def cases(self) -> int:
        return self.stats.cases

    def text(self) -> str:
        s = self.stats
        shapes = ", ".join(f"{v} x {k}" for k, v in sorted(s.by_shape.items()))
        enum = "the enumeration done" if s.enumeration_done else "the enumeration not done"
        return (f"{s.cases:,} {self.what} ({s.steps:,} steps, {s.seconds_per_case:.2f} s each; {shapes}); {enum}; "
                f"{s.minimise_runs} runs minimising")

    def to_json(self) -> dict:
        return self.stats.to_json()


class EngineCases:
    """`check`'s strategy for a serving engine under test: engine cases on fresh deployments (see the module doc);
    the first finding, as found (its row minimises and measures it: `checking.layers`)."""

    name = "engine-cases"

    def search(self, ctx: SearchContext) -> Finding | None:
        target: EngineTarget = ctx.target.engine
        cov = ctx.coverage.of(self.name, EngineCasesCoverage)
        findings = engine_search(target.source(), strategy=self.name, seed=ctx.seed, should_stop=ctx.should_stop,
                                 stats=cov.stats, faults=target.faults, one=True, minimise=False,
                                 stop_before=ctx.phase_end)
        return findings[0] if findings else None


@contextlib.contextmanager
def engine_session(trace: Trace, make: Make, bounds: Bounds = Bounds()) -> Iterator[Callable[[], tuple[list, str]]]:
    """Runs of an engine trace's case, each on a fresh deployment of `make` (`checking.layers.LAYERS`)."""
    case = trace.case()
    call = _recorded_call(trace)

    def once() -> tuple[list, str]:
        out = run_engine_case(make, case, bounds=bounds)
        violations = list(out.violations)
        facts = facts_note(out)
        if call is None:
            return violations, facts
        other = [v for v in violations if v.property == trace.property and call_of(v) != call]
        note = (f"{len(other)} other call(s) did not return either: {', '.join(sorted({call_of(v) for v in other}))}"
                if other else "")
        return [v for v in violations if v not in other], "; ".join(n for n in (note, facts) if n)
    yield once


def facts_of(outcome: EngineOutcome) -> dict[str, int]:
    """What the deployment of a run counted of its own paths (`facts` of the run's last event), or {}."""
    return dict(outcome.events[-1].get("facts") or {}) if outcome.events else {}


def facts_note(outcome: EngineOutcome) -> str:
    """A replay's note of `facts_of(outcome)` ("" when the deployment counted nothing)."""
    facts = facts_of(outcome)
    return f"the engine counted {', '.join(f'{k}: {v}' for k, v in sorted(facts.items()))}" if facts else ""


def _recorded_call(trace: Trace) -> str | None:
    """The call an `engine-returns` trace is about (its first recorded violation's), else None: its replay counts
    only that call (a trace of a lookup that never returns is not reproduced by a close that never returns)."""
    if trace.property != "engine-returns":
        return None
    from model.outcome import Violation
    first = next((v for v in trace.verdict.get("violations", []) if v.get("property") == trace.property), None)
    if first is None or not isinstance(first.get("detail"), dict):
        return None
    return call_of(Violation(first["property"], first.get("summary", ""), first["detail"]))
