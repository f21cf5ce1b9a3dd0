"""The exhaustive explorer: the manifest (verdicts and exact state counts), every demo variant found with a
replayable shortest counterexample, and the reductions' soundness checked against the full search."""
from __future__ import annotations

import random

import attrs
import pytest

from model.effects import TIMED_OUT, GetAsync, Wait
from checking.explore import (DELAY_SECONDS, ExploreError, bench, explore, outcome_summary, terminal_outcomes,
                           terminal_signatures)
from model.checks import check_outcome
from model.faults import Eviction, FaultPlan
from checking.manifest import (REFERENCE, REGENERATE, VARIANT_CONFIGS, VARIANT_OTHERS, entry_name, load, observed,
                              resolve, run_entry)
from model.harness import Case, run_case
from model.outcome import OtherPrompt
from model.protocols import PaperProtocol, PaperProtocolAsync, Rank0SingleWriter, owned_chunks
from model.trace import Trace
from model.variants import DEMO_VARIANTS

ENTRIES = load()["entries"]
REFERENCE_CLASSES = (PaperProtocol, PaperProtocolAsync, Rank0SingleWriter)
EVERY_CLASS = (*REFERENCE_CLASSES, *DEMO_VARIANTS)
SMALL = ((2, 3, 1), (3, 2, 1), (2, 2, 2), (3, 3, 1))


def _ref(cls) -> str:
    return f"{cls.__module__}:{cls.__name__}"


def _config(cls) -> tuple[int, int]:
    return VARIANT_CONFIGS.get(cls.__name__, (2, 3))


def _others(cls) -> list[OtherPrompt]:
    """The other prompts in the tier the variant's manifest configuration has (isolation demos)."""
    return [OtherPrompt(**{**o, "evicted": tuple(o.get("evicted", ()))}) for o in VARIANT_OTHERS.get(cls.__name__, ())]


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["name"] for e in ENTRIES])
def test_manifest_entry(entry):
    """Each manifest entry still gives its recorded verdict, state count (and property, depth)."""
    got = observed(run_entry(entry))
    assert got == entry["expect"], (
        f"manifest entry {entry['name']} drifted: expected {entry['expect']}, got {got}. If the change is "
        f"intended, regenerate the manifest with `{REGENERATE}` and commit checking/manifest.json.")


def test_manifest_covers_the_reference_protocols_and_every_variant():
    """The manifest names every reference protocol (both modes, held) and every demo variant (violated)."""
    names = [e["name"] for e in ENTRIES]
    assert len(names) == len(set(names)) and all(e["name"] == entry_name(e) for e in ENTRIES)
    for ref in REFERENCE:
        mine = [e for e in ENTRIES if e["protocol"] == ref]
        assert {e["reduction"] for e in mine} == {True, False}
        assert all(e["expect"]["verdict"] == "held" for e in mine)
    for cls, prop in DEMO_VARIANTS.items():
        mine = [e for e in ENTRIES if e["protocol"] == _ref(cls)]
        assert mine and all(e["expect"] | {"states": 0, "depth": 0} ==
                            {"verdict": "violated", "property": prop, "states": 0, "depth": 0} for e in mine)
        assert isinstance(resolve(_ref(cls)), cls)


@pytest.mark.parametrize("cls", DEMO_VARIANTS, ids=lambda c: c.__name__)
def test_every_demo_variant_is_found_and_its_trace_replays(cls, tmp_path):
    """Each demo variant's property is found, and its saved trace loads back to the same case and replays it."""
    prop = DEMO_VARIANTS[cls]
    res = explore(cls(), *_config(cls), properties=[prop], others=_others(cls))
    assert res.verdict == "violated" and res.violation.property == prop
    trace = res.trace(protocol_ref=_ref(cls))
    assert trace.property == prop or prop in [v["property"] for v in trace.verdict["violations"]]
    again = Trace.load(trace.save(tmp_path / "cex.json")).case()
    cex = res.counterexample  # the trace records the whole schedule run_case ran (the explorer's is a prefix)
    assert attrs.evolve(again, step_bound=None, schedule=cex.schedule) == cex and again.bound() == cex.bound()
    assert again.schedule[:len(cex.schedule)] == cex.schedule
    assert prop in run_case(cls(), again).violated()


