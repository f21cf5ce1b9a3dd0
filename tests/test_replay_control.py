"""A racy replay judged against a control run alternately beside it (`model.finding.controlled_outcome`,
`checking.replay.judge`): Fisher's one-sided exact test against known values, the sequential error of the rule on
seeded arms, the verdicts of a controlled replay on seeded sessions (no real client: the runs are Bernoulli draws),
the rule without a control saying so, the machine's load in saved rates, `expect` keyed by engine and patches, and
the exit code of `undecided`."""
from __future__ import annotations

import contextlib
import math
import random

import attrs
import pytest

from checking import layers as layers_mod
from checking.layers import ReplayError, ReplayOn
from checking.replay import Control, judge
from model.finding import (CONFIDENCE, RATE_DRIFT, Rate, control_pairs, control_showings, controlled_outcome,
                           fisher_lower, lower_bound)
from model.outcome import Violation
from model.trace import Trace, TraceError, subject_key
from model.trace_validate import rate_problem
from shardcheck.errors import EXIT_UNDECIDED
from shardcheck.replay_cmd import replay_exit


# -- Fisher's exact test ----------------------------------------------------------------------------------------------
def test_fisher_lower_matches_known_values():
    """The lady tasting tea (3 of 4 against 1 of 4: 17/70 = 0.2429, Fisher 1935) and the textbook 2x2 table of 1 of
    12 against 9 of 12 (one-sided p = 3731/2704156 = 0.00138): exact, and the two tails of one table sum to 1 plus
    the observed table's own probability."""
    assert fisher_lower(1, 4, 3, 4) == pytest.approx(17 / 70, rel=1e-12)
    assert round(fisher_lower(1, 4, 3, 4), 4) == 0.2429
    assert fisher_lower(1, 12, 9, 12) == pytest.approx(3731 / 2704156, rel=1e-12)
    assert round(fisher_lower(1, 12, 9, 12), 5) == 0.00138
    lower, upper = fisher_lower(2, 7, 5, 9), fisher_lower(5, 9, 2, 7)  # (arm 2 lower is arm 1 higher)
    at = math.comb(7, 2) * math.comb(9, 5) / math.comb(16, 7)
    assert lower + upper == pytest.approx(1 + at, rel=1e-12)
    assert fisher_lower(3, 3, 0, 5) == 1.0 and fisher_lower(0, 0, 4, 9) == 1.0


@pytest.mark.parametrize("n", [1, 5, 10, 40])
def test_fisher_lower_of_a_clean_arm_against_one_that_always_showed_it(n):
    """0 of n against n of n: p = 1/C(2n, n); and 0 of n against k of n is never above 2**-k (the bound the
    sequential rule rests on)."""
    assert fisher_lower(0, n, n, n) == pytest.approx(1 / math.comb(2 * n, n), rel=1e-12)
    assert all(fisher_lower(0, n, k, n) <= 2.0 ** -k for k in range(n + 1))


def test_fisher_lower_refuses_counts_that_are_not_counts():
    with pytest.raises(ValueError):
        fisher_lower(3, 2, 0, 1)


# -- the rule -----------------------------------------------------------------------------------------------------------
def test_the_rule_says_reproduces_fixed_undecided_and_when():
    need = control_showings()
    assert need == 7 and 2.0 ** -need <= 1 - CONFIDENCE < 2.0 ** -(need - 1)
    assert controlled_outcome((1, 1), (0, 1), 50) == "reproduces"  # (the control never showed it: still a fact)
    assert controlled_outcome((1, 30), (30, 30), 50) == "reproduces"  # (a rarer race is not a fixed one)
    assert controlled_outcome((0, 7), (7, 7), 50) == "fixed"
    assert controlled_outcome((0, 6), (6, 6), 50) is None  # (Fisher's p = 1/924 alone would say fixed: the floor)
    assert controlled_outcome((0, 49), (6, 49), 50) is None
    assert controlled_outcome((0, 50), (6, 50), 50) == "undecided"
    assert controlled_outcome((0, 50), (7, 50), 50) == "fixed"


def _replays(rates, seed: int, most: int) -> str:
    """One controlled replay of seeded Bernoulli arms: `rates(pair)` gives (candidate's, control's) rate."""
    rng = random.Random(seed)
    kc = nc = kk = nk = 0
    for i in range(most):
        pc, pk = rates(i)
        kc, nc = kc + (rng.random() < pc), nc + 1
        kk, nk = kk + (rng.random() < pk), nk + 1
        outcome = controlled_outcome((kc, nc), (kk, nk), most)
        if outcome:
            return outcome
    raise AssertionError("undecided at the bound")


