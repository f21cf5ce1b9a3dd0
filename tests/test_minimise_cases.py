"""The protocol case minimiser reaches the smallest shape the exhaustive explorer finds: a large random case of each
demo variant shrinks to the ranks x chunks of the explorer's smallest counterexample of the same property (its
faults re-placed in the smaller shape, not only dropped: `FaultPlan.refitted`)."""
from __future__ import annotations

import random

import pytest

from checking.explore import explore
from checking.minimise import minimise
from checking.search import random_case
from model.finding import Finding
from model.trace import Trace
from model import variants
from model.faults import Eviction, FaultPlan
from model.harness import Case, run_case

def _finding(case, out) -> Finding:
    return Finding(strategy="random", violations=list(out.violations), case=case, outcome=out,
                   trace=Trace.from_outcome(out, protocol_ref=None))


DEMOS = ["EarlyExitOnMiss", "SkipEmptyGather", "GiveUpOnLocalMiss", "GappyLoad", "UnboundedWaitAsync",
         "AlignedPlanGreedyLoad", "ByteOffByOne", "MaxCombine"]


def smallest_explored(protocol, prop: str) -> tuple[int, int]:
    """The smallest ranks x chunks (fewest ranks + chunks, then ranks) where the explorer finds `prop`."""
    for n, k in sorted(((n, k) for n in range(1, 4) for k in range(0, 6)), key=lambda s: (s[0] + s[1], s[0])):
        if explore(protocol, n, k, max_faults=1, properties=[prop]).verdict == "violated":
            return n, k
    raise AssertionError(f"the explorer finds no {prop} up to 3 x 5")


@pytest.mark.parametrize("name", DEMOS)
def test_random_cases_shrink_to_the_explorers_smallest_shape(name):
    protocol = getattr(variants, name)()
    rng = random.Random(1)
    shrunk = []
    for _ in range(400):
        case = random_case(rng, max_ranks=6, max_chunks=12, others=False)
        out = run_case(protocol, case)
        if out.violations:
            best = minimise(protocol, _finding(case, out))
            shrunk.append((out.violations[0].property, best))
            if len(shrunk) == 3:
                break
    assert shrunk, f"{name}: no violating random case"
    for prop, best in shrunk:
        assert best.outcome.violations[0].property == prop
        assert (best.case.n_ranks, best.case.n_chunks) == smallest_explored(protocol, prop), best.case


def test_a_fault_on_a_chunk_the_smaller_shape_lacks_is_re_placed():
    """2 ranks x 7 chunks, chunk 6 evicted after the lookup (the early exit's desync): dropping the chunk would drop
    the fault; re-placed on the last chunk with the same owner, the case shrinks to 2 x 1."""
    case = Case(2, 7, faults=FaultPlan(evict_after_lookup=(Eviction(6),)))
    out = run_case(variants.EarlyExitOnMiss(), case)
    best = minimise(variants.EarlyExitOnMiss(), _finding(case, out))
    assert (best.case.n_ranks, best.case.n_chunks) == (2, 1)
    assert best.case.faults == FaultPlan(evict_after_lookup=(Eviction(0),))


def test_refitted_moves_keep_owner_distance_or_end():
    plan = FaultPlan(evict_after_lookup=(Eviction(6, rank=3),), lost=((3, 4),))
    assert plan.refitted(2, 3).evict_after_lookup == (Eviction(2, rank=1),)  # chunk 2: owner 0 as chunk 6
    assert plan.refitted(2, 3, "shift", was=7).evict_after_lookup == (Eviction(2, rank=1),)
    assert plan.refitted(2, 3, "last").evict_after_lookup == (Eviction(2, rank=1),)
    assert plan.refitted(2, 3).lost == ((1, 1),)  # rank wrapped, GetAsync index within the rank's 2 of 3 chunks
    assert FaultPlan(evict_after_lookup=(Eviction(5),)).refitted(1, 4, "shift", was=7).evict_after_lookup == \
        (Eviction(2),)


def test_the_faults_a_finding_does_not_need_go_first_by_delta_debugging():
    """4 ranks x 12 chunks, the early exit's eviction and 12 late completions it does not need: delta debugging over
    the case's faults (`model.cases.CODECS`) drops them before the shape shrinks, to the same 2 x 1 case in 120 runs
    (the greedy shrinks alone took 166)."""
    protocol = variants.EarlyExitOnMiss()
    late = tuple((r, i, 0.5) for r in range(4) for i in range(3))
    case = Case(4, 12, faults=FaultPlan(evict_after_lookup=(Eviction(11),), delayed=late))
    out = run_case(protocol, case)
    runs = []
    best = minimise(protocol, _finding(case, out), runner=lambda p, c: runs.append(c) or run_case(p, c))
    assert (best.case.n_ranks, best.case.n_chunks) == (2, 1)
    assert best.case.faults == FaultPlan(evict_after_lookup=(Eviction(0),))
    assert len(runs) <= 130
    assert all(c.n_ranks == 4 for c in runs[:4]) and runs[0].faults.size() == 7  # (half the faults, first)
