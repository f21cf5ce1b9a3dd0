"""The interpreter of stack cases: a case's requests and faults on a real serving stack, every call bounded, every
observation judged by `model.stack_oracle`.

`StackRun(stack, case)` applies one `model.stack_case.StackStep` at a time (`apply`) and ends with `finish()`;
`run_stack_case(stack, case)` does the whole case on a stack emptied first (`ServingStack.reset`: a stack start costs a
minute, so one stack serves many cases). Around each request every rank's holdings of the request's chunk keys are
observed, at submission and once it ended, so the oracle judges what the connector reported against what every rank
held meanwhile (`model.engine_oracle.RankView`: held throughout, at either instant, holding this tenant's KV: a key
some other request of the same KV identity, submitted before it ended, may have stored). A
request's bound is the stack's lookup timeout twice (the lookup, then a load that may wait as long) plus three times
what the same prompt took with no KV cache at all, judged as every timing is (`model.timing`). At the end of the case
every request still in flight is drained, each output is compared with the reference's (the same prompt served with
no KV cache, once per stack: `References`), and the leaks are checked once the stack had `settle` seconds to release
(or, after a fault, until the end of the stack's recovery window: work the fault caught, such as a save job holding
its KV blocks while its calls on a dead server run out their deadlines, ends within it).
"""
from __future__ import annotations

import time
import uuid
import weakref
from typing import Any, Callable

import attrs

from checking.serving.engine_run import EngineOutcome
from model.contract import StackRequest, StackResult, StoreCallTimeout
from model.engine_case import kv_identity
from model.engine_oracle import RankView, prefix
from model.outcome import Violation
from model.stack_case import StackCase, StackStep, request_tokens
from model.stack_oracle import check_hit, check_leaks, check_output, check_returned
from model.timing import (HarnessOutcome, SetupTimeout, allowance, had, over_text, overran, rerun_starved,
                          settle_judged, starved_timeout)
from runtime import starvation
from runtime.bounded import call_bounded

__all__ = ["StackBounds", "StackRun", "References", "run_stack_case", "reset_stack"]


@attrs.frozen
class StackBounds:
    """Seconds each call may take: one scheduler step, an observation (holdings, keys, leaks), a fault; the settling
    before the leak check (polled until clean, at most `settle`)."""

    step: float = 60.0
    call: float = 10.0
    fault: float = 10.0
    settle: float = 3.0


class Stuck(Exception):
    """A call of the stack did not return (or raised): the run stops driving it."""


class References:
    """The reference result of each prompt (served with no KV cache at all), measured once per stack and kept:
    greedy decoding of a fixed model gives the same tokens whenever it runs."""

    def __init__(self) -> None:
        self.results: dict[tuple, StackResult] = {}


#: When each stack's last fault was struck, whichever case struck it: a stack serves many cases, and what a fault
#: leaves behind (LMCache recomputing until it reconnects) outlives the case.
_FAULTED_AT: "weakref.WeakKeyDictionary[Any, float]" = weakref.WeakKeyDictionary()


def store_lag(stack: Any) -> float:
    """Seconds after a request ended within which its stores may still land (the stack's optional `store_lag`; else
    1 s): an eviction waits that long after the last end, so it removes what it names."""
    lag = getattr(stack, "store_lag", None)
    return 1.0 if lag is None else float(lag)


def recovery_window(stack: Any) -> float:
    """Seconds after a fault within which a stack may still recompute what the tier holds (its optional
    `recovery_seconds`, 0 for one that misses nothing once the tier answers again; else twice its lookup timeout): a
    hit missed then is not `hit-accuracy`'s."""
    seconds = getattr(stack, "recovery_seconds", None)
    return 2 * float(stack.lookup_timeout) if seconds is None else float(seconds)