@pytest.mark.parametrize("rates", [lambda i: (0.05, 0.05), lambda i: (0.3, 0.3),
                                   lambda i: ((0.4, 0.4) if (i // 10) % 2 else (0.02, 0.02)),
                                   lambda i: (0.1, 0.15)],
                         ids=["5%", "30%", "load-swinging", "slightly-better"])
def test_a_candidate_no_better_than_its_control_is_fixed_in_at_most_1_percent_of_replays(rates):
    """Looking after every pair, a candidate whose rate is not below the control's (even as the machine's load
    swings both rates together, pair by pair, or with a candidate only a little better) is called `fixed` in at
    most 1% of 3,000 seeded replays: the sequential error the rule's docstring bounds by 2**-7."""
    outcomes = [_replays(rates, seed, 400) for seed in range(3000)]
    false_fixed = outcomes.count("fixed") / len(outcomes)
    limit = 0.01 if rates(0)[0] >= rates(0)[1] else 0.05
    assert false_fixed <= limit, false_fixed


def test_a_fixed_candidate_is_found_fixed_and_a_silent_control_leaves_it_undecided():
    """A candidate that never shows it beside a control at 30%: `fixed` in every one of 200 seeded replays, within
    the bound the recorded rate sets; beside a control that never shows it either: `undecided`, never `fixed`."""
    most = control_pairs(Rate(9, 30))
    assert [_replays(lambda i: (0.0, 0.3), s, most) for s in range(200)] == ["fixed"] * 200
    assert {_replays(lambda i: (0.0, 0.0), s, most) for s in range(20)} == {"undecided"}


def test_the_bound_follows_the_recorded_rate_and_is_capped():
    """A rarer recorded race allows more pairs (a control at a `RATE_DRIFT`th of its rate's lower bound still shows
    it 7 times within them at 99%), up to the cap."""
    bounds = [control_pairs(Rate(k, 30)) for k in (29, 20, 13, 7, 3)]
    assert bounds == sorted(bounds) and bounds[0] >= control_showings() and bounds[-1] == 500
    p = lower_bound(13, 30, CONFIDENCE) / RATE_DRIFT
    most = control_pairs(Rate(13, 30))
    shows = lambda m: sum(math.comb(m, i) * p ** i * (1 - p) ** (m - i) for i in range(7, m + 1))  # noqa: E731
    assert shows(most) >= CONFIDENCE > shows(most - 1)


# -- judged on seeded sessions ------------------------------------------------------------------------------------------
def _racy_trace(k: int = 9, n: int = 30) -> Trace:
    return Trace(kind="concurrent", property="linearizability", summary="seeded", protocol={"name": "-", "ref": None},
                 client="recorded", config={"rate": {"k": k, "n": n}})


@pytest.fixture
def seeded_sessions(monkeypatch):
    """Sessions whose runs show the property with the probability `on.options["rate"]` (seeded per arm); `runs`
    logs which arm ran, in order. An arm with `options["broken"]` fails to open."""
    runs: list[str] = []

    @contextlib.contextmanager
    def session(trace, on):
        if on.options.get("broken"):
            raise ReplayError("the recorded subject's factory is gone")
        rng = random.Random(on.options["seed"])

        def once():
            runs.append(on.options["name"])
            shown = rng.random() < on.options["rate"]
            return ([Violation(trace.property, "seeded violation", {})] if shown else []), ""
        yield once
    concurrent = attrs.evolve(layers_mod.LAYERS["concurrent"], session=session)
    monkeypatch.setitem(layers_mod.LAYERS, "concurrent", concurrent)
    return runs


def _on(name: str, rate: float, seed: int = 0, **more) -> ReplayOn:
    return ReplayOn(client=object(), options={"name": name, "rate": rate, "seed": seed, **more})


def test_a_controlled_replay_alternates_the_arms_and_says_fixed_with_both_counts(seeded_sessions):
    verdict = judge(_racy_trace(), _on("candidate", 0.0), control=Control("recorded", on=_on("control", 1.0)))
    assert verdict.outcome == "fixed" and verdict.candidate == (0, 7) and verdict.control == (7, 7)
    assert verdict.runs == 14 and seeded_sessions[:4] == ["candidate", "control", "control", "candidate"]
    assert "candidate 0 of 7 runs, the control recorded 7 of 7" in verdict.why and "Fisher" in verdict.why
    assert "load" in verdict.why


def test_a_candidate_that_shows_it_reproduces_though_its_control_never_did(seeded_sessions):
    verdict = judge(_racy_trace(), _on("candidate", 1.0), control=Control("recorded", on=_on("control", 0.0)))
    assert verdict.outcome == "reproduces" and verdict.candidate == (1, 1) and verdict.control == (0, 0)
    assert "the control recorded showed it in 0 of 0 runs" in verdict.why


def test_a_control_that_never_shows_it_leaves_the_replay_undecided_within_its_bound(seeded_sessions):
    trace = _racy_trace(20, 30)
    most = control_pairs(Rate(20, 30))
    verdict = judge(trace, _on("candidate", 0.0), control=Control("recorded", on=_on("control", 0.0)))
    assert verdict.outcome == "undecided" and verdict.candidate == (0, most) and verdict.control == (0, most)
    assert f"{most} pairs" in verdict.why and len(seeded_sessions) == 2 * most


def test_without_a_control_the_rule_of_the_recorded_rate_stays_and_says_so(seeded_sessions):
    """No control (the candidate is the recorded subject; or its control cannot run): `Rate.runs_to_clear` clean
    runs, and the why names the missing control and the guess `RATE_DRIFT` is."""
    trace = _racy_trace()
    same = judge(trace, _on("candidate", 0.0), control=Control("recorded", why="the candidate is the recorded subject"))
    assert same.outcome == "fixed" and same.runs == Rate(9, 30).runs_to_clear() and same.control is None
    assert "no control (the candidate is the recorded subject)" in same.why and "RATE_DRIFT" in same.why
    gone = judge(trace, _on("candidate", 0.0), control=Control("recorded", on=_on("control", 1.0, broken=True)))
    assert gone.outcome == "fixed" and gone.control is None
    assert "no control (the recorded subject recorded stopped running: the recorded subject's factory" in gone.why
    assert set(seeded_sessions) == {"candidate"}


def test_a_trace_that_showed_every_time_is_judged_ten_of_ten_even_with_a_control(seeded_sessions):
    verdict = judge(_racy_trace(20, 20), _on("candidate", 0.0), control=Control("recorded", on=_on("control", 1.0)))
    assert verdict.outcome == "fixed" and verdict.runs == 10 and set(seeded_sessions) == {"candidate"}


# -- the machine's load in a saved rate -------------------------------------------------------------------------------
def test_a_rate_carries_the_load_it_was_measured_at_and_old_rates_still_read():
    now = Rate.now(3, 30)
    data = now.to_json()
    assert set(data) <= {"k", "n", "load1", "cores"} and data["cores"] >= 1 and data["load1"] >= 0
    assert Rate.from_json(data) == Rate(3, 30, False, data["load1"], data["cores"])
    assert f"at load {data['load1']:.1f} on {data['cores']} cores" in now.text()
    assert Rate.from_json({"k": 3, "n": 30}) == Rate(3, 30) and Rate(3, 30).text() == "3 of 30 runs"


@pytest.mark.parametrize("bad, field", [({"load1": -1}, ".load1"), ({"load1": "high"}, ".load1"),
                                        ({"cores": 0}, ".cores"), ({"cores": 2.5}, ".cores"),
                                        ({"load": 1.0}, ".load")])
def test_a_rate_with_a_load_that_is_not_one_is_refused(bad, field, tmp_path):
    assert rate_problem({"k": 1, "n": 2, **bad})[0] == field
    data = {"schema": "shardcheck-trace", "version": 1, "kind": "engine", "property": "pins", "summary": "",
            "protocol": {"name": "-", "ref": None}, "client": "-", "verdict": {"violations": []}, "expect": {},
            "config": {"engine": "lmcache", "rate": {"k": 1, "n": 2, **bad}, "case": {
                "n_ranks": 1, "lookup": "sync", "models": ["m"], "prompts": [{"name": "p0", "chunks": 1}],
                "steps": [{"kind": "store", "prompt": "p0"}]}}}
    with pytest.raises(TraceError, match=r"config\.rate" + field.replace(".", r"\.")):
        Trace.from_json(data)


# -- expect keyed by engine and patches; the exit code of undecided ----------------------------------------------------
def test_expect_is_keyed_by_engine_and_patches_and_old_keys_keep_working():
    t = Trace(kind="engine", property="pins", summary="", protocol={}, client="-",
              config={"engine": "lmcache-patched", "patches": ["m:p"]},
              expect={"lmcache-patched": "reproduces", "lmcache": "reproduces",
                      "lmcache-patched+m:q": "reproduces"})
    assert subject_key("lmcache-patched", ("m:p", "m:q")) == "lmcache-patched+m:p+m:q"
    assert t.expected("lmcache-patched", ("m:p",)) == "reproduces"  # (the recorded subject's old plain key)
    assert t.expected("lmcache-patched", ("m:q",)) == "reproduces"
    assert t.expected("lmcache", ("m:p",)) is None  # (a plain key names no patches for another engine)
    t.expect["lmcache-patched"] = "fixed"  # (now meaning: without the patch)
    t.expect["lmcache-patched+m:p"] = "reproduces"
    assert t.expected("lmcache-patched") == "fixed" and t.expected("lmcache-patched", ["m:p"]) == "reproduces"


@pytest.mark.parametrize("outcomes, expect, code", [
    (["fixed", "undecided"], False, EXIT_UNDECIDED), (["reproduces", "undecided"], False, 1),
    (["error", "undecided"], False, 2), (["fixed", "fixed"], False, 0),
    (["fixed", "undecided"], True, EXIT_UNDECIDED), (["reproduces", "undecided"], True, 1),
])
def test_undecided_is_exit_4_unless_a_row_reproduces_or_is_an_error(outcomes, expect, code):
    rows = [{"outcome": o, "matches": o == "fixed"} for o in outcomes]
    assert EXIT_UNDECIDED == 4 and replay_exit(rows, expect) == code
