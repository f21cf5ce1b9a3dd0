"""The interpreter of engine steps: a case's steps run on a real deployment in vLLM's order, every call bounded.

`EngineRun(deployment, case)` applies one `model.engine_case.Step` at a time (`apply`) and ends with `finish()`;
`run_engine_case(make, case)` does the whole case on a fresh deployment. What vLLM's LMCache integration calls,
in its order:

- `store`: every rank of the prompt's deployment stores the prompt's KV (its own shard: `model.engine_oracle.kv_bytes`);
- `lookup` (the scheduler's `get_num_new_matched_tokens`): `lookup_cache(id)`; on -1 `lookup(tokens, id, configs)`;
  then `lookup_cache` again until an answer (async), within the engine's lookup timeout plus a margin; then
  `clear_lookup_status` if the request is scheduled (`update_state_after_alloc`); `wait=False` leaves it in flight;
- `retrieve` (`start_load_kv`): every rank retrieves the planned prefix, and a sync engine unpins at once;
- `end` (`wait_for_save`): every rank's `lookup_unpin`;
- `evict`, `fault`: a chunk out of a tier; a rank's server paused, resumed, killed, restarted.

Around each lookup every rank's holdings of the request's chunk keys are observed (before and after), so the
oracle (`model.engine_oracle`) judges the answer against what was held at the lookup. A call that does not
return within its bound, or raises, is an `engine-returns` violation, and the run stops driving the deployment
(a stuck scheduler or worker serves nobody) and goes to `finish`, which ends every open request, resumes every
server, waits for the ranks to settle, checks the pins, records what the deployment counted of its own paths (its
optional `facts()`, in the last event: `facts`) and closes the deployment (bounded too).
"""
from __future__ import annotations

import contextlib
import threading
import time
import uuid
from typing import Any, Callable

import attrs

from model.contract import EngineRequest, StoreCallTimeout
from model.engine_case import EngineCase, EnginePrompt, Step, kv_identity, prompt_tokens
from model.engine_oracle import Ledger, RankView, check_lookup, check_pins, check_retrieve, kv_bytes, prefix, \
    returns_violation
from model.faults import held_kind
from model.outcome import Violation
from model.timing import HarnessOutcome, SetupTimeout, over_text, overran, rerun_starved, settle_judged, \
    wait_judged
from runtime import starvation
from runtime.bounded import call_bounded

__all__ = ["Bounds", "EngineRun", "EngineOutcome", "run_engine_case", "build_deployment", "Stuck"]


@attrs.frozen
class Bounds:
    """Seconds each call may take: a plain call; a lookup (the engine's own lookup timeout plus `lookup_margin`);
    a store (with its remote writes), a retrieve, the whole close; the settling before the last pin check (at least
    `settle`, then until no pin is left or `settle_max`: a prefetch waiting on a slow server releases late)."""

    call: float = 2.0
    lookup_margin: float = 2.0
    store: float = 5.0
    retrieve: float = 5.0
    close: float = 2.0
    settle: float = 0.3
    settle_max: float = 3.0


class Stuck(Exception):
    """A call did not return (or raised): the run stops driving the deployment."""


@attrs.define
class _Request:
    prompt: EnginePrompt
    engine: EngineRequest
    keys: list[list[str]] | None = None
    in_flight: bool = False
    issued_epoch: int = 0
    issued_at: float = 0.0
    before: list[tuple[list[bool], list[bool] | None]] | None = None
    fresh: bool = False
    answer: int | None = None
    answer_epoch: int = 0
    cached: int | None = None
    ended: bool = False
    retrieved: bool = False


@attrs.define
class EngineOutcome:
    """What one case produced: its violations (step ones first), the events of every step, and the seconds."""

    case: EngineCase
    violations: list[Violation]
    events: list[dict]
    seconds: float

    def violated(self) -> list[str]:
        return sorted({v.property for v in self.violations})