@pytest.mark.parametrize("cls", DEMO_VARIANTS, ids=lambda c: c.__name__)
def test_first_violation_replays_in_both_modes(cls):
    """With and without reduction, the first violation found replays in run_case within the reported depth."""
    verdicts = set()
    for reduction in (True, False):
        res = explore(cls(), *_config(cls), reduction=reduction, others=_others(cls))
        verdicts.add(res.verdict)
        assert res.verdict == "violated"
        assert res.violation.property in run_case(cls(), res.counterexample).violated()
        assert len(res.counterexample.schedule) <= res.depth
    assert verdicts == {"violated"}


@pytest.mark.parametrize("cls", EVERY_CLASS, ids=lambda c: c.__name__)
def test_reduction_agrees_with_the_full_search(cls):
    """Verdicts agree; the reduced terminal states are a subset of the full ones, equal up to the fault flag."""
    prop = DEMO_VARIANTS.get(cls)
    for n, k, f in SMALL:
        for props in (None, [prop]) if prop else (None,):
            a = explore(cls(), n, k, max_faults=f, reduction=True, properties=props)
            b = explore(cls(), n, k, max_faults=f, reduction=False, properties=props)
            assert a.verdict == b.verdict, (n, k, f, props)
            if a.verdict == "violated":
                assert a.violation.property in run_case(cls(), a.counterexample).violated()
                assert b.violation.property in run_case(cls(), b.counterexample).violated()
        red = terminal_signatures(cls(), n, k, reduction=True, max_faults=f)
        full = terminal_signatures(cls(), n, k, reduction=False, max_faults=f)
        assert red <= full
        assert {s[:-1] for s in red} == {s[:-1] for s in full}


@pytest.mark.parametrize("cls", REFERENCE_CLASSES, ids=lambda c: c.__name__)
def test_reference_protocols_hold_and_the_reduction_shrinks(cls):
    """The reference protocols hold at 3x4 and the reduction explores strictly fewer states."""
    a = explore(cls(), 3, 4, reduction=True)
    b = explore(cls(), 3, 4, reduction=False)
    assert a.verdict == b.verdict == "held"
    assert 0 < a.states < b.states and a.counterexample is None and a.trace() is None


class _TimeoutIsFatal(PaperProtocolAsync):
    """Test-only flaw: a timed-out completion raises instead of shortening the prefix."""

    name = "timeout-is-fatal"

    def fetch_own(self, rank, n_ranks, chunk_hashes, planned):
        mine = owned_chunks(self, rank, n_ranks, planned)
        handles = []
        for c in mine:
            handles.append((yield GetAsync(self.key(c, chunk_hashes[c], rank, n_ranks))))
        fetched = {}
        for c, h in zip(mine, handles):
            value = yield Wait(h, self.wait_timeout)
            if value is TIMED_OUT:
                raise RuntimeError("timed out")
            if value is None:
                return c, fetched
            fetched[c] = value
        return planned, fetched


def test_lost_and_delayed_completions_are_explored():
    """A flaw reachable only through a lost or delayed completion is found, and not without faults."""
    res = explore(_TimeoutIsFatal(), 2, 2, properties=["termination"])
    assert res.verdict == "violated"
    plan = res.counterexample.faults
    assert plan.lost or plan.delayed
    assert "termination" in run_case(_TimeoutIsFatal(), res.counterexample).violated()
    assert explore(_TimeoutIsFatal(), 2, 2, max_faults=0).verdict == "held"


