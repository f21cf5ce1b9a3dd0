"""The serving-stack layer's own parts, on the in-memory stack (`model.stack_memory`): the case as data, the oracle of
each stack property, and the interpreter (`checking.serving.stack_run`). No real stack runs here."""
from __future__ import annotations

import json

import pytest

from checking.serving.stack_run import run_stack_case
from model.contract import STACK_METHODS, ServingStack, StackRequest, StackResult
from model.engine_case import CaseError, EnginePrompt
from model.stack_case import StackCase, StackStep, stack_case_from_json
from model.stack_memory import MemoryStack
from model.stack_oracle import check_leaks, check_output, expected_tokens

P0 = EnginePrompt(name="p0", chunks=2, tail=1)
TENANT_B = EnginePrompt(name="p1", chunks=2, tail=1, stem="p0", shared=2, tenant="b")


def _case(*steps: StackStep, n_ranks: int = 2, prompts=(P0, TENANT_B)) -> StackCase:
    return StackCase(n_ranks=n_ranks, prompts=prompts, steps=steps)


def serve(rid: str, prompt: str = "p0") -> StackStep:
    return StackStep(kind="serve", request=rid, prompt=prompt)


def test_the_memory_stack_is_a_serving_stack():
    stack = MemoryStack(2)
    assert isinstance(stack, ServingStack) and all(callable(getattr(stack, m)) for m in STACK_METHODS)


def test_case_json_round_trip_and_field_errors():
    case = _case(serve("q1"), StackStep(kind="evict", prompt="p0", rank=1, chunk=1, tier="local"),
                 StackStep(kind="step", count=3), StackStep(kind="abort", request="q1"))
    assert stack_case_from_json(json.loads(json.dumps(case.to_json()))) == case
    bad = [({"steps": [{"kind": "jump"}]}, "steps[0].kind"),
           ({"steps": [{"kind": "evict", "prompt": "p0", "rank": 5, "chunk": 0, "tier": "local"}]}, "steps[0].rank"),
           ({"steps": [{"kind": "evict", "prompt": "p0", "rank": 0, "chunk": 0, "tier": "both"}]}, "steps[0].tier"),
           ({"steps": [{"kind": "abort", "request": "q9"}]}, "steps[0].request"),
           ({"steps": [{"kind": "serve", "request": "q1", "prompt": "p0"}] * 2}, "steps[1].request"),
           ({"max_tokens": 0}, "max_tokens"), ({"colour": 1}, "colour")]
    for change, field in bad:
        with pytest.raises(CaseError) as exc:
            stack_case_from_json({**case.to_json(), **change})
        assert exc.value.field == field, (change, exc.value)


def test_a_prompt_held_whole_is_one_token_short():
    assert expected_tokens(2, 4, 9) == 8 and expected_tokens(2, 4, 8) == 7 and expected_tokens(0, 4, 1) == 0


def test_the_memory_stack_holds_every_property():
    """Hits, evictions, a paused server, another tenant, an abort: nothing violated."""
    case = _case(serve("q1"), serve("q2"), StackStep(kind="evict", prompt="p0", rank=1, chunk=1, tier="remote"),
                 StackStep(kind="evict", prompt="p0", rank=1, chunk=1, tier="local"), serve("q3"), serve("q4", "p1"),
                 StackStep(kind="fault", rank=0, action="pause"), serve("q5"),
                 StackStep(kind="fault", rank=0, action="resume"),
                 StackStep(kind="submit", request="q6", prompt="p0"), StackStep(kind="abort", request="q6"))
    out = run_stack_case(MemoryStack(2), case)
    assert out.violations == []
    reported = {e["request"].split("-")[-1]: e["reported"] for e in out.events if e.get("request")}
    assert reported == {"q1": 0, "q2": 8, "q3": 4, "q4": 0, "q5": 0}, reported


class OverReport(MemoryStack):
    def lookup(self, request):
        hit = super().lookup(request)
        return hit + self.chunk_size if hit else hit