class EngineRun:
    """One case on one deployment (see the module docstring)."""

    def __init__(self, deployment: Any, case: EngineCase, bounds: Bounds = Bounds(), salt: str = "") -> None:
        self.dep, self.case, self.bounds, self.salt = deployment, case, bounds, salt
        self.ledger = Ledger()
        self.events: list[dict] = []
        self.violations: list[Violation] = []
        self.requests: dict[str, _Request] = {}
        self.epoch = 0
        self.stores = 0
        self.stuck = False
        self.finished = False

    # -- calls -----------------------------------------------------------------------------------------------------
    def _call(self, what: str, seconds: float, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return call_bounded(seconds, what, "", fn, *args)
        except StoreCallTimeout as exc:
            self._returns(what, f"did not return within {over_text(seconds, exc.waited)}")
        except Exception as exc:  # noqa: BLE001 - a call that raises is the outcome `engine-returns`
            self._returns(what, f"raised {type(exc).__name__}: {exc}")

    def _returns(self, what: str, problem: str) -> None:
        self.violations.append(returns_violation(what, problem))
        self.stuck = True
        raise Stuck(what)

    def _event(self, step: Step | None, **what: Any) -> dict:
        text = what.pop("text", "")
        event = {"i": len(self.events), "step": step.to_json() if step else None,
                 "text": step.describe() if step else text, **what}
        self.events.append(event)
        return event

    # -- requests ----------------------------------------------------------------------------------------------------
    def _engine_request(self, prompt: EnginePrompt, rid: str) -> EngineRequest:
        return EngineRequest(id=rid, tokens=prompt_tokens(self.case, prompt, self.dep.chunk_size, self.salt),
                             tenant=prompt.tenant, adapter=prompt.adapter, image=prompt.image)

    def _keys(self, req: _Request) -> list[list[str]]:
        if req.keys is None:
            d = req.prompt.deployment
            req.keys = [list(self._call(f"chunk_keys(rank {r})", self.bounds.call, self.dep.chunk_keys, d, r,
                                        req.engine)) for r in range(self.dep.n_ranks)]
        return req.keys

    def _observe(self, req: _Request) -> list[tuple[list[bool], list[bool] | None]]:
        d = req.prompt.deployment
        return [self._call(f"holdings(rank {r})", self.bounds.call, self.dep.holdings, d, r, keys)
                for r, keys in enumerate(self._keys(req))]

    def _views(self, req: _Request, after: list) -> list[RankView]:
        views = []
        for r, keys in enumerate(self._keys(req)):
            identities = [kv_identity(self.case, req.prompt, c) for c in range(len(keys))]
            seen = []
            observations = ((req.before or after)[r], after[r])
            for local, remote in observations:
                seen.append([local[c] or bool(remote and remote[c]) for c in range(len(keys))])
            unknown = any(remote is None for _, remote in observations)
            written = [self.ledger.maybe_remote(r, k) for k in keys]
            hi_any = [a or b or (unknown and w) for a, b, w in zip(seen[0], seen[1], written)]
            lo = [a and b for a, b in zip(*seen)]
            own = [identities[c] in self.ledger.identities(r, k) for c, k in enumerate(keys)]
            views.append(RankView(own_lo=prefix([x and o for x, o in zip(lo, own)]),
                                  own_hi=prefix([x and o for x, o in zip(hi_any, own)]),
                                  any_hi=prefix(hi_any), unknown=unknown))
        return views

    # -- steps -------------------------------------------------------------------------------------------------------
    def apply(self, step: Step) -> list[Violation]:
        """Run one step; the violations it showed (the run stops driving the deployment after `engine-returns`)."""
        if self.stuck or self.finished:
            return []
        before = len(self.violations)
        t0 = time.monotonic()
        try:
            getattr(self, f"_{step.kind}")(step)
        except Stuck:
            self._event(step, stuck=True)
        if self.events and self.events[-1].get("step") == step.to_json():
            self.events[-1]["seconds"] = round(time.monotonic() - t0, 4)
        return self.violations[before:]

    def _store(self, step: Step) -> None:
        prompt = self.case.prompt(step.prompt)
        self.stores += 1
        req = self._engine_request(prompt, f"store-{self.stores}-{prompt.name}")
        d = prompt.deployment
        for r in range(self.dep.n_ranks):
            kv = [kv_bytes(kv_identity(self.case, prompt, c), r, c, self.dep.n_ranks, self.dep.chunk_bytes)
                  for c in range(prompt.chunks)]
            keys = self._call(f"chunk_keys(rank {r})", self.bounds.call, self.dep.chunk_keys, d, r, req)
            self._call(f"rank {r}: store({prompt.name})", self.bounds.store, self.dep.store, d, r, req, kv)
            self.ledger.stored(r, keys, [kv_identity(self.case, prompt, c) for c in range(prompt.chunks)], kv,
                               prompt.name)
        self._event(step)

    def _evict(self, step: Step) -> None:
        """A chunk out of a tier, as the tier's own eviction would take it: the rank's server (its LRU, any key)
        loses just that chunk; LocalCPU's LRU takes a prompt's chunks suffix first (every lookup touches them in
        reverse, `LocalCPUBackend.touch_cache`), so a local eviction takes the chunk and every later one."""
        prompt = self.case.prompt(step.prompt)
        req = self._engine_request(prompt, f"evict-{prompt.name}")
        d = prompt.deployment
        if step.tier in ("local", "both"):
            for c in range(step.chunk, prompt.chunks):
                self._call(f"rank {step.rank}: evict({prompt.name} chunk {c}, local)", self.bounds.call,
                           self.dep.evict, d, step.rank, req, c, "local")
        if step.tier in ("remote", "both"):
            self._call(f"rank {step.rank}: evict({prompt.name} chunk {step.chunk}, remote)", self.bounds.call,
                       self.dep.evict, d, step.rank, req, step.chunk, "remote")
            if self.dep.reachable(step.rank):
                keys = self._call(f"chunk_keys(rank {step.rank})", self.bounds.call, self.dep.chunk_keys, d,
                                  step.rank, req)
                self.ledger.evicted_remote(step.rank, keys[step.chunk])
        self.epoch += 1
        self._event(step)

    def _fault(self, step: Step) -> None:
        self._call(f"{step.action} rank {step.rank}'s server", self.bounds.store, self.dep.fault, step.rank, step.action)
        if held_kind(step.action).loses == "all":  # (kill, restart: the held form of a restart empty)
            self.ledger.server_lost(step.rank)
        self.epoch += 1
        self._event(step)

    def _lookup(self, step: Step) -> None:
        prompt = self.case.prompt(step.prompt)
        req = self.requests.get(step.request)
        if req is None or req.ended:
            req = self.requests[step.request] = _Request(prompt, self._engine_request(prompt, step.request))
        if not req.in_flight:
            req.before = self._observe(req)
            req.issued_epoch, req.issued_at, req.fresh = self.epoch, time.monotonic(), False
            req.in_flight = True
        if step.wait:
            self._poll_until_answer(step, req)
            return
        got = self._matched(req)
        if got is not None:
            self._answered(step, req, got)
        else:
            self._event(step, answer=None, in_flight=True)

    def _matched(self, req: _Request) -> int | None:
        """One `get_num_new_matched_tokens` of vLLM's scheduler: the cached status, or (on -1) a lookup."""
        d = req.prompt.deployment
        got = self._call(f"lookup_cache({req.engine.id})", self.bounds.call, self.dep.lookup_cache, d, req.engine)
        if got == -1:
            req.fresh = True
            got = self._call(f"lookup({req.engine.id})", self.dep.lookup_timeout + self.bounds.lookup_margin,
                             self.dep.lookup, d, req.engine)
        return got

    def _poll(self, step: Step) -> None:
        req = self.requests[step.request]
        if req.in_flight:
            self._poll_until_answer(step, req)
        elif req.cached is None:  # vLLM asks nothing more about a request it scheduled
            self._event(step, skipped="the request was scheduled")
        else:  # vLLM asks again about a request it could not schedule yet
            self._answered(step, req, self._matched(req))

    def _poll_until_answer(self, step: Step | None, req: _Request) -> None:
        """vLLM's scheduler asks again at every step until the lookup answers (each ask bounded, the whole within
        the engine's lookup timeout plus a margin)."""
        limit = self.dep.lookup_timeout + self.bounds.lookup_margin
        while True:
            got = self._matched(req)
            if got is not None:
                self._answered(step, req, got)
                return
            over = overran(limit, req.issued_at, time.monotonic(), f"the lookup of {req.engine.id}")
            if over is not None:
                self._returns(f"the lookup of {req.engine.id}", f"had no answer within {over} after it was issued "
                              "(lookup_cache kept answering 'in flight')")
            time.sleep(0.001)

    def _answered(self, step: Step | None, req: _Request, got: Any) -> None:
        req.in_flight = False
        after = self._observe(req)
        views = self._views(req, after)
        failed = ""
        if self.epoch != req.issued_epoch:
            failed = "a fault or an eviction during the lookup"
        elif not all(self.dep.reachable(r) for r in range(self.dep.n_ranks)) or any(v.unknown for v in views):
            failed = "a server could not be reached"
        legit_cache = not req.fresh and req.cached is not None and got == req.cached
        found: list[Violation] = []
        if not legit_cache:
            found = check_lookup(got, views, self.dep.chunk_size, failed=failed if req.fresh else "the answer came "
                                 "from lookup_cache", request=req.engine.id, prompt=req.prompt.name)
        self.violations.extend(found)
        req.answer, req.answer_epoch, req.retrieved = got, self.epoch, False
        scheduled = step is None or step.scheduled
        if scheduled:
            self._call(f"clear_lookup_status({req.engine.id})", self.bounds.call, self.dep.clear_lookup_status,
                       req.prompt.deployment, req.engine)
        req.cached = None if scheduled else got
        self._event(step, text=f"answer of {req.engine.id}", answer=got, fresh=req.fresh, failed=failed,
                    views=[attrs.asdict(v) for v in views], seconds_since_issue=round(time.monotonic() - req.issued_at, 4))

    def _retrieve(self, step: Step) -> None:
        req = self.requests[step.request]
        if req.ended or req.retrieved or req.in_flight or req.cached is not None or not isinstance(req.answer, int) \
                or req.answer <= 0:
            why = ("the request ended" if req.ended else "loaded already (vLLM loads a request once per lookup)"
                   if req.retrieved else "not scheduled (vLLM loads scheduled requests only)"
                   if req.cached is not None else "no planned tokens (vLLM loads nothing)")
            self._event(step, skipped=why)
            return
        req.retrieved = True
        d, planned = req.prompt.deployment, req.answer // self.dep.chunk_size
        disturbed = ("a fault or an eviction since the lookup" if self.epoch != req.answer_epoch else
                     "" if all(self.dep.reachable(r) for r in range(self.dep.n_ranks)) else "a server is down")
        ranks = []
        for r in range(self.dep.n_ranks):
            got = self._call(f"rank {r}: retrieve({req.engine.id})", self.bounds.retrieve, self.dep.retrieve, d, r,
                             req.engine, req.answer)
            expected = [kv_bytes(kv_identity(self.case, req.prompt, c), r, c, self.dep.n_ranks, self.dep.chunk_bytes)
                        for c in range(planned)]
            found = check_retrieve(r, planned, got, expected, self.ledger, chunk_size=self.dep.chunk_size,
                                   disturbed=disturbed, request=req.engine.id, prompt=req.prompt.name)
            self.violations.extend(found)
            ranks.append({"retrieved": getattr(got, "retrieved", None), "freed": len(getattr(got, "freed", []) or []),
                          "ok": not found})
            if self.dep.lookup_mode == "sync":  # start_load_kv releases a sync request's pins right after its load
                self._call(f"rank {r}: lookup_unpin({req.engine.id})", self.bounds.call, self.dep.lookup_unpin, d, r,
                           req.engine)
        self._event(step, planned=planned, disturbed=disturbed, ranks=ranks)

    def _end(self, step: Step | None, req: _Request | None = None) -> None:
        req = req or self.requests[step.request]  # type: ignore[union-attr]
        for r in range(self.dep.n_ranks):
            self._call(f"rank {r}: lookup_unpin({req.engine.id})", self.bounds.call, self.dep.lookup_unpin,
                       req.prompt.deployment, r, req.engine)
        req.ended = True
        if step is not None:
            self._event(step)

    def _pins(self, d: int) -> list[int]:
        return [self._call(f"pins(rank {r})", self.bounds.call, self.dep.pins, d, r) for r in range(self.dep.n_ranks)]

    def _check_pins(self, when: str) -> None:
        for d in range(self.dep.deployments):
            self.violations.extend(check_pins(self._pins(d), when=when, deployment=d))

    def _facts(self) -> dict[str, int]:
        """The deployment's `facts()` (optional: what the engine counted of what it did), or {}."""
        if not callable(getattr(self.dep, "facts", None)):
            return {}
        return dict(self._call("facts()", self.bounds.call, self.dep.facts) or {})

    # -- the end -----------------------------------------------------------------------------------------------------
    def finish(self) -> list[Violation]:
        """End the case as vLLM ends every request: answer the lookups in flight, end every open request, resume
        every server, let the ranks settle, check the pins; then close the deployment (bounded)."""
        if self.finished:
            return []
        self.finished = True
        before = len(self.violations)
        facts: dict[str, int] = {}
        starved: HarnessOutcome | None = None
        if not self.stuck:
            try:
                for req in self.requests.values():
                    if req.in_flight:
                        self._poll_until_answer(None, req)
                for req in self.requests.values():
                    if not req.ended:
                        self._end(None, req)
                if getattr(self.dep, "faults", None) is not None:
                    for r in range(self.dep.n_ranks):
                        if not self.dep.reachable(r):
                            self._call(f"restore rank {r}'s server", self.bounds.store, self.dep.fault, r,
                                       "restart" if r in getattr(self.dep.faults, "down", ()) else "resume")
                t0 = time.monotonic()
                time.sleep(self.bounds.settle)  # a late lookup still running takes (and should release) its pins
                settle_judged(lambda: not any(any(self._pins(d)) for d in range(self.dep.deployments)),
                              self.bounds.settle_max, "the ranks' pins to be released", t0=t0)
                self._check_pins(f"{self.bounds.settle_max:g} s after every request had ended and every server "
                                 "was back")
                facts = self._facts()
            except Stuck:
                pass
            except HarnessOutcome as exc:  # (the machine kept the ranks from settling: closed, then not judged)
                starved = exc
        self._event(None, text="close", **({"facts": facts} if facts else {}))
        try:
            errors = call_bounded(self.bounds.close + 2.0, "close", "", self.dep.close)
        except StoreCallTimeout as exc:
            errors = [f"close() did not return within {over_text(self.bounds.close + 2.0, exc.waited)}"]
        except Exception as exc:  # noqa: BLE001 - reported
            errors = [f"close() raised {type(exc).__name__}: {exc}"]
        for e in errors or []:
            self.violations.append(returns_violation("close", e))
        if starved is not None:
            raise starved
        return self.violations[before:]


def run_engine_case(make: Callable[[EngineCase], Any], case: EngineCase, *, bounds: Bounds = Bounds(),
                    salt: str | None = None, stop_at_first: bool = True) -> EngineOutcome:
    """The whole case on a fresh deployment `make(case)`: every step, then `finish`. With `stop_at_first`, the steps
    stop at the first violation (the rest of the case would only show its echoes). `salt` (default: a fresh one)
    gives the run its own token space: a tier shared with earlier runs (`urls`) never holds its chunks. Building the
    deployment is the harness's work, bounded by `--setup-timeout` (`SetupTimeout`, never a property); a run the
    machine starved (`model.timing.HarnessOutcome`) runs again on a fresh deployment, and the last one propagates."""
    salt = f"{uuid.uuid4().hex[:8]}-" if salt is None else salt
    attempt = [0]

    def once() -> EngineOutcome:
        attempt[0] += 1
        return _run_once(make, case, bounds, salt if attempt[0] == 1 else f"{salt}a{attempt[0]}-", stop_at_first)
    return rerun_starved(once)


def _run_once(make: Callable[[EngineCase], Any], case: EngineCase, bounds: Bounds, salt: str,
              stop_at_first: bool) -> EngineOutcome:
    t0 = time.monotonic()
    dep = build_deployment(make, case)
    if hasattr(dep, "close_timeout"):  # (optional member: how long the deployment's close waits for the engine's)
        dep.close_timeout = bounds.close
    run = EngineRun(dep, case, bounds, salt)
    try:
        for step in case.steps:
            if run.apply(step) and stop_at_first:
                break
    except HarnessOutcome:
        run.stuck = True  # nothing more is asked of the deployment: it is only closed
        raise
    finally:
        run.finish()
    return EngineOutcome(case, run.violations, run.events, round(time.monotonic() - t0, 3))


def build_deployment(make: Callable[[EngineCase], Any], case: EngineCase) -> Any:
    """`make(case)` within `--setup-timeout` (`runtime.starvation.setup_timeout`, judged as every timing is): the
    deployment, or `SetupTimeout`. A deployment that arrives after the harness gave up on it is closed."""
    seconds = starvation.setup_timeout()
    box: list = []
    done, lock, gave_up = threading.Event(), threading.Lock(), [False]

    def build() -> None:
        try:
            got = (True, make(case))
        except BaseException as exc:  # handed to the caller, who re-raises it
            got = (False, exc)
        with lock:
            late = gave_up[0]
            box.append(got)
            done.set()
        if late and got[0]:
            with contextlib.suppress(Exception):
                got[1].close()

    def give_up() -> bool:
        """True: the build is abandoned (closed when it arrives); False: it arrived meanwhile."""
        with lock:
            gave_up[0] = not done.is_set()
            return gave_up[0]

    threading.Thread(target=build, name="shardcheck-build-deployment", daemon=True).start()
    try:
        waited = wait_judged(done.wait, seconds, "building the deployment")
    except BaseException:
        if not give_up() and box[0][0]:
            with contextlib.suppress(Exception):
                box[0][1].close()
        raise
    if waited is not None and give_up():
        raise SetupTimeout(f"building the deployment (the harness's own work, not the engine's) did not finish within "
                           f"--setup-timeout {over_text(seconds, waited)}; give a longer --setup-timeout on a slow "
                           "or loaded machine")
    ok, value = box[0]
    if not ok:
        raise value
    return value