def test_budgets_progress_and_bad_input():
    """should_stop gives 'incomplete', progress reports counters, a cached set shrinks the search, bad input raises."""
    seen = []
    res = explore(PaperProtocolAsync(), 3, 5, max_faults=2, reduction=False, should_stop=lambda: bool(seen),
                  progress=seen.append)
    assert res.verdict == "incomplete" and seen and {"states", "transitions", "states_per_s"} <= set(seen[0])
    assert explore(PaperProtocol(), 2, 3, cached=[0, 1]).verdict == "held"
    assert explore(PaperProtocol(), 2, 3, cached=[0, 1]).states < explore(PaperProtocol(), 2, 3).states
    with pytest.raises(ExploreError):
        explore(PaperProtocol(), 2, 3, cached=[7])
    with pytest.raises(ExploreError):
        explore(PaperProtocol(), 2, 3, cached="some")


def test_bench_reports_a_rate():
    """bench() returns positive states, seconds and rate."""
    got = bench(0.3)
    assert got["states"] > 0 and got["seconds"] > 0 and got["states_per_s"] > 0


@pytest.mark.parametrize("cls", EVERY_CLASS, ids=lambda c: c.__name__)
def test_simulator_runs_are_among_the_explored_outcomes(cls):
    """Differential check against `run_case`: random schedules and fault plans (within the explorer's fault
    model: one fault after lookup, per-rank evictions) end in a terminal state the explorer reached, with
    at most its violations (a plan's fault that no move observes only waives maximality)."""
    rng = random.Random(f"explore-{cls.__name__}")
    for n, k in ((2, 3), (3, 2)):
        explored: dict = {}
        for cached, planned, results, props in terminal_outcomes(cls(), n, k):
            explored.setdefault((cached, planned, results), set()).add(props)
        for _ in range(40):
            plan = {"evict_before_lookup": [Eviction(c, r) for r in range(n) for c in range(k) if rng.random() < 0.3]}
            kind = rng.choice(["none", "evict", "lost", "delayed"])
            if kind == "evict":
                plan["evict_during_load"] = [Eviction(rng.randrange(k), rng.randrange(n), rng.randrange(8))]
            elif kind != "none":
                plan[kind] = [(rng.randrange(n), rng.randrange(3)) + ((DELAY_SECONDS,) if kind == "delayed" else ())]
            out = run_case(cls(), Case(n, k, faults=FaultPlan(**plan), seed=rng.randrange(10**6)))
            if out.load is None or any(v.property in ("desync", "termination") for v in out.load.violations):
                continue  # not a terminal state: the run stopped on a transition
            cached, planned, results, props = outcome_summary(out)
            assert any(set(props) <= set(p) for p in explored.get((cached, planned, results), ())), (plan, props)


class _CombineRaises(PaperProtocol):
    """Test-only flaw: the scheduler's rule raises when some rank reports no hit."""

    name = "combine-raises"

    def combine(self, reports, n_chunks):
        if min(reports) == 0:
            raise ValueError("no hit")
        return super().combine(reports, n_chunks)


def test_a_raising_combine_is_a_termination_violation_as_in_run_case():
    """explore() reports `termination` for a raising `combine` (it used to crash), and run_case agrees."""
    res = explore(_CombineRaises(), 2, 3)
    assert res.verdict == "violated" and res.violation.property == "termination"
    assert "combine" in res.violation.summary
    assert "termination" in run_case(_CombineRaises(), res.counterexample).violated()
    assert res.counterexample.faults.evict_before_lookup  # a cached set where some rank has no hit


def test_terminal_outcomes_carry_the_events_and_the_fault_plan():
    """A violating terminal state is checked over an Outcome with the store/lookup/load events and its real faults."""
    from checking.explore.bfs import Search
    search = Search(PaperProtocolAsync(), 2, 2, properties=frozenset())
    search.run(None, None)
    phases, plans = set(), set()
    for packed in search.reached_states():
        st = search.space.unpack(packed)
        if any(search.space.can_move[x] for x in st[:2]):
            continue
        out = search.terminal.outcome(st)
        phases |= {e.phase for e in out.events}
        plans.add((bool(out.case.faults.lost), bool(out.case.faults.delayed), bool(out.case.faults.evict_during_load)))
        assert out.case.faults.after_lookup() == (st[2] % 2 == 1)
        assert len(out.load.schedule) == out.load.steps
    assert phases == {"store", "lookup", "load"}
    assert {(True, False, False), (False, True, False), (False, False, True), (False, False, False)} <= plans


