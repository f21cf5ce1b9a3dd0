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
from typing import Any, Callable, Sequence

import attrs

from engines.concurrency import Layout, Rate, make_layout, measure, store_paths, thread_safe
from model.faults import kind_of
from model.history import lanes
from model.trace import Trace

__all__ = ["CONFIDENCE", "tries_to_reproduce", "tries_to_clear", "minimise", "to_trace", "replay", "search",
           "strikes_of", "nemesis_layout", "nemesis_search", "NEMESIS_RUNS"]

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


def _on(store: Any, fresh: Callable[[], list] | None, layout: Layout, **kw: Any) -> Rate:
    """`measure` on `store`, or on a fresh store of `fresh()` (closed afterwards): a store that earlier runs
    wedged makes every later layout fail, and a replay starts from a fresh store."""
    if fresh is None:
        return measure(store, layout, **kw)
    stores = fresh()
    try:
        return measure(stores[0], layout, **kw)
    finally:
        for s in stores:
            s.close()


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
             options: dict | None = None, strikes: Sequence[tuple[Any, Any]] = ()) -> Trace:
    """The `concurrent` trace of a finding: the layout, its measured rate, the first failing run's history, and the
    real-server faults each run struck (`config.faults`: `{"fault", "rank", "at": "run", "step", "seconds"}`)."""
    first = rate.first
    assert first is not None, "a finding has a failing run"
    v = first.violations[0]
    summary = (f"{v['summary']} -- in {rate.k} of {rate.n} runs of {len(layout.threads)} caller thread(s), "
               f"{layout.n_ops} ops")
    return Trace(kind="concurrent", property=v["property"], summary=summary, protocol={"name": "-", "ref": None},
                 client=client, ops=layout.to_ops(),
                 config={"n_ranks": 1, "threads": len(layout.threads), "bound": bound,
                         "rate": {"k": rate.k, "n": rate.n, "seeds": list(seeds)}, **(options or {}),
                         **({"faults": [{"fault": k.field, **k.to_json(f)} for k, f in strikes]} if strikes else {})},
                 verdict={"violations": [{"property": x["property"], "summary": x["summary"], "detail": {"op": x["op"]}}
                                         for x in first.violations],
                          "linearizability": first.verdict, "history": first.history.to_json(),
                          **({"faults": first.history.faults} if first.history.faults else {}),
                          "picture": lanes(first.history, verdict=first.verdict)},
                 expect={client: "reproduces"}, origin=origin)


def strikes_of(config: dict) -> list[tuple[Any, Any]]:
    """The (kind, `ServerFault`) pairs a concurrent trace's runs strike (`config.faults`); `ValueError` naming a bad
    entry."""
    out = []
    for i, raw in enumerate(config.get("faults", [])):
        if not isinstance(raw, dict):
            raise ValueError(f"config.faults[{i}]: expected an object")
        try:
            kind = kind_of(str(raw.get("fault")))
        except KeyError:
            raise ValueError(f"config.faults[{i}]: unknown fault {raw.get('fault')!r}") from None
        if kind.family != "server":
            raise ValueError(f"config.faults[{i}]: {kind.field} is not a real-server fault")
        out.append((kind, kind.from_json({k: v for k, v in raw.items() if k != "fault"})))
    return out


def replay(trace: Trace, factory: Callable[..., list], *, options: dict | None = None,
           control_for: Callable[..., Any] | None = None) -> tuple[str, str]:
    """Judge a concurrent trace statistically on a fresh store of `factory` (see the module docstring); its
    real-server faults strike through `control_for(stores)` in every run."""
    rate = trace.config["rate"]
    k, n = int(rate["k"]), int(rate["n"])
    need, clear = tries_to_reproduce(k, n), tries_to_clear(k, n)
    layout = Layout.from_ops(trace.ops)
    bound = float(trace.config.get("bound", 2.0))
    strikes = strikes_of(trace.config)
    if strikes and control_for is None:
        raise ValueError("the trace strikes real-server faults: it needs a nemesis (servers shardcheck started)")
    stores = factory(1, **(options or {}))
    control = control_for(stores) if strikes else None
    try:
        missing = sorted({op["path"] for op in trace.ops if not callable(getattr(stores[0], op["path"], None))})
        if missing:  # nothing to run: the race lives on a path this client does not offer
            return "fixed", f"the client offers no {', '.join(missing)}: the layout cannot run on it"
        for i in range(clear):
            got = measure(stores[0], layout, runs=1, bound=bound, want=trace.property, strikes=strikes,
                          control=control, op_timeout=trace.config.get("op_timeout"),
                          recovery_seconds=trace.config.get("recovery_seconds"))
            if got.k:
                return "reproduces", (f"run {i + 1} (recorded {k}/{n}: within {need} runs at 99%): "
                                      f"{got.first.violations[0]['summary']}")
    finally:
        if control is not None:
            control.close()
        for s in stores:
            s.close()
    return "fixed", f"{clear} clean runs: the rate is below a tenth of the recorded {k}/{n} (99%)"


