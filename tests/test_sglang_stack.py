"""`--engine sglang-hicache` (`adapters.sglang_hicache`): SGLang 0.5.23's own HiCache prefetch agreement in two rank
processes over gloo, each with its own `HiCacheFile` storage, driven by `checking.serving.stack_run` as `check` drives
it.

Three stacks per module, each started once (about 8 s each on two cores): SGLang as released, and SGLang with one of the
demo `--engine-patch`es (`adapters.sglang_hicache.patches`): `agree_max` (the agreement takes the MAX: found by
`engine-soundness` and `hit-accuracy`) and `agree_allgather_min` (a correct other agreement: holds). The released
stack runs with a sync-group timeout of 1 s (SGLang keeps torch's 1800 s; `sync_timeout` scales it) and a prefetch
deadline of 2 s, so that one paused request outlasts the sync timeout: the finding that SGLang's storage threads die
for good then (`hit-accuracy` on the next request; every request still returns under the default `timeout` policy,
and under `wait_complete` one does not: `request-returns`). Every stack is closed at the end of the module, and no
rank process (those a reset replaced included) nor any socket of theirs is left. About 50 s in all: `make test` runs
them in a session of their own (`-m sglang`), as the vLLM tests, so that no test beside them starves their bounds.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess

import pytest

from adapters.sglang_hicache.sgl_stack import HiCacheStack, factory
from checking.serving.stack_cases import recurring_stream
from checking.serving.stack_run import StackBounds, run_stack_case
from model.stack_case import StackCase, StackStep

# (found, not imported: SGLang is imported in the rank processes only, after their stubs)
if importlib.util.find_spec("sglang") is None:
    pytest.skip("SGLang is installed by make venv (requirements/install-sglang.sh)", allow_module_level=True)

pytestmark = pytest.mark.sglang

PATCHES = "adapters.sglang_hicache.patches"
BOUNDS = StackBounds(step=20.0, call=10.0, fault=10.0, settle=1.0)
_PIDS: list[int] = []


def _start(*patches: str, **options) -> HiCacheStack:
    stack = factory(2, patches=tuple(f"{PATCHES}:{p}" for p in patches), lookup_timeout=2.0, call_timeout=20.0,
                    start_timeout=120.0, **options)
    _PIDS.extend(ln.proc.pid for ln in stack.links)
    return stack


@pytest.fixture(scope="module")
def stacks():
    """The three stacks, in a temp dir of their own that is empty once they are closed (their dirs and torch's
    Inductor cache, which the ranks' import of Inductor would make as /tmp/torchinductor_USER)."""
    import tempfile
    private = tempfile.mkdtemp(prefix="sc-sgl-")
    was = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir, os.environ["TMPDIR"] = private, private
    made: dict[str, HiCacheStack] = {}
    try:
        made["released"] = _start(sync_timeout=1.0)
        made["agree_max"] = _start("agree_max")
        made["agree_allgather_min"] = _start("agree_allgather_min")
        yield made
    finally:
        _PIDS.extend(ln.proc.pid for s in made.values() for ln in s.links)  # (ranks started again by a reset)
        problems = [p for s in made.values() for p in s.close()]
        assert problems == []
        assert all(not os.path.exists(s.tmp) for s in made.values())
        tempfile.tempdir = was[0]
        os.environ.pop("TMPDIR") if was[1] is None else os.environ.update(TMPDIR=was[1])
        assert os.listdir(private) == []
        os.rmdir(private)
        assert [pid for pid in set(_PIDS) if not _gone(pid)] == []
        listening = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=30).stdout
        assert not [line for line in listening.splitlines() if any(f"pid={pid}," in line for pid in _PIDS)]


def _with(steps: list[StackStep]) -> StackCase:
    base = recurring_stream(2)
    return StackCase(n_ranks=2, prompts=base.prompts, steps=tuple(steps))


def _serve(rid: str, prompt: str) -> StackStep:
    return StackStep(kind="serve", request=rid, prompt=prompt)


#: p0 served, a page of p0 evicted off rank 1's storage, p0 served again: rank 1 holds fewer pages than rank 0.
EVICTED = _with([_serve("q1", "p0"), StackStep(kind="evict", prompt="p0", rank=1, chunk=0, tier="remote"),
                 _serve("q2", "p1"), _serve("q3", "p0")])