def test_every_lazy_entry_keeps_the_verdict_of_its_eager_twin():
    """The lazy initial state gives every manifest configuration the eager verdict (and property) from no more states."""
    eager = {e["name"]: e for e in ENTRIES if not e.get("lazy")}
    lazy = [e for e in ENTRIES if e.get("lazy")]
    assert {e["name"].replace("-lazy", "") for e in lazy} == {n for n, e in eager.items()
                                                              if e["cached"] == "all" and not e.get("others")}
    for e in lazy:
        twin = eager[e["name"].replace("-lazy", "")]["expect"]
        assert (e["expect"]["verdict"], e["expect"].get("property")) == (twin["verdict"], twin.get("property"))
        assert e["expect"]["states"] <= twin["states"]
    assert sum(e["expect"]["states"] for e in lazy) < sum(eager[e["name"].replace("-lazy", "")]["expect"]["states"]
                                                          for e in lazy)


@pytest.mark.parametrize("cls", [c for c in DEMO_VARIANTS if c.__name__ not in VARIANT_OTHERS], ids=lambda c: c.__name__)
def test_lazy_counterexamples_name_a_concrete_cached_set(cls):
    """A lazy counterexample lists every unit evicted before lookup, and run_case on it reports the property."""
    prop = DEMO_VARIANTS[cls]
    res = explore(cls(), *_config(cls), lazy=True, properties=[prop])
    assert res.verdict == "violated" and res.violation.property == prop
    case = res.counterexample
    assert all(e.rank is not None and e.step is None for e in case.faults.evict_before_lookup)
    out = run_case(cls(), case)
    assert prop in out.violated() and out.cached == res.outcome.cached
    if prop == "soundness":  # the completion with every unobserved unit absent: the smallest LCP
        assert out.planned > out.lcp


def test_too_many_cached_sets_are_refused_before_any_is_built():
    """Eagerly, 2^units cached sets beyond what a state can name is an ExploreError at once; lazily it runs."""
    with pytest.raises(ExploreError, match="use the lazy initial state"):
        explore(PaperProtocol(), 8, 32, max_faults=1, should_stop=lambda: True)
    assert explore(PaperProtocol(), 4, 30, max_faults=0, lazy=True, should_stop=lambda: True).verdict == "incomplete"


@pytest.mark.parametrize("cls", (*EVERY_CLASS, _CombineRaises), ids=lambda c: c.__name__)
def test_the_product_of_rank_trees_is_the_lookup_tree(cls):
    """product_leaves gives lookup_leaves' leaves in the same order; a flagged leaf is one the harness faults."""
    from checking.explore.bfs import Search
    from checking.explore.lazy import lookup_leaves, product_leaves
    for n, k in ((1, 3), (2, 3), (3, 2), (3, 5)):
        s = Search(cls(), n, k, lazy=True, properties=frozenset())
        setup = s.setup
        whole = list(lookup_leaves(cls(), setup.store_outcome, setup.after_store, setup.evictable))
        product = list(product_leaves(cls(), setup.hashes, setup.after_store, setup.evictable))
        assert [bits for bits, _ in whole] == [bits for bits, *_ in product]
        for (_, look), (_, reports, planned, judge) in zip(whole, product):
            assert bool(look.violations) == judge
            if not judge:
                assert (look.reports, look.planned) == (reports, planned)


def test_the_lazy_initial_state_refuses_other_prompts():
    """Other prompts in the tier are explored with the eager initial state only; lazy says so instead of guessing."""
    with pytest.raises(ExploreError, match="lazy initial state does not cover other prompts"):
        explore(PaperProtocol(), 2, 2, lazy=True, others=[OtherPrompt(n_chunks=2, after=True)])