@attrs.define
class _Request:
    rid: str
    request: StackRequest
    prompt: str
    keys: list[list[str]]
    before: list[tuple[list[bool], list[bool] | None]]
    epoch: int
    submitted: float
    #: Its bound (see the module docstring).
    bound: float
    #: Every other request that may have stored while this one was in flight: in flight when it was submitted, ended
    #: within the stack's `store_lag` before, or submitted before it ended.
    overlap: set[str] = attrs.field(factory=set)
    result: StackResult | None = None


class StackRun:
    """One case on one stack (see the module docstring)."""

    def __init__(self, stack: Any, case: StackCase, bounds: StackBounds = StackBounds(), salt: str = "",
                 references: References | None = None) -> None:
        self.stack, self.case, self.bounds, self.salt = stack, case, bounds, salt
        self.references = references if references is not None else References()
        #: (rank, key) -> (KV identity, request id) of every request that may have stored it (from its submission on)
        self.stored_by: dict[tuple[int, str], set[tuple[tuple, str]]] = {}
        self.events: list[dict] = []
        self.violations: list[Violation] = []
        self.requests: dict[str, _Request] = {}
        self.epoch = 0
        #: rid -> when it ended (finished, aborted or given up on)
        self.ended_at: dict[str, float] = {}
        self._faulted_at: float | None = None
        self.stuck = False
        self.finished = False

    # -- calls -----------------------------------------------------------------------------------------------------
    def _call(self, what: str, seconds: float, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        try:
            return call_bounded(seconds, what, "", lambda: fn(*args, **kw))
        except StoreCallTimeout as exc:
            self._stuck(what, f"did not return within {over_text(seconds, exc.waited)}")
        except Exception as exc:  # noqa: BLE001 - a call that raises is the outcome `request-returns`
            self._stuck(what, f"raised {type(exc).__name__}: {exc}")

    def _stuck(self, what: str, problem: str) -> None:
        self.violations.append(Violation("request-returns", f"{what} {problem}", {"call": what}))
        self.stuck = True
        raise Stuck(what)

    def _event(self, step: StackStep | None, **what: Any) -> dict:
        text = what.pop("text", "")
        event = {"i": len(self.events), "step": step.to_json() if step else None,
                 "text": step.describe() if step else text, **what}
        self.events.append(event)
        return event

    # -- requests ----------------------------------------------------------------------------------------------------
    def _stack_request(self, rid: str, prompt_name: str) -> StackRequest:
        prompt = self.case.prompt(prompt_name)
        tokens = request_tokens(self.case, prompt, self.stack.chunk_size, getattr(self.stack, "vocab", 1024),
                                self.salt)
        return StackRequest(id=f"{self.salt}{rid}", tokens=tokens, tenant=prompt.tenant,
                            max_tokens=self.case.max_tokens)

    def _holdings(self, keys: list[list[str]]) -> list[tuple[list[bool], list[bool] | None]]:
        return [self._call(f"holdings(rank {r})", self.bounds.call, self.stack.holdings, r, k)
                for r, k in enumerate(keys)]

    def _submit(self, rid: str, prompt_name: str) -> _Request:
        request = self._stack_request(rid, prompt_name)
        self._reference(request, prompt_name)  # (first, alone: it touches no tier, and it bounds the request)
        prompt = self.case.prompt(prompt_name)
        keys = [list(self._call(f"chunk_keys(rank {r})", self.bounds.call, self.stack.chunk_keys, r, request))
                for r in range(self.stack.n_ranks)]
        for r, ks in enumerate(keys):  # (it may store any of them from now on: whose KV they hold)
            for c, key in enumerate(ks):
                self.stored_by.setdefault((r, key), set()).add((kv_identity(self.case, prompt, c), rid))
        now, lag = time.monotonic(), store_lag(self.stack)
        overlap = {o.rid for o in self.requests.values() if o.result is None or now - self.ended_at.get(o.rid, now) < lag}
        for other in self.requests.values():
            if other.result is None:
                other.overlap.add(rid)
        req = _Request(rid, request, prompt_name, keys, self._holdings(keys), self.epoch, now,
                       2 * self.stack.lookup_timeout + 3 * self._reference(request, prompt_name).seconds,
                       overlap=overlap)
        self.requests[rid] = req
        self._call(f"submit({request.id})", self.bounds.call, self.stack.submit, request)
        return req

    def _step_once(self) -> None:
        for result in self._call("step()", self.bounds.step, self.stack.step) or []:
            req = next((r for r in self.requests.values() if r.request.id == result.id), None)
            if req is not None and req.result is None:
                req.result = result
                self._ended(req)

    def _await(self, req: _Request) -> None:
        """Step until `req` ended, within its bound (else `request-returns`, and it is aborted)."""
        while req.result is None:
            over = overran(req.bound, req.submitted, time.monotonic(), f"request {req.request.id}")
            if over is not None:
                self.violations.extend(check_returned(req.request.id, None, req.bound, prompt=req.prompt,
                                                      waited=time.monotonic() - req.submitted))
                self._call(f"abort({req.request.id})", self.bounds.call, self.stack.abort, req.request.id)
                req.result = StackResult(id=req.request.id, status="never ended")
                self.ended_at[req.rid] = time.monotonic()
                return
            self._step_once()

    def _ended(self, req: _Request) -> None:
        """Judge what the connector reported against what every rank held since the request was submitted."""
        result = req.result
        assert result is not None
        now = time.monotonic()
        self.ended_at[req.rid] = now
        if now - req.submitted > allowance(req.bound) and had(req.submitted, now) > allowance(req.bound):
            self.violations.extend(check_returned(req.request.id, result, req.bound, prompt=req.prompt,
                                                  had=had(req.submitted, now)))
        after = self._holdings(req.keys)
        window = recovery_window(self.stack)
        faulted_at = self._last_fault()
        failed = ("a fault or an eviction while it ran" if self.epoch != req.epoch else
                  f"submitted within the stack's {window:g} s of recovery after a fault"
                  if faulted_at is not None and req.submitted - faulted_at < window else
                  "" if all(self.stack.reachable(r) for r in range(self.stack.n_ranks)) else "a server is down")
        views = self._views(req, after)
        if any(v.unknown for v in views):
            failed = failed or "a server could not be observed"
        found = check_hit(result, views, self.stack.chunk_size, len(req.request.tokens), failed=failed,
                          prompt=req.prompt, granule=getattr(self.stack, "hit_granule", 1))
        if any(v.property == "hit-accuracy" and (result.reported or 0) < v.detail["held"]["lo"] for v in found):
            starved = starved_timeout(self.stack.lookup_timeout, req.submitted, now,
                                      f"the lookup of {req.request.id} (a hit missed)")
            if starved is not None:  # (the stack recomputed at its lookup timeout, which the machine ate)
                raise starved
        self.violations.extend(found)
        self._event(None, text=f"{result.id} ended ({result.status})", request=result.id, status=result.status,
                    reported=result.reported, external=result.external, output=list(result.output),
                    preemptions=result.preemptions, seconds=round(result.seconds, 4), failed=failed,
                    views=[attrs.asdict(v) for v in views])

    def _views(self, req: _Request, after: list) -> list[RankView]:
        prompt = self.case.prompt(req.prompt)
        views = []
        for r, keys in enumerate(req.keys):
            identity = [kv_identity(self.case, prompt, c) for c in range(len(keys))]
            seen, unknown = [], False
            for local, remote in (req.before[r], after[r]):
                unknown = unknown or remote is None
                seen.append([local[c] or bool(remote and remote[c]) for c in range(len(keys))])
            lo = [a and b for a, b in zip(*seen)]
            # (held after it only counts when held before, or another request may have stored it meanwhile)
            others = [any(rid in req.overlap for _, rid in self.stored_by.get((r, k), ())) for k in keys]
            hi = [a or (b and o) for a, b, o in zip(*seen, others)]
            own = [any(i == identity[c] and rid != req.rid for i, rid in self.stored_by.get((r, k), ()))
                   for c, k in enumerate(keys)]
            views.append(RankView(own_lo=prefix([x and o for x, o in zip(lo, own)]),
                                  own_hi=prefix([x and o for x, o in zip(hi, own)]), any_hi=prefix(hi),
                                  unknown=unknown))
        return views

    def _reference(self, request: StackRequest, prompt_name: str) -> StackResult:
        """The prompt served with no KV cache at all (measured once per stack and request shape)."""
        key = (request.tokens, request.max_tokens)
        got = self.references.results.get(key)
        if got is None:
            ref = attrs.evolve(request, id=f"ref-{uuid.uuid4().hex[:8]}")
            self._call(f"submit({ref.id}, reference)", self.bounds.call, self.stack.submit, ref, reference=True)
            t0 = time.monotonic()
            while got is None:
                if overran(self.bounds.step * 4, t0, time.monotonic(), "a reference request") is not None:
                    self._stuck(f"the reference request of {prompt_name}", "never ended")
                for result in self._call("step()", self.bounds.step, self.stack.step) or []:
                    if result.id == ref.id:
                        got = result
                    else:
                        other = next((r for r in self.requests.values() if r.request.id == result.id), None)
                        if other is not None and other.result is None:
                            other.result = result
                            self._ended(other)
            self.references.results[key] = got
        return got

    # -- steps -------------------------------------------------------------------------------------------------------
    def apply(self, step: StackStep) -> list[Violation]:
        """Run one step; the violations it showed (the run stops driving the stack after a call that did not
        return)."""
        if self.stuck or self.finished:
            return []
        before = len(self.violations)
        t0 = time.monotonic()
        run = {"serve": self._serve, "submit": self._submit_step, "step": self._step, "drain": self._drain,
               "abort": self._abort, "evict": self._evict, "fault": self._fault}[step.kind]
        try:
            run(step)
            self._event(step, seconds=round(time.monotonic() - t0, 4))
        except Stuck:
            self._event(step, stuck=True)
        return self.violations[before:]

    def _serve(self, step: StackStep) -> None:
        self._await(self._submit(step.request, step.prompt))

    def _submit_step(self, step: StackStep) -> None:
        self._submit(step.request, step.prompt)

    def _step(self, step: StackStep) -> None:
        for _ in range(step.count):
            self._step_once()

    def _drain(self, step: StackStep | None) -> None:
        for req in list(self.requests.values()):
            if req.result is None:
                self._await(req)

    def _abort(self, step: StackStep) -> None:
        req = self.requests[step.request]
        if req.result is None:
            self._call(f"abort({req.request.id})", self.bounds.call, self.stack.abort, req.request.id)
            if req.result is None:  # (ended by the abort: its blocks and pins are the stack's to free)
                req.result = StackResult(id=req.request.id, status="aborted")
                self.ended_at[req.rid] = time.monotonic()

    def _evict(self, step: StackStep) -> None:
        wait = store_lag(self.stack) - (time.monotonic() - max(self.ended_at.values(), default=-1e9))
        if wait > 0:  # (what the last requests stored has landed: the eviction removes it for good)
            time.sleep(min(wait, self.bounds.settle))
        key = self._key(step.prompt, step.rank, step.chunk)
        self._call(f"evict(rank {step.rank}, {step.prompt} chunk {step.chunk}, {step.tier})", self.bounds.call,
                   self.stack.evict, step.rank, key, step.tier)
        self.epoch += 1

    def _key(self, prompt_name: str, rank: int, chunk: int) -> str:
        request = self._stack_request(f"evict-{prompt_name}", prompt_name)
        return self._call(f"chunk_keys(rank {rank})", self.bounds.call, self.stack.chunk_keys, rank, request)[chunk]

    def _fault(self, step: StackStep) -> None:
        self._call(f"{step.action} rank {step.rank}'s server", self.bounds.fault, self.stack.fault, step.rank,
                   step.action)
        self.epoch += 1
        try:
            _FAULTED_AT[self.stack] = time.monotonic()
        except TypeError:  # (a stack that takes no weak reference: its faults count within this case only)
            self._faulted_at = time.monotonic()

    # -- the end -----------------------------------------------------------------------------------------------------
    def finish(self) -> list[Violation]:
        """Drain what is in flight, bring every server back, compare every output with the reference's, check the
        leaks once the stack settled."""
        if self.finished:
            return []
        self.finished = True
        before = len(self.violations)
        if self.stuck:
            return []
        try:
            for r in range(self.stack.n_ranks):
                if not self.stack.reachable(r):
                    self._call(f"restore rank {r}'s server", self.bounds.fault, self.stack.fault, r, "resume")
            self._drain(None)
            for req in self.requests.values():
                result = req.result
                if result is not None and result.status == "finished":
                    reference = self._reference(req.request, req.prompt)
                    self.violations.extend(check_output(result, reference, prompt=req.prompt))
            self._check_leaks()
        except Stuck:
            pass
        return self.violations[before:]

    def _last_fault(self) -> float | None:
        try:
            return _FAULTED_AT.get(self.stack, self._faulted_at)
        except TypeError:
            return self._faulted_at

    def _check_leaks(self) -> None:
        t0 = time.monotonic()
        settle = self.bounds.settle
        faulted_at = self._last_fault()
        if faulted_at is not None:  # (work a fault caught, e.g. a save job on a dead server, ends within the window)
            settle = max(settle, recovery_window(self.stack) - (t0 - faulted_at))
        seen: list = []

        def clean() -> bool:
            seen[:] = [self._call("leaks()", self.bounds.call, self.stack.leaks)]
            return not check_leaks(seen[0], when="")
        settle_judged(clean, settle, "the stack's leaks to clear", t0=t0, step=0.1)  # (in the machine's time)
        leaks = seen[0]
        found = check_leaks(leaks, when=f"{settle:.3g} s after every request had ended" + (
            "" if settle == self.bounds.settle else
            f" (the end of the stack's {recovery_window(self.stack):g} s recovery window after a fault)"))
        self._event(None, text="leaks", leaks=leaks)
        self.violations.extend(found)


def reset_stack(stack: Any) -> None:
    """Empty the stack for a fresh case: the harness's own work, within `--setup-timeout` (`SetupTimeout`)."""
    seconds = starvation.setup_timeout()
    try:
        call_bounded(seconds, "reset", "", stack.reset)
    except StoreCallTimeout as exc:
        raise SetupTimeout(f"emptying the stack for a fresh case (the harness's own work) did not finish within "
                           f"--setup-timeout {over_text(seconds, exc.waited)}") from None


def run_stack_case(stack: Any, case: StackCase, *, bounds: StackBounds = StackBounds(), salt: str | None = None,
                   references: References | None = None, stop_at_first: bool = True) -> EngineOutcome:
    """The whole case on `stack`, emptied first: every step, then `finish`. With `stop_at_first`, the steps stop at
    the first violation. `salt` (default: a fresh one) gives the run its own token space and request ids. A run the
    machine starved (`model.timing.HarnessOutcome`) runs again, under a salt of its own, and the last one propagates."""
    salt = f"{uuid.uuid4().hex[:8]}-" if salt is None else salt
    attempt = [0]

    def once() -> EngineOutcome:
        attempt[0] += 1
        return _run_stack_once(stack, case, bounds, salt if attempt[0] == 1 else f"{salt}a{attempt[0]}-", references,
                               stop_at_first)
    return rerun_starved(once)


def _run_stack_once(stack: Any, case: StackCase, bounds: StackBounds, salt: str, references: References | None,
                    stop_at_first: bool) -> EngineOutcome:
    t0 = time.monotonic()
    reset_stack(stack)
    run = StackRun(stack, case, bounds, salt, references)
    try:
        for step in case.steps:
            if run.apply(step) and stop_at_first:
                break
    except HarnessOutcome:
        run.stuck = True
        raise
    finally:
        run.finish()
    return EngineOutcome(case, run.violations, run.events, round(time.monotonic() - t0, 3))  # type: ignore[arg-type]
