"""Replaying a trace of any kind: how often a trace shows (`measure`), and the verdict of a replay by the rate the
trace records (`judge`). Runs of one replay share a session of fresh stores (its layer's: `checking.layers`): a
protocol case and a concurrent layout run under fresh keys each time; a store-ops trace, whose keys are its own, on
fresh stores each time.

A replay answers `reproduces` as soon as a run shows the trace's property, and `fixed` only after as many clean
runs as its recorded rate asks at 99% (`model.finding.Rate.runs_to_clear`): one run when the run is deterministic
(the simulator over in-memory stores), `DETERMINISTIC_RUNS` when the trace showed every time it was measured, more
for a racy one. A trace that cannot run on what it is replayed on raises `checking.layers.ReplayError` (an
`error` row).

A racy trace replayed on another subject than the one it records (a `Control` that can run: its recorded client,
protocol, engine and patches) is judged against it: the candidate and the control run alternately on fresh stores
or deployments, and `model.finding.controlled_outcome` decides (`reproduces`, `fixed`, or `undecided` after the
pairs `model.finding.control_pairs` allows), so the machine's load lowers both arms alike. Without a control (the
candidate is the recorded subject, or that subject cannot run) the rule above stays, and the verdict says so; on
the recorded subject with its source unchanged (`Control.unchanged`: `runtime.source`) clean runs are `undecided`.

An engine trace on an engine with `--engine-patch`es (or in a process where a patch was applied already) runs in a
fresh process of its own (`checking.replay_arm`): a patch applies to its own trace's runs only.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import attrs

from checking.layers import ReplayOn, layer_of
from model.finding import CONFIDENCE, RATE_DRIFT, Rate, control_pairs, control_showings, controlled_outcome, \
    fisher_lower, load_text, machine_load
from model.outcome import Violation
from model.trace import Trace

__all__ = ["DETERMINISTIC_RUNS", "ENGINE_MAX_RUNS", "Verdict", "measure", "judge", "recorded_rate", "clean_runs",
           "Control", "Progress"]

#: Clean runs after which a trace that showed every time it was measured is `fixed` on a target that is not
#: deterministic (CONTRACT.md: "a deterministic one 10/10").
DETERMINISTIC_RUNS = 10
#: The most clean runs a saved engine trace of the corpus may ask for (each runs a real deployment, about a second):
#: a replay never stops short of what the rate asks (a `fixed` said sooner would not have its 99%), so a racy
#: finding is measured until its rate asks no more than this (`shardcheck regen engine`).
ENGINE_MAX_RUNS = 60


@attrs.frozen
class Control:
    """The recorded subject of a trace, to run beside the candidate in the same replay (`subject`: its name, e.g.
    `lmcache` or `lmcache-patched+mod:fn`; `on`: what it runs on); `on` None when there is no control, and `why`."""

    subject: str
    on: ReplayOn | None = None
    why: str = ""
    #: The candidate is the recorded subject, its source the one the trace records (`runtime.source`).
    unchanged: bool = False


@attrs.frozen
class Verdict:
    """A replay's answer: `reproduces`, `fixed` or `undecided` (a controlled replay that its bound ended), why, and
    the runs it took (both arms'); a controlled replay's (k, n) of the candidate and of the control."""

    outcome: str
    why: str
    runs: int
    candidate: tuple[int, int] | None = None
    control: tuple[int, int] | None = None


#: `progress(done, need, what="clean runs")`: a long replay's progress (see `judge`).
Progress = Callable[..., None]


def recorded_rate(trace: Trace) -> Rate | None:
    """The rate a trace records (`config.rate`), or None."""
    raw = trace.config.get("rate")
    return None if raw is None else Rate.from_json(raw)


def measure(trace: Trace, on: ReplayOn, *, runs: int, should_stop: Callable[[], bool] = lambda: False,
            want: str | None = None) -> tuple[int, int, list[Violation]]:
    """How often `trace` shows `want` (default: its property) in up to `runs` runs on fresh stores (one when the run
    is deterministic; fewer when `should_stop()` after a run): (runs that showed it, runs made, the violations of the
    first run that did)."""
    want = want or trace.property
    if on.deterministic(trace):
        runs = 1
    shown, made, first = 0, 0, []
    with layer_of(trace).session(trace, on) as once:
        for _ in range(runs):
            if made and should_stop():
                break
            violations, _ = once()
            made += 1
            if want in {v.property for v in violations}:
                shown += 1
                first = first or violations
    return shown, made, first


def clean_runs(trace: Trace, on: ReplayOn, control: Control | None = None) -> tuple[int, str]:
    """How many clean runs make a replay of `trace` on `on` say `fixed` without a control, and why that many (a racy
    trace's why says there is no control, and why: `control`)."""
    if on.deterministic(trace):
        return 1, "a deterministic run"
    rate = recorded_rate(trace)
    if rate is None or rate.k == rate.n:
        shown = "no rate recorded" if rate is None else f"recorded {rate.text()}"
        return DETERMINISTIC_RUNS, f"{shown}: {DETERMINISTIC_RUNS} runs, as for a deterministic trace"
    none = control.why if control is not None and control.why else "none given"
    need = rate.runs_to_clear()
    return need, (f"recorded {rate.k}/{rate.n}{rate.at_load()}: a bug still at a quarter of that rate shows within "
                  f"{need} runs at 99%; no control ({none}), so the quarter (RATE_DRIFT = {RATE_DRIFT}) is a guess at "
                  f"how far the machine's load lowers a race's rate")


def judge(trace: Trace, on: ReplayOn, progress: Progress = lambda done, need, what="": None,
          control: Control | None = None) -> Verdict:
    """`reproduces` as soon as a run shows the trace's property, else `fixed` after `clean_runs` clean runs;
    `progress(clean runs so far, runs needed)` before each run after the first. A racy trace with a `control` that
    can run is judged against it instead (`model.finding.controlled_outcome`; `progress(pairs so far, the most
    pairs, what)`); a control that stops running is dropped, and the rule without one decides, saying why."""
    rate = recorded_rate(trace)
    if rate is not None and rate.racy and not on.deterministic(trace) and control is not None \
            and control.on is not None:
        try:
            return _judge_controlled(trace, on, control, rate, progress)
        except _ControlFailed as exc:
            control = Control(control.subject, why=f"the recorded subject {control.subject} stopped running: {exc}")
    need, why = clean_runs(trace, on, control)
    with layer_of(trace).session(trace, on) as once:
        for i in range(need):
            if i:
                progress(i, need)
            violations, note = once()
            hit = next((v for v in violations if v.property == trace.property), None)
            if hit is not None:
                where = f"run {i + 1} of up to {need}" if need > 1 else "one deterministic run"
                return Verdict("reproduces", f"{hit.summary} ({where}{'; ' + note if note else ''})", i + 1)
    if control is not None and control.unchanged:  # the same code: what changed is the machine
        return Verdict("undecided", f"{_others(violations)} in {need} clean run(s) of the recorded subject, its source "
                                    f"unchanged: the machine does not show the race now, nothing was fixed ({why}"
                                    f"{load_text(*machine_load(), '; now at ')}{'; ' + note if note else ''})", need)
    return Verdict("fixed", f"{_others(violations)} in {need} clean run(s) ({why}{'; ' + note if note else ''})", need)


def _others(violations: list[Violation]) -> str:
    return f"other violations only: {', '.join(sorted({v.property for v in violations}))}" if violations \
        else "no violation"


class _ControlFailed(Exception):
    """The control of a controlled replay could not run (its session or one of its runs failed)."""


def _judge_controlled(trace: Trace, on: ReplayOn, control: Control, rate: Rate, progress: Progress) -> Verdict:
    """The candidate (`on`) and the control alternately, one run each per pair (the first arm of a pair alternating
    too), on fresh stores or deployments, until `controlled_outcome` decides or `control_pairs(rate)` pairs were
    made (`undecided`). `_ControlFailed` when the control cannot run."""
    most = control_pairs(rate)
    kc = nc = kk = nk = 0
    note = ""
    violations: list[Violation] = []
    with contextlib.ExitStack() as stack:
        candidate = stack.enter_context(layer_of(trace).session(trace, on))
        try:
            ctrl = stack.enter_context(layer_of(trace).session(trace, control.on))  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001 - whatever stops the control: judged without it
            raise _ControlFailed(str(exc)) from None
        for i in range(most):
            if i:
                progress(i, most, f"pairs (candidate {kc}/{nc}, control {kk}/{nk})")
            for arm in ("candidate", "control") if i % 2 == 0 else ("control", "candidate"):
                if arm == "control":
                    try:
                        shown, _ = ctrl()
                    except Exception as exc:  # noqa: BLE001 - a control that fails is dropped, not the candidate's
                        raise _ControlFailed(str(exc)) from None
                    nk += 1
                    kk += any(v.property == trace.property for v in shown)
                    continue
                violations, note = candidate()
                nc += 1
                hit = next((v for v in violations if v.property == trace.property), None)
                if hit is not None:
                    kc += 1
                    return Verdict("reproduces", f"{hit.summary} (candidate run {nc}; the control {control.subject} "
                                   f"showed it in {kk} of {nk} runs beside it{'; ' + note if note else ''})",
                                   nc + nk, (kc, nc), (kk, nk))
            outcome = controlled_outcome((kc, nc), (kk, nk), most)
            counts = (f"candidate 0 of {nc} runs, the control {control.subject} {kk} of {nk}, run alternately; "
                      f"recorded {rate.text()}, now{load_text(*machine_load(), ' at ') or ' at an unknown load'}")
            if outcome == "fixed":
                p = fisher_lower(kc, nc, kk, nk)
                return Verdict("fixed", f"{_others(violations)}: {counts}; lower at 99% (Fisher's one-sided exact p = "
                               f"{p:.2g}, the control shown at least {control_showings()} times)"
                               f"{'; ' + note if note else ''}", nc + nk, (kc, nc), (kk, nk))
            if outcome == "undecided":
                return Verdict("undecided", f"{counts}: {most} pairs, the bound for that rate, did not decide "
                               f"(`fixed` needs the control to show it {control_showings()} times beside a clean "
                               f"candidate at {CONFIDENCE:.0%})", nc + nk, (kc, nc), (kk, nk))
    raise AssertionError("unreachable: controlled_outcome is undecided at the bound")
