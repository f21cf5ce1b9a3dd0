"""Tests of run_case and the checks: references hold, every demo variant violates its property."""
import pytest

from model.checks import PROPERTIES
from model.faults import Eviction, FaultPlan
from model.harness import Case, leading_run, run_case
from model.protocols import REFERENCE_PROTOCOLS, PaperProtocol
from checking.minimise import minimise
from checking.search import search
from model.variants import DEMO_VARIANTS


@pytest.mark.parametrize("name", sorted(REFERENCE_PROTOCOLS))
def test_reference_holds_on_small_enumeration(name):
    """Every reference protocol holds on every case of the smallest enumerated sizes."""
    budget = iter(range(4000))
    found = search(REFERENCE_PROTOCOLS[name](), should_stop=lambda: next(budget, None) is None)
    assert found is None


@pytest.mark.parametrize("variant", list(DEMO_VARIANTS), ids=lambda v: v.__name__)
def test_demo_variant_violates_its_property(variant):
    """Each demo variant is caught by its own property: the first violation of the case found, and of its minimised
    counterexample, is the one the catalog names for it (what is broken leads; what follows from it comes after)."""
    budget = iter(range(200_000))
    found = search(variant(), should_stop=lambda: next(budget, None) is None)
    assert found is not None
    prop = DEMO_VARIANTS[variant]
    assert found.property == prop, found.outcome.violated()
    small = minimise(variant(), found)
    assert run_case(variant(), small.case).violations[0].property == prop


def test_every_property_has_a_demo_variant():
    """Every property name a check can report is the target of at least one demo variant."""
    assert set(DEMO_VARIANTS.values()) == set(PROPERTIES)


def test_lcp_and_plan_of_paper_protocol():
    """The paper protocol plans exactly the leading run of cached chunks."""
    out = run_case(PaperProtocol(), Case(3, 8, faults=FaultPlan(evict_before_lookup=[Eviction(5), Eviction(2)])))
    assert out.lcp == 2 == out.planned and out.reports == [8, 8, 2]
    assert not out.violations and all(sorted(r) == [0, 1] for r in out.results.values())


def test_eviction_during_load_shortens_prefix_and_keeps_agreement():
    """An eviction during the load lowers u on every rank alike; maximality is not claimed then."""
    out = run_case(PaperProtocol(), Case(2, 4, faults=FaultPlan(evict_during_load=[Eviction(2, step=0)])))
    assert not out.violations and {len(r) for r in out.results.values()} == {2}


def test_leading_run():
    """The LCP is the length of the leading run of cached chunks."""
    assert leading_run({0, 1, 3}, 5) == 2 and leading_run(set(), 3) == 0 and leading_run({0, 1}, 2) == 2


def test_store_path_written_keys_map_to_chunks():
    """The harness records, per rank, which chunk each key written by rank_store belongs to."""
    out = run_case(PaperProtocol(), Case(2, 3))
    assert sorted(out.written[0].values()) == [0, 2] and list(out.written[1].values()) == [1]


@pytest.mark.parametrize("variant", list(DEMO_VARIANTS), ids=lambda v: v.__name__)
def test_check_reports_each_demo_variant_by_its_own_property(variant, tmp_path):
    """`check` on each demo variant (search, minimising, measuring, the saved trace) leads with the catalog's
    property for it: the verdict's first violation and the trace's property."""
    from model.trace import Trace
    from shardcheck.check_cmd import run_check
    r = run_check(f"{variant.__module__}:{variant.__name__}", None, budget=30, out_dir=str(tmp_path))
    prop = DEMO_VARIANTS[variant]
    assert r["verdict"] == "violated" and r["violations"][0]["property"] == prop, r["violations"]
    assert Trace.load(r["violations"][0]["counterexample"]).property == prop
