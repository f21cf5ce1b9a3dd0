"""The minimisers: `ddmin`, delta debugging over the reducible parts of any case (its kind's codec,
`model.cases.CODECS`: a protocol case's faults, the store ops, a concurrent layout's ops, a serving case's steps),
and `minimise`, which shrinks a protocol `Case` (its faults by `ddmin`, then fewer ranks and chunks, simpler faults,
no schedule) while it still violates the same property; and how many runs a candidate of a racy finding gets
(`runs_per_candidate`). Pure: runs come in through callables."""
from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence, TypeVar

import attrs

from checking.api import Runner
from model.cases import CODECS
from model.faults import FAULT_KINDS, REFITS, Eviction, FaultPlan
from model.finding import Finding, Rate
from model.harness import Case, run_case
from model.outcome import OtherPrompt

__all__ = ["ddmin", "minimise", "shrinks", "CANDIDATE_RUNS", "runs_per_candidate"]

T = TypeVar("T")

#: The most runs one minimising candidate of a racy finding gets, by trace kind: a run of an engine or stack case
#: starts a deployment or empties a stack (seconds), one of a concurrent layout takes milliseconds.
CANDIDATE_RUNS = {"concurrent": 20, "engine": 6, "stack": 6}


def runs_per_candidate(kind: str, k: int, n: int) -> int:
    """Runs a minimising candidate of a `kind` finding seen in `k` of `n` runs gets before it is judged not to fail:
    the runs that rate needs to show at 99% (`model.finding.Rate.runs_to_show`), at most `CANDIDATE_RUNS[kind]`."""
    return max(1, min(CANDIDATE_RUNS[kind], Rate(k, n).runs_to_show()))


def ddmin(parts: Sequence[T], still_fails: Callable[[list[T]], bool], *,
          should_stop: Callable[[], bool] = lambda: False) -> tuple[list[T], bool]:
    """Delta debugging over reducible parts (an op sequence, a history's ops, a thread's ops): drop chunks of parts
    (halves, then quarters, ... then single parts) while `still_fails(shorter)` holds. Returns the shortest list
    found and whether it is 1-minimal (a full pass of single removals kept nothing; False when `should_stop()`
    ended the search first)."""
    ops = list(parts)
    n = 2
    while len(ops) >= 1:
        size = max(1, len(ops) // n)
        starts = range(0, len(ops), size)
        for start in starts:
            if should_stop():
                return ops, False
            shorter = ops[:start] + ops[start + size:]
            if still_fails(shorter):
                ops = shorter
                n = max(n - 1, 2)
                break
        else:
            if size == 1:
                return ops, True
            n = min(n * 2, len(ops))
    return ops, True


def _smaller_shapes(case: Case) -> Iterator[tuple[int, int]]:
    """Fewer ranks, fewer chunks: one less, then half (a large case shrinks in a few steps)."""
    n, k = case.n_ranks, case.n_chunks
    for fewer in dict.fromkeys((n - 1, n // 2)):
        if 1 <= fewer < n:
            yield fewer, k
    for fewer in dict.fromkeys((k - 1, k // 2)):
        if 0 <= fewer < k:
            yield n, fewer


def _plans_in(case: Case, n: int, k: int) -> Iterator[FaultPlan]:
    """The fault plans a case shrunk to `n` x `k` chunks is tried with: the faults that still fit, every fault
    re-placed (each way of `model.faults.REFITS`), and, for a shape too small for them, each of those plus one
    chunk evicted before the lookup (the explorer tries every cached set: a smaller shape may need another one)."""
    f = case.faults
    plans = [f.restricted(n, k), *(f.refitted(n, k, how, was=case.n_chunks) for how in REFITS)]
    plans = list(dict.fromkeys(plans))
    yield from plans
    for plan in plans:
        for c in range(k):
            if Eviction(c) not in plan.at("before-lookup"):
                yield plan.plus("before-lookup", Eviction(c))


def shrinks(case: Case) -> Iterator[Case]:
    """Smaller neighbours of `case`: fewer ranks or chunks (with the faults re-placed, `_plans_in`), fewer faults,
    simpler faults, no schedule or seed."""
    f = case.faults
    for n, k in _smaller_shapes(case):
        for plan in _plans_in(case, n, k):
            yield attrs.evolve(case, n_ranks=n, n_chunks=k, schedule=(), faults=plan)
    for kind in FAULT_KINDS:
        for i in range(len(getattr(f, kind.field))):
            yield attrs.evolve(case, faults=f.without(kind.field, i))
    for kind in FAULT_KINDS:
        items = getattr(f, kind.field)
        for i, item in enumerate(items):
            for simpler in kind.smaller(item):
                yield attrs.evolve(case, faults=attrs.evolve(f, **{kind.field: items[:i] + (simpler,) + items[i + 1:]}))
    for i, other in enumerate(case.others):
        rest = case.others[:i] + case.others[i + 1:]
        yield attrs.evolve(case, others=rest)
        for simpler in _simpler(other):
            yield attrs.evolve(case, others=case.others[:i] + (simpler,) + case.others[i + 1:])
    if case.seed is not None or case.schedule:
        yield attrs.evolve(case, seed=None, schedule=())
    if case.salt != "s0":
        yield attrs.evolve(case, salt="s0")


def _simpler(other: OtherPrompt) -> Iterator[OtherPrompt]:
    """Smaller neighbours of another prompt: fewer chunks, a shorter shared prefix, fewer evictions, stored first."""
    if other.n_chunks:
        m = other.n_chunks - 1
        yield attrs.evolve(other, n_chunks=m, shared=min(other.shared, m), evicted=tuple(c for c in other.evicted if c < m))
    if other.shared:
        yield attrs.evolve(other, shared=other.shared - 1)
    for i in range(len(other.evicted)):
        yield attrs.evolve(other, evicted=other.evicted[:i] + other.evicted[i + 1:])
    if other.after:
        yield attrs.evolve(other, after=False)


def minimise(protocol: Any, found: Finding, *, runner: Runner = run_case, budget_runs: int = 2000,
             should_stop: Callable[[], bool] = lambda: False) -> Finding:
    """Shrink a protocol finding's case while it still violates the same property: the fewest of its faults (delta
    debugging over its codec's parts, `model.cases.CODECS`), then greedily the smallest ranks, chunks, faults; the
    finding of the smallest case, its violation of that property first."""
    assert found.case is not None, "a protocol finding carries its case"
    target = found.property
    best, runs = found, 0
    codec = CODECS["protocol"]
    spent = lambda: should_stop() or runs >= budget_runs  # noqa: E731

    def fewer_faults(parts: list) -> bool:
        nonlocal best, runs
        runs += 1
        smaller = codec.rebuild(best.case, parts)
        out = runner(protocol, smaller)
        if target not in out.violated():
            return False
        best = best.with_case(smaller, out)
        return True

    if len(codec.parts(found.case)) > 1:  # the faults it needs first (delta debugging), then the greedy shrinks
        ddmin(codec.parts(found.case), fewer_faults, should_stop=spent)
    progress = True
    while progress and runs < budget_runs:
        progress = False
        for smaller in shrinks(best.case):
            if should_stop() or runs >= budget_runs:
                return best.lead_with(target)
            runs += 1
            out = runner(protocol, smaller)
            if target in out.violated():
                best = best.with_case(smaller, out)
                progress = True
                break
    if best is not found:
        best.notes.append(f"minimised from {found.case.n_ranks} ranks x {found.case.n_chunks} chunks, "
                          f"{found.case.faults.size()} fault(s) in {runs} runs")
    return best.lead_with(target)
