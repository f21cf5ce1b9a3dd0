"""Racy findings: searched for, judged by their rate, minimised, written and replayed as `concurrent` traces.

A race shows in some runs of a layout and not in others, so a finding records `k` of `n` runs. With the
recorded rate `p = k / n`, at 99% confidence:

- `tries_to_reproduce(k, n)`: the runs after which a bug still at rate `p` has shown at least once
  (`(1 - p)^N <= 0.01`);
- `tries_to_clear(k, n)`: the clean runs after which the rate is below `p / 10` (`(1 - p/10)^M <= 0.01`).

`replay` runs a trace's layout up to `tries_to_clear` times: `reproduces` as soon as the trace's property
shows, `fixed` only after that many clean runs.
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable

import attrs

from engines.concurrency import Layout, Rate, Target, make_layout, measure, thread_safe
from model.contract import declared_paths
from model.history import lanes
from runtime.tier import SHARED_CLIENTS, NotShared, open_shared
from model.trace import Trace

__all__ = ["CONFIDENCE", "tries_to_reproduce", "tries_to_clear", "minimise", "to_trace", "replay", "search",
           "fresh_target", "needs_shared", "targets"]

CONFIDENCE = 0.99
#: The most runs a minimisation step spends on one candidate.
MAX_CANDIDATE_RUNS = 20


def tries_to_reproduce(k: int, n: int, *, confidence: float = CONFIDENCE) -> int:
    """Runs within which a bug of rate k/n shows at least once with probability `confidence`."""
    p = k / n
    if p >= 1.0:
        return 1
    return max(1, math.ceil(math.log(1 - confidence) / math.log(1 - p)))


def tries_to_clear(k: int, n: int, *, confidence: float = CONFIDENCE) -> int:
    """Clean runs after which the rate is below a tenth of k/n with `confidence`."""
    p = k / n / 10
    return max(1, math.ceil(math.log(1 - confidence) / math.log(1 - p)))


def fresh_target(made: Any) -> Target:
    """What a maker of fresh stores made, as a `Target`: a `Target` (several clients of one server), or a list of
    rank stores whose first one is run (all closed with it)."""
    if isinstance(made, Target):
        return made
    return Target([made[0]], closer=lambda: [s.close() for s in made])


def _on(store: Any, fresh: Callable[[], Any] | None, layout: Layout, **kw: Any) -> Rate:
    """`measure` on `store`, or on a fresh target of `fresh()` (closed afterwards): a store that earlier runs
    wedged makes every later layout fail, and a replay starts from a fresh store."""
    if fresh is None:
        return measure(store, layout, **kw)
    target = fresh_target(fresh())
    try:
        return measure(target, layout, **kw)
    finally:
        target.close()


def minimise(store: Any, layout: Layout, want: str, rate: Rate, *, bound: float,
             should_stop: Callable[[], bool], fresh: Callable[[], list] | None = None) -> Layout:
    """Fewest threads, then fewest ops, then the shortest values, keeping the `want` violation showing within
    the runs its recorded rate needs (at most `MAX_CANDIDATE_RUNS` per candidate), each candidate on a fresh
    store when `fresh` makes them."""
    runs = min(MAX_CANDIDATE_RUNS, tries_to_reproduce(rate.k, rate.n))

    def fails(candidate: Layout) -> bool:
        return _on(store, fresh, candidate, runs=runs, bound=bound, want=want, should_stop=should_stop,
                   first_only=True).k > 0

    current = layout
    for t in reversed(range(len(current.threads))):  # fewest threads
        if should_stop() or len(current.threads) == 1:
            break
        if t < len(current.threads):
            candidate = attrs.evolve(current, threads=current.threads[:t] + current.threads[t + 1:])
            if fails(candidate):
                current = candidate
    changed = True
    while changed and not should_stop():  # fewest ops: single-op removals until none can go
        changed = False
        flat = current.to_ops()
        for j in reversed(range(len(flat))):
            if should_stop():
                return current
            if len(flat) == 1:
                break
            candidate = Layout.from_ops(flat[:j] + flat[j + 1:], seed=current.seed)
            if fails(candidate):
                current, flat, changed = candidate, candidate.to_ops(), True
    pad = max((int(op.get("pad", 0)) for t in current.threads for op in t), default=0)
    while pad > 0 and not should_stop():  # shortest values
        pad //= 2
        candidate = attrs.evolve(current, threads=[[{**op, "pad": pad} if "pad" in op else op for op in t]
                                                   for t in current.threads])
        if not fails(candidate):
            break
        current = candidate
    return current


def to_trace(layout: Layout, rate: Rate, *, client: str, bound: float, seeds: list[int], origin: str,
             options: dict | None = None, clients: int = 1) -> Trace:
    """The `concurrent` trace of a finding: the layout, its measured rate, the first failing run's history."""
    first = rate.first
    assert first is not None, "a finding has a failing run"
    v = first.violations[0]
    summary = (f"{v['summary']} -- in {rate.k} of {rate.n} runs of {len(layout.threads)} caller thread(s), "
               f"{layout.n_ops} ops")
    return Trace(kind="concurrent", property=v["property"], summary=summary, protocol={"name": "-", "ref": None},
                 client=client, ops=layout.to_ops(),
                 config={"n_ranks": 1, "threads": len(layout.threads), "bound": bound,
                         "rate": {"k": rate.k, "n": rate.n, "seeds": list(seeds)},
                         **({"clients": clients} if clients > 1 else {}), **(options or {})},
                 verdict={"violations": [{"property": x["property"], "summary": x["summary"], "detail": {"op": x["op"]}}
                                         for x in first.violations],
                          "linearizability": first.verdict, "history": first.history.to_json(),
                          "picture": lanes(first.history, verdict=first.verdict)},
                 expect={client: "reproduces"}, origin=origin)


