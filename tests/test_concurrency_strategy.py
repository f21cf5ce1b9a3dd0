"""Racy findings: rate statistics, minimisation, the `concurrent` trace kind, statistical replay, and the
Hypothesis concurrent property catching each racy client."""
from __future__ import annotations

import functools
import json
import math
import random

import attrs
import pytest

from adapters.catalogue import CLIENTS
from checking.concurrency import make_layout, measure
from model.contract import declared_paths
from checking.concurrency_strategy import ConcurrencyCoverage, minimise, minimised, search
from checking.layers import ReplayOn
from checking.replay import DETERMINISTIC_RUNS, clean_runs, judge
from model.finding import RATE_DRIFT, Rate, lower_bound, runs_within
from model.trace import Trace, TraceError
from runtime.registry import resolve_client
from properties import config
from properties.bad_stores import RACY_STORES, jitter_factory, stale_cache_factory


@pytest.mark.parametrize("k,n", [(1, 50), (1, 3), (8, 20), (49, 50), (20, 20)])
def test_run_counts_meet_99_percent(k, n):
    """The rate's lower bound p holds at 99% (the binomial tail at p is 1%), and runs_to_clear is the fewest runs in
    which a bug of a quarter of rate p (`RATE_DRIFT`) stays hidden with probability <= 1%."""
    p = lower_bound(k, n, 0.99)
    tail = sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k, n + 1))
    assert 0 < p <= k / n and abs(tail - 0.01) < 1e-6
    clear, drifted = Rate(k, n).runs_to_clear(), p / RATE_DRIFT
    assert (1 - drifted) ** clear <= 0.01 < (1 - drifted) ** (clear - 1)
    assert clear >= RATE_DRIFT * Rate(k, n).runs_to_show() - RATE_DRIFT
    assert Rate(k, n, deterministic=k == n).runs_to_clear() == (1 if k == n else clear)


def test_reproduce_rule_holds_on_a_seeded_bernoulli_source():
    """On a simulated bug of rate 0.05 (fixed seed), a miss within N runs happens in about 1% of replays at most."""
    rng = random.Random(1234)
    need = runs_within(0.05)
    misses = sum(all(rng.random() >= 0.05 for _ in range(need)) for _ in range(2000))
    assert misses / 2000 <= 0.02


def replay(trace, factory):
    """A concurrent trace judged on the client `factory` names (`checking.replay.judge`)."""
    verdict = judge(trace, ReplayOn(client=resolve_client(factory, CLIENTS)))
    return verdict.outcome, verdict.why


@functools.cache
def found_stale_trace():
    """The stale cache's finding (searched once per worker: the tests only read it)."""
    store = stale_cache_factory(1)[0]
    try:
        cov = ConcurrencyCoverage()
        found = search(store, client="properties.bad_stores:stale_cache_factory", seed=0, bound=0.5, coverage=cov,
                       should_stop=lambda: cov.runs > 200, confirm_stop=lambda: False,
                       fresh=lambda: stale_cache_factory(1))
    finally:
        store.close()
    assert found is not None
    return minimised(found, lambda: stale_cache_factory(1), should_stop=lambda: False, measure_stop=lambda: False)


def test_search_minimises_and_writes_a_valid_concurrent_trace(tmp_path):
    """The stale cache is found, cut to at most two threads, and its trace round-trips with its rate."""
    trace = found_stale_trace()
    assert trace is not None and trace.kind == "concurrent" and trace.property == "linearizability"
    assert trace.config["threads"] <= 2 and len(trace.ops) <= 6
    rate = trace.config["rate"]
    assert 0 < rate["k"] <= rate["n"] and f"{rate['k']} of {rate['n']} runs" in trace.summary
    path = trace.save(tmp_path / "t.json")
    back = Trace.load(path)
    assert back.ops == trace.ops and back.verdict["picture"]["lanes"]


def test_replay_judges_by_rate():
    """Replay reproduces the finding on the racy client and calls it fixed on the correct one after as many clean
    runs as the rate it recorded asks."""
    trace = found_stale_trace()
    assert replay(trace, stale_cache_factory)[0] == "reproduces"
    on, seen = ReplayOn(client=resolve_client(jitter_factory, CLIENTS)), []
    verdict = judge(trace, on, progress=lambda done, need: seen.append((done, need)))
    need, _ = clean_runs(trace, on)
    assert verdict.outcome == "fixed" and f"in {need} clean" in verdict.why
    assert seen == [(i, need) for i in range(1, need)]


@pytest.mark.parametrize("rate,need", [({"k": 5, "n": 20}, Rate(5, 20).runs_to_clear()),
                                       ({"k": 20, "n": 20}, DETERMINISTIC_RUNS), (None, DETERMINISTIC_RUNS)])
def test_clean_runs_follow_the_recorded_rate(rate, need):
    """A racy rate asks for its 99% count of clean runs; one that showed every time, or none recorded, for 10."""
    trace = found_stale_trace()
    config = {k: v for k, v in trace.config.items() if k != "rate"}
    trace = attrs.evolve(trace, config={**config, **({"rate": rate} if rate else {})})
    assert clean_runs(trace, ReplayOn(client=resolve_client(jitter_factory, CLIENTS)))[0] == need


