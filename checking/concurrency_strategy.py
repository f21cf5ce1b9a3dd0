"""The concurrent layer's strategy of `check` (`Concurrency`): racy findings searched for and written as `concurrent`
traces with their measured rate, and their minimiser (`minimised`, which the layer's row runs: `checking.layers`; the
runs themselves: `checking.concurrency`).

A race shows in some runs of a layout and not in others, so a finding records `k` of `n` runs on fresh stores
(`model.finding.Rate`); its replay is judged by that rate (`checking.replay.judge`).
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Iterator, Sequence

import attrs

from checking.api import SearchContext
from checking.concurrency import Measurement, ServerClients, make_layout, measure, thread_safe
from checking.minimise import ddmin, runs_per_candidate
from model.cases import CODECS
from model.concurrent_case import Layout
from model.contract import declared_paths
from model.faults import kind_of
from model.finding import Finding, Rate
from model.history import lanes
from model.outcome import Violation
from model.trace import Trace, violations_of
from runtime.tier import SHARED_CLIENTS, NotShared, open_shared

__all__ = ["minimise", "minimised", "to_trace", "strikes_of", "layout_runs", "search", "Concurrency",
           "ConcurrencyCoverage", "CONCURRENT_BOUND", "CONCURRENT_OP_TIMEOUT", "fresh_target", "needs_shared",
           "targets"]

#: Seconds one run of a layout may take in `check` (a real client gets longer), and the per-call timeout given to a
#: client that bounds its own calls.
CONCURRENT_BOUND = {"in-memory": 1.0, "real": 3.0}
CONCURRENT_OP_TIMEOUT = 1.0


def fresh_target(made: Any) -> ServerClients:
    """What a maker of fresh stores made, as a `ServerClients`: one already (several clients of one server), or a
    list of rank stores whose first one is run (all closed with it)."""
    if isinstance(made, ServerClients):
        return made
    return ServerClients([made[0]], closer=lambda: [s.close() for s in made])


def targets(client: Any, **options: Any) -> tuple[Callable[..., ServerClients], str]:
    """A maker of fresh targets of `client` (a `runtime.registry.Client`; `options`: its factory's) and a note: two
    clients of the same server (`runtime.tier.open_shared`) and '' when the client can share servers, else one
    store and why not."""
    if not client.takes_urls():
        return (lambda *_: fresh_target(client.stores(1, **options))), NotShared.reason(client)

    def shared(clients: int = SHARED_CLIENTS) -> ServerClients:
        return ServerClients.shared(open_shared(client, 1, clients=clients, **options))
    return shared, ""


def needs_shared(trace: Trace) -> bool:
    """Whether a concurrent trace runs several clients of the same server, or the server's own evictions."""
    return int(trace.config.get("clients", 1)) > 1 or any(op.get("path") == "evict" for op in trace.ops)


def _on(store: Any, fresh: Callable[[], Any] | None, layout: Layout, **kw: Any) -> Measurement:
    """`measure` on `store`, or on a fresh target of `fresh()` (closed afterwards): a store that earlier runs
    wedged makes every later layout fail, and a replay starts from a fresh store."""
    if fresh is None:
        return measure(store, layout, **kw)
    target = fresh_target(fresh())
    try:
        return measure(target, layout, **kw)
    finally:
        target.close()


def minimise(store: Any, layout: Layout, want: str, rate: Measurement, *, bound: float,
             should_stop: Callable[[], bool], fresh: Callable[[], list] | None = None) -> Layout:
    """Fewest threads, then fewest ops (delta debugging, `checking.minimise.ddmin`), then the shortest values,
    keeping the `want` violation showing within the runs its recorded rate needs (at most
    `checking.minimise.CANDIDATE_RUNS` per candidate), each candidate on a fresh store when `fresh` makes them."""
    runs = runs_per_candidate("concurrent", rate.k, rate.n)

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
    codec = CODECS["concurrent"]
    ops, _ = ddmin(codec.parts(current), lambda fewer: bool(fewer) and fails(codec.rebuild(current, fewer)),
                   should_stop=should_stop)  # fewest ops
    current = codec.rebuild(current, ops)
    if should_stop():
        return current
    pad = max((int(op.get("pad", 0)) for t in current.threads for op in t), default=0)
    while pad > 0 and not should_stop():  # shortest values
        pad //= 2
        candidate = attrs.evolve(current, threads=[[{**op, "pad": pad} if "pad" in op else op for op in t]
                                                   for t in current.threads])
        if not fails(candidate):
            break
        current = candidate
    return current


def to_trace(layout: Layout, rate: Measurement, *, client: str, bound: float, seeds: list[int], origin: str,
             options: dict | None = None, clients: int = 1, strikes: Sequence[tuple[Any, Any]] = ()) -> Trace:
    """The `concurrent` trace of a finding: the layout, its measured rate, the first failing run's history, and the
    real-server faults each run struck (`config.faults`: `{"fault", "rank", "at": "run", "step", "seconds"}`)."""
    first = rate.first
    assert first is not None, "a finding has a failing run"
    v = first.violations[0]
    summary = (f"{v.summary} -- in {rate.k} of {rate.n} runs of {len(layout.threads)} caller thread(s), "
               f"{layout.n_ops} ops")
    shown = [Violation(x.property, x.summary, {"op": x.detail["op"]}) for x in first.violations]
    return Trace.of("concurrent", shown, summary=summary, client=client, ops=layout.to_ops(),
                    config={"n_ranks": 1, "threads": len(layout.threads), "bound": bound,
                            "rate": {**Rate.now(rate.k, rate.n).to_json(), "seeds": list(seeds)},
                            **({"clients": clients} if clients > 1 else {}), **(options or {}),
                            **({"faults": [{"fault": k.field, **k.to_json(f)} for k, f in strikes]} if strikes else {})},
                    verdict={"linearizability": first.verdict, "history": first.history.to_json(),
                             **({"faults": first.history.faults} if first.history.faults else {}),
                             "picture": lanes(first.history, verdict=first.verdict)},
                    expect={client: "reproduces"}, origin=origin)


def strikes_of(config: dict) -> list[tuple[Any, Any]]:
    """The (kind, `ServerFault`) pairs every run of a concurrent trace strikes (`config.faults`); `ValueError` naming a
    bad entry."""
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


@contextlib.contextmanager
def layout_runs(trace: Trace, stores: Any, control: Any = None) -> Iterator[Callable[[], tuple[list[Violation], str]]]:
    """`once()`: one run of a concurrent trace's layout on `stores[0]` (or on a `ServerClients`: several clients of
    one server; closed at the end), under a fresh key prefix each time: its violations (of any property) and a
    note. A layout that uses a path the client does not offer cannot run: no violation, and the note says so. A
    trace's real-server faults (`strikes_of`) strike in every run through `control` (closed at the end too)."""
    target = fresh_target(stores)
    layout = trace.case()
    bound = float(trace.config.get("bound", 2.0))
    missing = sorted({op["path"] for op in trace.ops if op["path"] != "evict"
                      and not callable(getattr(target.clients[int(op.get("client", 0))], op["path"], None))})
    strikes = strikes_of(trace.config)
    faulted = {"strikes": strikes, "control": control, "op_timeout": trace.config.get("op_timeout"),
               "recovery_seconds": trace.config.get("recovery_seconds")} if strikes else {}

    def once() -> tuple[list[Violation], str]:
        if missing:  # nothing to run: the race lives on a path this client does not offer
            return [], f"the client offers no {', '.join(missing)}: the layout cannot run on it"
        got = measure(target, layout, runs=1, bound=bound, **faulted)
        if not got.k:
            return [], ""
        return list(got.first.violations), ""
    try:
        yield once
    finally:
        if control is not None:
            control.close()
        target.close()


@attrs.define
class ConcurrencyCoverage:
    """What the concurrent layer ran: layouts, runs and ops, over which declared paths; layouts whose violation did not
    show again on a fresh store (left by earlier layouts); why it did not run, when it did not."""

    layouts: int = 0
    runs: int = 0
    ops: int = 0
    paths: tuple[str, ...] = ()
    not_on_a_fresh_store: int = 0
    skipped: str = ""
    #: Clients of the one server the layouts ran on, whether the server evicted by itself, and why one client only.
    clients: int = 1
    evictions: bool = False
    not_shared: str = ""

    def text(self) -> str:
        if self.skipped:
            return f"not run: {self.skipped}"
        stale = f"; {self.not_on_a_fresh_store} layout(s) not shown again on a fresh store" \
            if self.not_on_a_fresh_store else ""
        tier = (f"; {self.clients} clients of one server{', and its own evictions' if self.evictions else ''}"
                if self.clients > 1 else f"; one client per server ({self.not_shared})" if self.not_shared else "")
        return (f"{self.layouts:,} layouts, {self.runs:,} runs, {self.ops:,} ops over "
                f"{', '.join(self.paths) or 'no path'}{stale}{tier}")

    def to_json(self) -> dict:
        return attrs.asdict(self)


def search(store: Any, *, client: str, seed: int, should_stop: Callable[[], bool], bound: float,
           coverage: ConcurrencyCoverage | None = None, runs_per_layout: int = 3, measure_runs: int = 20,
           confirm_stop: Callable[[], bool] | None = None, fresh: Callable[[], list] | None = None) -> Trace | None:
    """Seeded layouts over the store's declared paths, growing in threads and ops, until a run shows a
    violation or `should_stop()`. With `fresh` (a maker of fresh stores), a finding must show again on a fresh
    store (else the search goes on: it came from what earlier layouts left behind), measured there in up to
    `measure_runs` runs (until `confirm_stop()`), as a replay runs it; it is returned as a trace, unminimised
    (`minimised` shrinks it: the layer's minimiser, `checking.layers`)."""
    cov = coverage if coverage is not None else ConcurrencyCoverage()
    target = ServerClients.of(store)
    if not thread_safe(target.clients[0]):
        cov.skipped = "the client declares thread_safe = False"
        return None
    cov.paths = paths = declared_paths(target.clients[0])
    cov.clients, cov.evictions = len(target.clients), target.evict is not None
    sizes = [(2, 4, 2), (3, 6, 2), (4, 8, 3), (6, 8, 3), (8, 10, 4), (8, 16, 6)]
    i = 0
    while not should_stop():
        threads, ops, keys = sizes[min(i // 4, len(sizes) - 1)]
        layout = make_layout(seed + i, threads=threads, ops=ops, keys=keys, paths=paths,
                             clients=len(target.clients), evictions=target.evict is not None)
        i += 1
        cov.layouts += 1
        rate = measure(store, layout, runs=runs_per_layout, bound=bound, should_stop=should_stop)
        cov.runs += rate.n
        cov.ops += rate.n * layout.n_ops
        if not rate.k:
            continue
        if fresh is not None:
            rate = _on(store, fresh, layout, runs=measure_runs, bound=bound, want=_leading(rate),
                       should_stop=confirm_stop or should_stop)
            if not rate.k:
                cov.not_on_a_fresh_store += 1
                continue
        return to_trace(layout, rate, client=client, bound=bound, seeds=[layout.seed], origin="check:concurrency",
                        clients=len(target.clients))
    return None


def _leading(rate: Measurement) -> str:
    """The property most of the failing runs lead with (a race shows several: a crossed reply that carried a miss
    is only `linearizability`, one that carried another key's bytes `wrong-caller`)."""
    return max(rate.properties, key=rate.properties.get)


def minimised(trace: Trace, fresh: Callable[[], Any], *, should_stop: Callable[[], bool],
              measure_stop: Callable[[], bool], measure_runs: int = 20) -> Trace:
    """A concurrent trace's layout minimised (`minimise`, until `should_stop()`) and measured again (until
    `measure_stop()`), each run on a fresh target of `fresh()`; the trace as it was when the smaller layout lost its
    rate before it could be measured."""
    bound, want = float(trace.config["bound"]), trace.property
    seeds = list(trace.config["rate"].get("seeds", [0]))
    layout = trace.case()
    rate = Rate.from_json(trace.config["rate"])
    small = minimise(None, layout, want, rate, bound=bound, should_stop=should_stop, fresh=fresh)
    if small == layout:
        return trace
    final = _on(None, fresh, small, runs=measure_runs, bound=bound, want=want, should_stop=measure_stop)
    if not final.k:
        return trace
    out = to_trace(small, final, client=trace.client or "", bound=bound, seeds=seeds, origin=trace.origin,
                   clients=int(trace.config.get("clients", 1)))
    out.config.update({k: v for k, v in trace.config.items() if k not in out.config})  # (the client's options)
    return out


class Concurrency:
    """`check`'s concurrent layer: many ops at once on one fresh server of the client (two clients of it when the
    client can share servers, and the server's own evictions); a finding comes measured on fresh stores (its layer's
    row minimises it: `checking.layers`). A run is never cut short (a pending op would read as lost): one starts only
    when its whole bound fits in the phase."""

    name = "concurrency"

    def search(self, ctx: SearchContext) -> Finding | None:
        client = ctx.target.client
        real = client.self_bounded
        bound = CONCURRENT_BOUND["real" if real else "in-memory"]
        ours = {"op_timeout": CONCURRENT_OP_TIMEOUT} if real else {}
        options = ctx.target.store_options(**ours)
        phase_stop, whole_stop = ctx.should_stop, ctx.finish_by - bound
        coverage = ctx.coverage.of(self.name, ConcurrencyCoverage)
        fresh, coverage.not_shared = targets(client, **options)
        target = fresh()
        try:
            trace = search(target, client=client.name, seed=ctx.seed, bound=bound,
                           should_stop=lambda: phase_stop() or time.monotonic() + bound >= ctx.phase_end,
                           coverage=coverage, confirm_stop=lambda: time.monotonic() >= whole_stop, fresh=fresh)
        finally:
            target.close()
        if trace is None:
            return None
        trace.config.update(client.accepted(ours))
        return Finding(strategy=self.name, violations=violations_of(trace), trace=trace,
                       rate=Rate.from_json(trace.config["rate"]))