@pytest.mark.parametrize("cls", DEMO_VARIANTS, ids=lambda c: c.__name__)
def test_the_explorer_words_every_violation_as_the_simulator_does(cls):
    """The explorer's own violation (property, summary, detail: `model.interpreter`'s words) is the one the
    simulator reports on its counterexample, in both modes."""
    from checking.explore.bfs import Search
    for reduction in (True, False):
        search = Search(cls(), *_config(cls), properties=frozenset([DEMO_VARIANTS[cls]]), reduction=reduction,
                        others=tuple(_others(cls)))
        res = search.run(None, None)
        assert res.verdict == "violated" and search.reached is not None
        assert search.reached.violation == res.violation


@attrs.define(frozen=True)
class _NegativeWaitTimeout(PaperProtocolAsync):
    """Test-only flaw: waits with a timeout of -1 s, which no `Wait` may carry."""

    name = "negative-wait-timeout"
    wait_timeout: float | None = -1.0


def test_a_wait_the_interpreter_refuses_is_a_termination_violation_in_both():
    """A `Wait` with a negative timeout ends the rank with `termination` in the explorer, worded as in the
    simulator (`model.interpreter.timeout_problem`), even when its completion is on time."""
    res = explore(_NegativeWaitTimeout(), 2, 2, max_faults=0)
    assert res.verdict == "violated" and res.violation.property == "termination"
    assert "a timeout is >= 0 seconds or None" in res.violation.summary


@pytest.mark.parametrize("reduction", (True, False))
def test_every_state_has_one_depth(reduction):
    """The search looks a successor up in the next level only: sound because a state's depth is a function of the
    state (its moves, plus unreduced its eager evictions: the faults used less the lost and delayed completions)."""
    from checking.explore.bfs import Search
    from checking.explore.state import OK
    search = Search(PaperProtocolAsync(), 3, 3, max_faults=2, reduction=reduction, properties=frozenset())
    search.run(None, None)
    space = search.space
    assert len(search.levels) > 5
    for depth, level in enumerate(search.levels):
        for packed in level:
            st = space.unpack(packed)
            faults = st[space.n] % (space.max_faults + 1)
            lost_or_delayed = sum(status != OK for x in st[:space.n] for _, status in space.asyncs_of[x])
            assert depth == space.steps(st) + (0 if reduction else faults - lost_or_delayed)


def _terminal_memo_agrees(search) -> tuple[int, int]:
    """Every terminal state of a finished search: its memoised verdict is `check_outcome` of its own outcome.
    (terminal states, violating ones)."""
    terminal, space = search.terminal, search.space
    states = violating = 0
    for packed in search.reached_states():
        st = space.unpack(packed)
        if any(space.can_move[x] for x in st[:space.n]):
            continue
        expected = check_outcome(terminal.outcome(st))
        assert terminal.violations(st) == expected, (space.name, st)
        states += 1
        violating += bool(expected)
    return states, violating


@pytest.mark.parametrize("cls", EVERY_CLASS, ids=lambda c: c.__name__)
def test_the_terminal_memo_keys_on_everything_the_checks_read(cls):
    """`Terminals.violations` is memoised across configurations (its key leaves the configuration out): on every
    terminal state of every variant (eager with its other prompts, lazy without), unreduced and reduced, the memoised
    violations equal the checks of the state's own outcome, and the memo is shared."""
    from checking.explore.bfs import Search
    n, k = _config(cls)
    runs = [dict(reduction=False, others=tuple(_others(cls))), dict(reduction=True, others=tuple(_others(cls)))]
    if cls.__name__ not in VARIANT_OTHERS:
        runs.append(dict(reduction=False, lazy=True))
    states = violating = keys = 0
    for options in runs:
        search = Search(cls(), n, k, max_faults=2, properties=frozenset(), **options)
        search.run(None, None)
        got = _terminal_memo_agrees(search)
        states, violating, keys = states + got[0], violating + got[1], keys + len(search.terminal.memo)
    assert keys < states  # terminal states of several configurations shared an answer
    # a variant's property is seen in its terminal states unless it is one of a transition (desync, termination)
    assert (violating > 0) == (DEMO_VARIANTS.get(cls) not in (None, "desync", "termination"))
