"""The engine layer as a Hypothesis state machine: `EngineMachine` drives a serving engine under test (`--engine`)
one engine step at a time, in vLLM's order, on a fresh deployment per example; `EngineMachineSearch` runs it in
seeded batches as an engine of `check`.

Each example deploys `n_ranks` ranks with one lookup mode and a few prompts (recurring prefixes; another tenant, adapter
or image on the same tokens), then applies rules: store a prompt, evict a chunk, pause / resume / kill / restart a
rank's server, look up a prompt (a new request, or an open one again; left in flight; not scheduled), poll, retrieve,
end a request. Every step goes through `checking.serving.engine_run.EngineRun` (every call bounded, judged by
`model.engine_oracle`); the teardown ends every request, checks the pins and closes the deployment. A violation raises
the property's exception; the run Hypothesis reports writes an `engine` trace (the steps so far as a case, cut down on
fresh deployments for up to `--minimise-seconds`, its rate measured).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import attrs
import hypothesis
from hypothesis import HealthCheck, Phase, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

from checking.api import SearchContext
from checking.serving.engine_run import Bounds, EngineRun, build_deployment
from checking.serving.engine_search import call_of, engine_finding, leading
from model.engine_case import EngineCase, EnginePrompt, Step
from model.faults import HELD_ACTIONS
from model.finding import Finding
from model.trace import Trace
from properties import config
from properties.reporting import RULE_STEPS, event, final_run, note, raise_violations, violated_properties, write_found

__all__ = ["EngineMachine", "EngineMachineSearch", "EngineMachineCoverage", "ENGINE_BATCH"]

#: One batch of `check`: few examples, so the budget is polled often; no shrinking (each step of a real engine costs
#: real time): the failing case is minimised on fresh deployments instead.
ENGINE_BATCH = settings(max_examples=4, stateful_step_count=14, deadline=None, database=None,
                        phases=(Phase.generate,), report_multiple_bugs=False, suppress_health_check=list(HealthCheck))


@st.composite
def _prompts(draw: Any) -> tuple[EnginePrompt, ...]:
    first = EnginePrompt(name="p0", chunks=draw(st.integers(1, 3)))
    out = [first]
    for i in (1, 2):
        extra = draw(st.sampled_from(["", "", "tenant", "adapter", "image"]))
        if extra:
            out.append(EnginePrompt(name=f"p{i}", chunks=first.chunks, stem="p0", shared=first.chunks,
                                    **{extra: f"x{i}"}))
        else:
            chunks = draw(st.integers(1, 3))
            out.append(EnginePrompt(name=f"p{i}", chunks=chunks, stem="p0", shared=draw(st.integers(0, min(chunks,
                                                                                                         first.chunks)))))
    return tuple(attrs.evolve(p, stem="") if not p.shared else p for p in out)


#: When `check` runs the machine: its phase's stop. Once it has answered True, every later rule is a no-op (the
#: draws stay the same, so Hypothesis sees neither a failure nor a different run) and the batch ends quickly.
_STOP: list[Callable[[], bool]] = [lambda: False]
_STOPPED = [False]


def _stopped() -> bool:
    if not _STOPPED[0] and _STOP[0]():
        _STOPPED[0] = True
    return _STOPPED[0]


class EngineMachine(RuleBasedStateMachine):
    """Engine steps on one fresh deployment of the configured serving engine (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.cfg = config.current()
        self.target = self.cfg.engine
        if self.target is None:
            raise RuntimeError("the engine layer needs a serving engine: pytest properties/ --engine NAME")
        self.run: EngineRun | None = None
        self.case: EngineCase | None = None
        self.steps: list[Step] = []
        self.open: list[str] = []
        self.prompt_of: dict[str, str] = {}
        self.made = 0
        self.paused: set[int] = set()

    @initialize(n_ranks=st.integers(1, 3), lookup_index=st.integers(0, 1), prompts=_prompts())
    def deploy(self, n_ranks: int, lookup_index: int, prompts: tuple) -> None:
        """A fresh deployment: `n_ranks` ranks (within `--max-ranks`), one of the lookup modes asked for."""
        lookups = self.target.lookups
        self.case = EngineCase(n_ranks=min(n_ranks, self.target.max_ranks), lookup=lookups[lookup_index % len(lookups)],
                               prompts=prompts)
        if _stopped():
            return
        RULE_STEPS["engine"] += 1
        dep = build_deployment(self.target.make, self.case)  # (the harness's work: `--setup-timeout`)
        self.run = EngineRun(dep, self.case, Bounds(), salt=f"m{id(self)}-")

    def _apply(self, step: Step) -> None:
        if self.run is None or _stopped():
            return
        RULE_STEPS["engine"] += 1
        self.steps.append(step)
        assert self.run is not None
        found = self.run.apply(step)
        if found:
            self._fail(found)

    def _fail(self, violations: list) -> None:
        if final_run() and self.cfg.write_traces:
            note(f"counterexample trace: {self._write(violations)}")
        raise_violations(violations, "engine")

    def _write(self, violations: list) -> Path | str:
        """The trace of the steps so far, cut down on fresh deployments first (within `--minimise-seconds`, half of
        what is left at most) and measured: the engine row's minimiser (`checking.layers`)."""
        from checking.serving.engine_run import EngineOutcome
        from checking.serving.engine_search import EngineStats, serving_minimised
        assert self.case is not None and self.run is not None
        case = attrs.evolve(self.case, steps=tuple(self.steps))
        prop, call = violations[0].property, call_of(violations[0])
        found = engine_finding(self.target.subject, "engine-machine", case,
                               EngineOutcome(case, list(violations), list(self.run.events), 0.0),
                               leading(violations, prop, call), None, "pytest properties/ (EngineMachine)")
        now = time.monotonic()
        stop_at = min(now + self.cfg.minimise_seconds, (now + self.cfg.finish_by) / 2)  # (half what is left at most)
        measured_by = min(stop_at + self.cfg.minimise_seconds, self.cfg.finish_by)  # (3 runs at least)
        finding = serving_minimised(self.target.source(), found, stats=EngineStats(), measure_runs=3,
                                    stop=lambda: time.monotonic() >= stop_at,
                                    measure_stop=lambda: time.monotonic() >= measured_by)
        return write_found(finding.trace, self.cfg, self.target.name, prop)

    # -- rules --------------------------------------------------------------------------------------------------
    def _prompt(self, i: int) -> EnginePrompt:
        assert self.case is not None
        return self.case.prompts[i % len(self.case.prompts)]

    @rule(i=st.integers(0, 2))
    def store(self, i: int) -> None:
        """Every rank stores a prompt's KV."""
        self._apply(Step(kind="store", prompt=self._prompt(i).name))

    @rule(i=st.integers(0, 2), rank=st.integers(0, 3), chunk=st.integers(0, 2), tier=st.sampled_from(["local",
                                                                                                      "remote", "both"]))
    def evict(self, i: int, rank: int, chunk: int, tier: str) -> None:
        """A chunk out of a rank's tier (LocalCPU's LRU takes the later chunks too)."""
        p = self._prompt(i)
        assert self.case is not None
        self._apply(Step(kind="evict", prompt=p.name, rank=rank % self.case.n_ranks, chunk=chunk % p.chunks,
                         tier=tier))

    @precondition(lambda self: self.target is not None and self.target.faults)
    @rule(rank=st.integers(0, 3), action=st.sampled_from(HELD_ACTIONS))
    def fault(self, rank: int, action: str) -> None:
        """A rank's server paused, resumed, killed (and restarted) or restarted (empty)."""
        assert self.case is not None
        rank %= self.case.n_ranks
        if action == "resume" and rank not in self.paused:
            action = "pause"
        self.paused.symmetric_difference_update({rank} if action in ("pause", "resume") else set())
        event(f"fault {action}")
        self._apply(Step(kind="fault", rank=rank, action=action))
        if action == "kill":
            self._apply(Step(kind="fault", rank=rank, action="restart"))

    @rule(i=st.integers(0, 2), again=st.booleans(), wait=st.booleans(), scheduled=st.booleans())
    def lookup(self, i: int, again: bool, wait: bool, scheduled: bool) -> None:
        """The scheduler looks a prompt up (a new request, or an open one again)."""
        assert self.case is not None
        if again and self.open:
            rid = self.open[-1]
            prompt = self.prompt_of[rid]
        else:
            self.made += 1
            rid, prompt = f"q{self.made}", self._prompt(i).name
            self.open.append(rid)
            self.prompt_of[rid] = prompt
        event("lookup again" if again and self.open else "lookup")
        self._apply(Step(kind="lookup", request=rid, prompt=prompt, wait=wait or self.case.lookup == "sync",
                         scheduled=scheduled or again))

    @precondition(lambda self: bool(self.open))
    @rule(j=st.integers(0, 5))
    def poll(self, j: int) -> None:
        """vLLM asks again about an open request."""
        self._apply(Step(kind="poll", request=self.open[j % len(self.open)]))

    @precondition(lambda self: bool(self.open))
    @rule(j=st.integers(0, 5))
    def retrieve(self, j: int) -> None:
        """Every rank loads an open request's planned prefix."""
        self._apply(Step(kind="retrieve", request=self.open[j % len(self.open)]))

    @precondition(lambda self: bool(self.open))
    @rule(j=st.integers(0, 5))
    def end(self, j: int) -> None:
        """A request ends (every rank's `lookup_unpin`)."""
        self._apply(Step(kind="end", request=self.open.pop(j % len(self.open))))

    def teardown(self) -> None:
        """Every open request ends, the pins are checked, the deployment closes (bounded)."""
        if self.run is None or self.run.finished:
            return
        if _stopped():
            self.run.finish()  # closed; what it found after the phase ended is not this batch's finding
            return
        found = self.run.finish()
        if found and not self.run.violations[:-len(found)]:
            self._fail(found)


@attrs.define
class EngineMachineCoverage:
    """What the engine machine ran in `check`."""

    batches: int = 0
    steps: int = 0

    def text(self) -> str:
        return f"{self.batches} batches of the engine state machine, {self.steps:,} rule steps"

    def to_json(self) -> dict:
        return attrs.asdict(self)


class EngineMachineSearch:
    """`check`'s engine-layer Hypothesis engine: `EngineMachine` in seeded batches until the phase ends; a failure's
    trace (minimised and measured on fresh deployments) is the finding."""

    name = "engine-machine"

    def search(self, ctx: SearchContext) -> Finding | None:
        target = ctx.target.engine
        cov = ctx.coverage.of(self.name, EngineMachineCoverage)
        _STOP[0], _STOPPED[0] = ctx.should_stop, False
        try:
            return self._batches(ctx, target, cov)
        finally:
            _STOP[0], _STOPPED[0] = (lambda: False), False

    def _batches(self, ctx: SearchContext, target: Any, cov: EngineMachineCoverage) -> Finding | None:
        found: list[Trace] = []
        # a failure is minimised and measured by `ctx.finish_by` (half of what is left then minimising)
        with config.using(engine=target, found=found, minimise_seconds=30.0, finish_by=ctx.finish_by):
            batch = 0
            while not _stopped():
                steps0 = RULE_STEPS["engine"]
                seeded = hypothesis.seed(f"shardcheck-engine-{ctx.seed}-{batch}")(
                    type("EngineMachine", (EngineMachine,), {"__module__": EngineMachine.__module__}))
                batch += 1
                try:
                    run_state_machine_as_test(seeded, settings=ENGINE_BATCH)
                    failed = False
                except (AssertionError, ExceptionGroup) as exc:
                    failed = bool(violated_properties(exc))
                    if not failed:
                        raise
                cov.batches, cov.steps = batch, cov.steps + RULE_STEPS["engine"] - steps0
                if failed and found:
                    return _finding(found[0], target, self.name)
        return None


def _finding(trace: Trace, target: Any, engine: str) -> Finding:
    from model.trace import violations_of
    from model.finding import Rate
    return Finding(strategy=engine, violations=violations_of(trace), trace=trace,
                   rate=Rate.from_json(trace.config["rate"]),
                   notes=["found by the engine state machine; minimised on fresh deployments"])