#: Rank 1's storage paused across one request, then p0 served again.
PAUSED = _with([_serve("q1", "p0"), StackStep(kind="fault", rank=1, action="pause"), _serve("q2", "p1"),
                StackStep(kind="fault", rank=1, action="resume"), _serve("q3", "p0")])
#: What holds on SGLang as released (no storage pause: those are the finding's).
HOLDING = [
    recurring_stream(2),
    EVICTED,
    _with([_serve("q1", "p0"), StackStep(kind="fault", rank=0, action="kill"), _serve("q2", "p1"),
           _serve("q3", "p0")]),
    _with([_serve("q1", "p0"), StackStep(kind="fault", rank=1, action="restart"), _serve("q2", "p0")]),
    _with([_serve("q1", "p0"), StackStep(kind="submit", request="q2", prompt="p0"),
           StackStep(kind="submit", request="q3", prompt="p0"), StackStep(kind="step", count=1),
           StackStep(kind="abort", request="q2"), StackStep(kind="drain")]),
]


def _reported(out) -> dict[str, int | None]:
    return {e["request"].split("-")[-1]: e["reported"] for e in out.events if e.get("request")}


def test_released_sglang_holds_without_a_storage_pause(stacks):
    stack = stacks["released"]
    assert [i["backend"] for i in stack.info] == ["HiCacheFile", "HiCacheFile"]
    assert all(i["controller"].endswith("HybridCacheController") for i in stack.info)
    for case in HOLDING:
        out = run_stack_case(stack, case, bounds=BOUNDS)
        assert out.violations == [], (case.steps, out.violations)
    # (the hit of the recurring prompt is the agreed MIN: rank 1 lost p0's first page, so nothing is a hit)
    assert _reported(run_stack_case(stack, EVICTED, bounds=BOUNDS))["q3"] == 0


def test_agree_max_is_found_by_engine_soundness(stacks):
    out = run_stack_case(stacks["agree_max"], EVICTED, bounds=BOUNDS)
    props = [v.property for v in out.violations]
    assert props[:2] == ["hit-accuracy", "engine-soundness"], out.violations
    assert "more than the 0 every rank held" in out.violations[1].summary


def test_agree_allgather_min_holds(stacks):
    for case in (EVICTED, recurring_stream(2)):
        out = run_stack_case(stacks["agree_allgather_min"], case, bounds=BOUNDS)
        assert out.violations == [], out.violations


def test_a_pause_past_the_sync_timeout_kills_the_prefetch_threads_for_good(stacks):
    """The finding: rank 0's prefetch thread waits in the hit query's MIN all-reduce for rank 1, whose storage does not
    answer; the gloo timeout raises there, outside the thread's try (cache_controller.py:1356), and the thread ends;
    rank 1's, once its storage answers again, waits alone in the same collective and ends too. Every request returns
    (the `timeout` policy ends it at its deadline) but none gets a storage hit again: `hit-accuracy`."""
    stack = stacks["released"]
    out = run_stack_case(stack, PAUSED, bounds=BOUNDS)
    before = [ln.proc.pid for ln in stack.links]
    assert [v.property for v in out.violations] == ["hit-accuracy"], out.violations
    assert "reported 0 tokens cached though every rank held 8" in out.violations[0].summary
    assert all(e.get("status") == "finished" for e in out.events if e.get("request"))
    leaks = next(e["leaks"] for e in out.events if e.get("text") == "leaks")
    assert [t["prefetch_thread"] for t in leaks["threads"]] == [False, False]
    # (reset starts the ranks again, the old ones killed: the next case runs on live threads)
    assert run_stack_case(stack, recurring_stream(2), bounds=BOUNDS).violations == []
    assert all(_gone(pid) for pid in before) and [ln.proc.pid for ln in stack.links] != before
    _PIDS.extend(ln.proc.pid for ln in stack.links)


def test_wait_complete_waits_on_the_paused_storage_request_returns(stacks):
    """Under `wait_complete` a request waits for its prefetch, which waits in the collective: our own bound ends the
    wait (`request-returns`), and the stack stays usable."""
    stack = stacks["released"]
    stack.prefetch_policy = "wait_complete"
    try:
        out = run_stack_case(stack, PAUSED, bounds=BOUNDS)
    finally:
        stack.prefetch_policy = "timeout"
    assert out.violations and out.violations[0].property == "request-returns", out.violations
    assert "q2" in out.violations[0].summary
    assert run_stack_case(stack, recurring_stream(2), bounds=BOUNDS).violations == []


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True