@pytest.mark.parametrize("bad", [{"rate": {"k": 0, "n": 5}}, {"rate": {"k": 6, "n": 5}}, {}])
def test_concurrent_trace_without_a_valid_rate_is_rejected(tmp_path, bad):
    """A concurrent trace must record k of n runs with 0 < k <= n."""
    trace = found_stale_trace()
    data = trace.to_json()
    data["config"] = {**{k: v for k, v in data["config"].items() if k != "rate"}, **bad}
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(TraceError, match="config.rate"):
        Trace.load(tmp_path / "bad.json")


def test_minimise_keeps_the_violation():
    """Minimising a crossed-replies layout keeps a measurable wrong-caller rate with fewer threads and ops."""
    factory, prop = RACY_STORES["crossed-replies"]
    store = factory(1)[0]
    try:
        layout = make_layout(0, threads=4, ops=10, keys=2, paths=declared_paths(store))
        rate = measure(store, layout, runs=10, bound=0.5, want=prop)
        small = minimise(store, layout, prop, rate, bound=0.5, should_stop=lambda: False)
        again = measure(store, small, runs=40, bound=0.5, want=prop)
    finally:
        store.close()
    assert rate.k > 0 and again.k > 0
    assert len(small.threads) <= len(layout.threads) and small.n_ops < layout.n_ops


@pytest.mark.parametrize("name", list(RACY_STORES))
def test_hypothesis_concurrent_property_catches_racy_client(name, monkeypatch):
    """The property of `properties/test_concurrent_layer.py` fails on each racy client, naming its violation (here
    with more drawn batches and runs of each than a profile gives it, so a race shown in a few runs in ten is not
    missed)."""
    from hypothesis import HealthCheck, Phase, given, settings, strategies as st
    from checking.concurrency import Layout
    from model.contract import declared_paths
    from properties import test_concurrent_layer
    from properties.strategies import concurrent_batches
    monkeypatch.setattr(test_concurrent_layer, "RUNS", 6)

    @settings(max_examples=150, derandomize=True, database=None, deadline=None, phases=(Phase.generate,),
              report_multiple_bugs=False, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def batches_hold(data):
        store = test_concurrent_layer._store()
        test_concurrent_layer._assert_holds(store, Layout(data.draw(concurrent_batches(declared_paths(store)))))

    factory, _ = RACY_STORES[name]
    with config.using(client=factory, op_timeout=0.2):
        with pytest.raises(Exception) as info:
            batches_hold()
    # a race that did not recur while Hypothesis shrank it is reported as flaky: its first failure is inside
    text = " ".join(_messages(info.value))
    assert any(p in text for p in ("lost-completion", "wrong-caller", "linearizability")), text


def _messages(exc: BaseException):
    yield str(exc)
    for sub in getattr(exc, "exceptions", ()):
        yield from _messages(sub)


def test_check_reports_a_racy_client_with_its_rate_and_replay_judges_it(tmp_path):
    """`check --client` on the stale cache reports linearizability with k of n runs; replay reproduces it there, and
    on a correct client it is `fixed` against the stale cache run beside it (the control)."""
    from shardcheck.check_cmd import run_check
    from shardcheck.replay_cmd import run_replay
    spec = "properties.bad_stores:stale_cache_factory"
    result = run_check(None, spec, budget=10.0, out_dir=str(tmp_path))
    assert result["verdict"] == "violated"
    assert result["violations"][0]["property"] == "linearizability"
    assert result["stats"]["counterexample"]["rate"]["k"] >= 1
    rows = run_replay([result["violations"][0]["counterexample"]], spec)
    assert rows[0]["outcome"] == "reproduces" and rows[0]["matches"]
    rows = run_replay([result["violations"][0]["counterexample"]], "properties.bad_stores:jitter_factory")
    assert rows[0]["outcome"] == "fixed" and rows[0]["control"]["subject"] == spec, rows[0]
    assert rows[0]["control"]["k"] >= 7 and rows[0]["candidate"] == {"k": 0, "n": rows[0]["candidate"]["n"]}


def test_client_declaring_not_thread_safe_is_reported_not_driven():
    """A client with thread_safe = False is not driven concurrently, and the stats say so."""
    from properties.bad_stores import CrossedRepliesStore

    class Declared(CrossedRepliesStore):
        thread_safe = False
    cov = ConcurrencyCoverage()
    assert search(Declared(), client="x", seed=0, should_stop=lambda: False, bound=0.5, coverage=cov) is None
    assert "thread_safe = False" in cov.text()


def test_concurrent_trace_with_an_unknown_path_is_rejected(tmp_path):
    """A concurrent trace op naming a path nobody can drive is refused, naming the field."""
    data = found_stale_trace().to_json()
    data["ops"][0]["path"] = "scan"
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(TraceError, match=r"ops\[0\]\.path.*'scan'"):
        Trace.load(tmp_path / "bad.json")


def test_a_long_replay_reports_its_clean_runs_at_most_every_few_seconds(capsys, monkeypatch):
    """`shardcheck replay` prints a racy trace's clean runs so far on stderr (at most every PROGRESS_EVERY s)."""
    import shardcheck.replay_cmd as cli_replay
    cli_replay._progress_of("u.json")(3, 10)  # (within PROGRESS_EVERY of its start: nothing yet)
    monkeypatch.setattr(cli_replay, "PROGRESS_EVERY", 0.0)
    cli_replay._progress_of("t.json")(3, 10)
    err = capsys.readouterr().err
    assert "t.json: 3 of 10 clean runs" in err and "u.json" not in err