#: Runs of each kind's faulted layout in `nemesis_search` (each strikes once; a finding is judged by its rate).
NEMESIS_RUNS = 3


def nemesis_layout(kind: Any, seed: int, *, paths: Sequence[str], op_timeout: float) -> tuple[Layout, list, float]:
    """A layout of 3 callers over the declared paths, the fault `kind` on the server at the run's third op, and the
    run's bound (the fault's length plus three op timeouts)."""
    from model.faults import ServerFault
    layout = make_layout(seed, threads=3, ops=6, keys=3, paths=paths)
    seconds = next(kind.singles(1, 1)).seconds and max(0.2, min(3.0, 1.5 * op_timeout))
    return layout, [(kind, ServerFault(0, "run", 2, seconds))], seconds + 3 * op_timeout + 1.0


def nemesis_search(client: Any, *, kinds: Sequence[Any], control_for: Callable[..., Any], seed: int,
                   should_stop: Callable[[], bool], op_timeout: float, stats: dict,
                   recovery_seconds: float | None = None) -> Trace | None:
    """For each kind, `NEMESIS_RUNS` runs of `nemesis_layout` on a fresh store of `client` (a
    `runtime.registry.Client`), each striking the fault; the first kind that shows a violation, as a trace with its
    rate (not minimised: each run costs the fault's length)."""
    for kind in kinds:
        if should_stop():
            break
        stores = client.stores(1, op_timeout=op_timeout)
        control = control_for(stores, kind)
        try:
            if control is None or not thread_safe(stores[0]):
                continue
            layout, strikes, bound = nemesis_layout(kind, seed, paths=store_paths(stores[0]), op_timeout=op_timeout)
            rate = measure(stores[0], layout, runs=NEMESIS_RUNS, bound=bound, strikes=strikes, control=control,
                           should_stop=should_stop, op_timeout=op_timeout, recovery_seconds=recovery_seconds)
        finally:
            if control is not None:
                control.close()
            for s in stores:
                s.close()
        done = stats.setdefault("kinds", {})
        done[kind.field] = [rate.k, rate.n]
        if rate.k:
            return to_trace(layout, rate, client=client.name, bound=bound, seeds=[seed], strikes=strikes,
                            origin=f"nemesis:concurrent:{kind.field}",
                            options={"op_timeout": op_timeout, **({"recovery_seconds": recovery_seconds}
                                                                  if recovery_seconds is not None else {})})
    return None


def search(store: Any, *, client: str, seed: int, should_stop: Callable[[], bool], bound: float,
           stats: dict, runs_per_layout: int = 3, measure_runs: int = 20,
           minimise_stop: Callable[[], bool] | None = None, fresh: Callable[[], list] | None = None) -> Trace | None:
    """Seeded layouts over the store's declared paths, growing in threads and ops, until a run shows a
    violation or `should_stop()`. With `fresh` (a maker of fresh stores), a finding must show again on a fresh
    store (else the search goes on: it came from what earlier layouts left behind), and is minimised and
    measured on fresh stores, as a replay runs it; it is returned as a trace."""
    if not thread_safe(store):
        stats["concurrency"] = "skipped: the client declares thread_safe = False"
        return None
    paths = store_paths(store)
    sizes = [(2, 4, 2), (3, 6, 2), (4, 8, 3), (6, 8, 3), (8, 10, 4), (8, 16, 6)]
    i = layouts = total = stale = 0
    while not should_stop():
        threads, ops, keys = sizes[min(i // 4, len(sizes) - 1)]
        layout = make_layout(seed + i, threads=threads, ops=ops, keys=keys, paths=paths)
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
        return to_trace(small, final, client=client, bound=bound, seeds=[layout.seed], origin="check:concurrency")
    return None