def needs_shared(trace: Trace) -> bool:
    """Whether a concurrent trace runs several clients of the same server, or the server's own evictions."""
    return int(trace.config.get("clients", 1)) > 1 or any(op.get("path") == "evict" for op in trace.ops)


def replay(trace: Trace, factory: Callable[..., list], *, options: dict | None = None,
           shared: Callable[[int], Target] | None = None) -> tuple[str, str]:
    """Judge a concurrent trace statistically on a fresh store of `factory` (see the module docstring), or, for a
    trace of several clients of one server (`needs_shared`), on a fresh `shared(clients)` target."""
    rate = trace.config["rate"]
    k, n = int(rate["k"]), int(rate["n"])
    need, clear = tries_to_reproduce(k, n), tries_to_clear(k, n)
    layout = Layout.from_ops(trace.ops)
    bound = float(trace.config.get("bound", 2.0))
    if needs_shared(trace):
        if shared is None:
            raise ValueError("the trace runs several clients of the same server; this client makes one")
        target = shared(int(trace.config.get("clients", 2)))
        if any(op.get("path") == "evict" for op in trace.ops) and target.evict is None:
            target.close()
            raise ValueError("the trace has the server's own evictions; these servers cannot evict by themselves")
    else:
        target = fresh_target(factory(1, **(options or {})))
    try:
        missing = sorted({op["path"] for op in trace.ops if op["path"] != "evict"
                          and not callable(getattr(target.clients[int(op.get("client", 0))], op["path"], None))})
        if missing:  # nothing to run: the race lives on a path this client does not offer
            return "fixed", f"the client offers no {', '.join(missing)}: the layout cannot run on it"
        for i in range(clear):
            got = measure(target, layout, runs=1, bound=bound, want=trace.property)
            if got.k:
                return "reproduces", (f"run {i + 1} (recorded {k}/{n}: within {need} runs at 99%): "
                                      f"{got.first.violations[0]['summary']}")
    finally:
        target.close()
    return "fixed", f"{clear} clean runs: the rate is below a tenth of the recorded {k}/{n} (99%)"


def targets(client: Any, **options: Any) -> tuple[Callable[[], Target], str]:
    """A maker of fresh targets of `client` (a `runtime.registry.Client`) and a note: two clients of the same
    server (`runtime.tier.open_shared`) and '' when the client can share servers, else one store and why not."""
    if not client.takes_urls():
        return (lambda: fresh_target(client.stores(1, **options))), NotShared.reason(client)

    def shared(clients: int = SHARED_CLIENTS) -> Target:
        return Target.shared(open_shared(client, 1, clients=clients, **options))
    return shared, ""


def search(store: Any, *, client: str, seed: int, should_stop: Callable[[], bool], bound: float,
           stats: dict, runs_per_layout: int = 3, measure_runs: int = 20,
           minimise_stop: Callable[[], bool] | None = None, fresh: Callable[[], list] | None = None) -> Trace | None:
    """Seeded layouts over the store's declared paths, growing in threads and ops, until a run shows a
    violation or `should_stop()`. With `fresh` (a maker of fresh stores), a finding must show again on a fresh
    store (else the search goes on: it came from what earlier layouts left behind), and is minimised and
    measured on fresh stores, as a replay runs it; it is returned as a trace."""
    target = Target.of(store)
    if not thread_safe(target.clients[0]):
        stats["concurrency"] = "skipped: the client declares thread_safe = False"
        return None
    paths = declared_paths(target.clients[0])
    sizes = [(2, 4, 2), (3, 6, 2), (4, 8, 3), (6, 8, 3), (8, 10, 4), (8, 16, 6)]
    i = layouts = total = stale = 0
    while not should_stop():
        threads, ops, keys = sizes[min(i // 4, len(sizes) - 1)]
        layout = make_layout(seed + i, threads=threads, ops=ops, keys=keys, paths=paths,
                             clients=len(target.clients), evictions=target.evict is not None)
        i += 1
        layouts += 1
        rate = measure(store, layout, runs=runs_per_layout, bound=bound, should_stop=should_stop)
        total += rate.n
        stats["concurrency"] = {"layouts": layouts, "runs": total, "paths": list(paths), "not_on_a_fresh_store": stale}
        if not rate.k:
            continue
        want = rate.first.violations[0]["property"]
        stop = minimise_stop or should_stop
        t0 = time.monotonic()
        if fresh is not None:
            rate = _on(store, fresh, layout, runs=measure_runs, bound=bound, want=want, should_stop=stop)
            if not rate.k:
                stale += 1
                stats["concurrency"]["not_on_a_fresh_store"] = stale
                continue
        small = minimise(store, layout, want, rate, bound=bound, should_stop=stop, fresh=fresh)
        final = _on(store, fresh, small, runs=measure_runs, bound=bound, want=want, should_stop=stop)
        if not final.k:  # the minimised layout lost its rate before we could measure it: keep the original
            small, final = layout, rate
        stats["concurrency"].update(found=want, minimise_seconds=round(time.monotonic() - t0, 3),
                                    rate=[final.k, final.n])
        return to_trace(small, final, client=client, bound=bound, seeds=[layout.seed], origin="check:concurrency",
                        clients=len(target.clients))
    return None