class WrongBlocks(MemoryStack):
    def load(self, request, hit):
        return ["another request's KV"] * (hit // self.chunk_size)


class NeverEnds(MemoryStack):
    def step(self):
        return [r for r in super().step() if not r.external]


class Leaky(MemoryStack):
    def abort(self, request_id):
        pins = self.pinned.get(request_id)
        super().abort(request_id)
        if pins:
            self.pinned[request_id] = pins


class SharesTenants(MemoryStack):
    def chunk_keys(self, rank, request):
        return super().chunk_keys(rank, StackRequest(id=request.id, tokens=request.tokens))


@pytest.mark.parametrize("stack,steps,prop", [
    (OverReport, (serve("q1"), serve("q2")), "hit-accuracy"),
    (WrongBlocks, (serve("q1"), serve("q2")), "output-equality"),
    (NeverEnds, (serve("q1"), serve("q2")), "request-returns"),
    (Leaky, (serve("q1"), StackStep(kind="submit", request="q2", prompt="p0"), StackStep(kind="step", count=1),
             StackStep(kind="abort", request="q2")), "kv-leaks"),
    (SharesTenants, (serve("q1"), serve("q2", "p1")), "engine-isolation"),
], ids=["over-report", "wrong-blocks", "never-ends", "leaky", "shares-tenants"])
def test_each_broken_stack_is_violated_by_its_property(stack, steps, prop):
    out = run_stack_case(stack(2, lookup_timeout=0.05), _case(*steps))
    assert out.violations and out.violations[0].property == prop, out.violations


def test_output_equality_stops_at_a_tie_and_compares_log_probabilities():
    ref = StackResult(id="r", status="finished", output=(5, 6, 7), top2=[(-0.1, -3.0), (-1.0, -1.0005), (-0.1, -2)])
    assert check_output(StackResult(id="q", status="finished", output=(5, 9, 1), top2=ref.top2), ref, prompt="p") == []
    moved = StackResult(id="q", status="finished", output=(5, 6, 7), top2=[(-0.2, -3.0)] + list(ref.top2[1:]))
    assert [v.property for v in check_output(moved, ref, prompt="p")] == ["output-equality"]


def test_leaks_name_what_is_held():
    assert check_leaks({"pins": [0, 0], "pinned": [], "free_blocks": 5, "total_blocks": 5}, when="end") == []
    found = check_leaks({"pins": [2, 0], "pinned": ["q1"], "free_blocks": 4, "total_blocks": 5}, when="end")
    assert found and "pins held per rank [2, 0]" in found[0].summary and "4 of 5 KV blocks free" in found[0].summary


class _SlowToRecover(MemoryStack):
    """Recomputes every prompt after a fault, as LMCache does until it reconnects."""
    recovery_seconds = 30.0

    def fault(self, rank: int, action: str) -> None:
        super().fault(rank, action)
        self.degraded = True

    def lookup(self, request: StackRequest) -> int:
        return 0 if getattr(self, "degraded", False) else super().lookup(request)


def test_a_hit_missed_within_the_recovery_window_is_not_hit_accuracy():
    """A request submitted within the stack's `recovery_seconds` after a fault may recompute what the tier holds;
    once the window passed (0 s here), the same miss is `hit-accuracy`."""
    case = _case(serve("q1"), StackStep(kind="fault", rank=0, action="pause"),
                 StackStep(kind="fault", rank=0, action="resume"), serve("q2"))
    assert run_stack_case(_SlowToRecover(2), case).violated() == []
    stack = _SlowToRecover(2)
    stack.recovery_seconds = 1e-9
    assert run_stack_case(stack, case).violated() == ["hit-accuracy"]


def test_the_recovery_window_outlives_the_case_that_struck_the_fault():
    """A stack serves many cases: a fault in one leaves it recovering in the next."""
    stack = _SlowToRecover(2)
    run_stack_case(stack, _case(StackStep(kind="fault", rank=0, action="pause"),
                                StackStep(kind="fault", rank=0, action="resume")))
    assert run_stack_case(stack, _case(serve("q1"), serve("q2"))).violated() == []


class _TimesOutWhenStarved(MemoryStack):
    """Recomputes q2 after waiting its whole lookup timeout, as a stack whose lookup timed out."""
    lookup_timeout = 0.4

    def lookup(self, request: StackRequest) -> int:
        if request.id.endswith("q2"):
            import time
            time.sleep(self.lookup_timeout * 1.5)
            return 0
        return super().lookup(request)


def test_a_hit_missed_at_a_starved_lookup_timeout_is_the_harness_s_not_the_stack_s():
    """A stack that recomputed at its own lookup timeout while the machine kept it from running: `HarnessStarved`
    (rerun, then undecided); on a machine that let it run, the miss is `hit-accuracy`."""
    from model import timing
    case = _case(serve("q1"), serve("q2"))
    saved = timing._measure[0]
    try:
        timing.measure_with(lambda t0, t1: 0.9 * (t1 - t0))
        with pytest.raises(timing.HarnessStarved, match="gave up at its own timeout"):
            run_stack_case(_TimesOutWhenStarved(2, lookup_timeout=0.4), case)
        timing.measure_with(lambda t0, t1: 0.0)
        assert run_stack_case(_TimesOutWhenStarved(2, lookup_timeout=0.4), case).violated() == ["hit-accuracy"]
    finally:
        timing.measure_with(saved)
