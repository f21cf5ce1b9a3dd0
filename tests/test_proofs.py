"""The Z3 proofs (proofs/): expected results, vacuity, seed stability, concrete counterexamples,
their replay in the simulator, and bounded cross-checks against the reference protocol."""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

import proofs
from model.effects import (TIMED_OUT, AllGather, AllReduceMin, Broadcast, Get, GetAsync, Handle, Wait,
                           collective_signature)
from model.harness import leading_run, run_case
from model.protocols import PaperProtocol, PaperProtocolAsync
from model.trace import Trace
from proofs.encoding import RLIMIT
from proofs.flawed import FLAWED, VARIANTS, confirm, evaluate
from proofs.theorems import THEOREMS
from proofs.traces import COUNTEREXAMPLE_DIR, case_of, protocol_of, replay

SEEDS = 10
NAMES = [th.name for th in (*THEOREMS, *FLAWED)]


@pytest.fixture(scope="module")
def reports():
    """Every theorem run once on 10 seeds, by name."""
    return {r.theorem: r for r in proofs.run_reports_all(seeds=SEEDS)}


@pytest.mark.parametrize("name", NAMES)
def test_expected_result(reports, name):
    """Each theorem gets its expected result: T1..T5 proved, the flawed variants refuted."""
    r = reports[name]
    assert r.result == r.expected, r
    assert r.seeds == SEEDS


@pytest.mark.parametrize("name", NAMES)
def test_vacuity(reports, name):
    """Hypotheses are satisfiable: theorem-level instances and every proof step minus its negated goal."""
    r = reports[name]
    assert r.vacuity == "sat"
    if r.expected == "proved":
        n_vac = sum(1 for c in r.checks[0] if c.obligation.endswith("[hyps]") or ".vacuity" in c.obligation)
        assert n_vac >= len(next(t for t in THEOREMS if t.name == name).obligations) + 1


@pytest.mark.parametrize("name", NAMES)
def test_stable_on_every_seed(reports, name):
    """Every obligation answers as expected on all 10 seeds, within 1 s per seed, the rlimit budget and a 2x effort spread."""
    r = reports[name]
    assert len(r.checks) == SEEDS
    th = next(t for t in (*THEOREMS, *FLAWED) if t.name == name)
    expected = {ob.name: ob.expect for ob in th.obligations}
    for per_seed in r.checks:
        for c in per_seed:
            want = expected.get(c.obligation, "sat")  # vacuity / hypothesis checks expect sat
            assert c.status == want, (c.obligation, c.status, c.reason)
            assert c.rlimit < RLIMIT
    assert r.stable
    totals = [sum(c.rlimit for c in per_seed) for per_seed in r.checks]
    assert max(totals) <= 2 * min(totals), totals  # effort does not swing with the seed


def test_run_all_rows_and_table():
    """run_all returns the prove --json rows; format_table lists every theorem."""
    rows = proofs.run_all(seeds=2)
    assert [r["theorem"] for r in rows] == NAMES
    for r in rows:
        assert {"theorem", "expected", "result", "seconds", "rlimit", "seeds"} <= set(r)
        assert r["seeds"] == 2 and isinstance(r["rlimit"], int) and isinstance(r["seconds"], float)
        assert r["result"] in ("proved", "counterexample", "unknown")
    json.dumps(rows)
    table = proofs.format_table(rows)
    for name in NAMES:
        assert name in table
    assert f"{len(rows)}/{len(rows)} theorems" in table


def test_cli_exit_code(capsys):
    """`shardcheck prove` exits 0 when every theorem has its expected result."""
    from shardcheck.cli import main
    assert main(["prove", "--seeds", "1"]) == 0
    assert "T1_min_over_ranks" in capsys.readouterr().out


@pytest.mark.parametrize("th", FLAWED, ids=lambda t: t.name)
def test_flawed_models_violate_in_plain_python(reports, th):
    """Every seed's Z3 model is a concrete config that violates in plain Python; the minimised model is seed-independent."""
    r = reports[th.name]
    witnesses = [per_seed[0].witness for per_seed in r.checks]
    for w in (c.witness for per_seed in r.checks for c in per_seed):
        assert confirm(w)
        ev = evaluate(w["variant"], w["n_ranks"], w["n_chunks"], set(w["cached"]))
        assert ev["lcp"] == leading_run(frozenset(w["cached"]), w["n_chunks"])
        assert ev["planned"] != ev["lcp"]
        assert ev["property"] == VARIANTS[w["variant"]][1]
    assert all(w == witnesses[0] for w in witnesses)


@pytest.mark.parametrize("th", FLAWED, ids=lambda t: t.name)
def test_flawed_models_replay_in_simulator(reports, th):
    """Z3's config through the variant's demo protocol in the harness gives the same violation; PaperProtocol holds on it."""
    w = reports[th.name].counterexample
    out = replay(w)
    assert VARIANTS[w["variant"]][1] in out.violated()
    assert sorted(out.cached) == w["cached"] and out.lcp == w["lcp"]
    assert out.reports == w["reports"] and out.planned == w["planned"]
    ref = run_case(PaperProtocol(), case_of(w))
    assert ref.violations == [] and ref.planned == ref.lcp == w["lcp"]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_saved_counterexample_traces_replay(reports, variant):
    """counterexamples/z3-<variant>.json loads, matches the current Z3 model, and replays to its violation."""
    path = COUNTEREXAMPLE_DIR / f"z3-{variant}.json"
    trace = Trace.load(path)
    assert trace.expect["model"] == "reproduces" and len(trace.summary) > 40
    assert set(trace.expect.values()) == {"reproduces"}  # a protocol flaw, whatever the client
    w = next(r.counterexample for r in reports.values() if r.counterexample and r.counterexample["variant"] == variant)
    assert trace.config["n_ranks"] == w["n_ranks"] and trace.config["n_chunks"] == w["n_chunks"]
    assert trace.lookup["cached"] == w["cached"]
    out = run_case(protocol_of(variant), trace.case())
    assert trace.property in out.violated()
    assert trace.property == VARIANTS[variant][1]
    assert [v["property"] for v in trace.verdict["violations"]] == [v.property for v in out.violations]


def test_bounded_sweep_min_over_ranks_is_lcp():
    """Cross-check of T1 (not the proof): PaperProtocol lookup + min = LCP for N <= 4, K <= 6, every cached subset."""
    proto = PaperProtocol()
    for n, k in itertools.product(range(1, 5), range(0, 7)):
        hashes = [f"h{c}" for c in range(k)]
        for bits in range(1 << k):
            cached = {c for c in range(k) if bits >> c & 1}
            keys = {proto.key(c, hashes[c], c % n, n) for c in cached}
            reports = [proto.rank_lookup(r, n, hashes, keys.__contains__) for r in range(n)]
            assert proto.combine(reports, k) == leading_run(cached, k), (n, k, cached, reports)


def _collective_kinds(proto, n: int, k: int, failed: set[int], how: object, results: dict | None = None
                      ) -> list[list[tuple]]:
    """Drive every rank's real `rank_load` generator in lockstep (NCCL call-order matching); a fetch
    of a chunk in `failed` misses (or times out); return each rank's collective signatures."""
    hashes = [f"h{c}" for c in range(k)]
    chunk_of = {proto.key(c, hashes[c], r, n): c for c in range(k) for r in range(n)}
    gens = [proto.rank_load(r, n, hashes, k) for r in range(n)]
    kinds: list[list[tuple]] = [[] for _ in range(n)]
    pending: list = [None] * n  # the collective each rank is blocked on
    sends: list = [None] * n
    done = [False] * n
    seq = [0] * n
    while not all(done):
        for r in range(n):
            while not done[r] and pending[r] is None:
                try:
                    eff = gens[r].send(sends[r])
                except StopIteration as stop:
                    done[r] = True
                    if results is not None:
                        results[r] = stop.value
                    break
                sends[r] = None
                if isinstance(eff, (AllReduceMin, AllGather, Broadcast)):
                    pending[r] = eff
                    kinds[r].append(collective_signature(eff))
                elif isinstance(eff, Get):
                    sends[r] = None if chunk_of[eff.key] in failed else b"v"
                elif isinstance(eff, GetAsync):
                    seq[r] += 1
                    sends[r] = Handle(r, seq[r], eff.key)
                elif isinstance(eff, Wait):
                    sends[r] = how if chunk_of[eff.handle.key] in failed else b"v"
                else:
                    raise AssertionError(f"unexpected effect {eff!r}")
        blocked = [r for r in range(n) if not done[r]]
        if not blocked:
            break
        if any(pending[r] is None for r in blocked) or len(blocked) < n:
            return kinds  # some rank finished or diverged while others wait: kinds will differ
        effs = [pending[r] for r in range(n)]
        if len({collective_signature(e) for e in effs}) != 1:
            return kinds
        if isinstance(effs[0], AllReduceMin):
            result = min(e.value for e in effs)
            for r in range(n):
                sends[r] = result
        elif isinstance(effs[0], AllGather):
            for r in range(n):
                sends[r] = [e.value for e in effs]
        else:
            for r in range(n):
                sends[r] = effs[effs[0].root].value
        pending = [None] * n
    return kinds


@pytest.mark.parametrize("proto", [PaperProtocol(), PaperProtocolAsync()], ids=lambda p: p.name)
def test_bounded_collective_sequence_is_rank_and_fault_independent(proto):
    """Cross-check of T4: real rank_load issues AllReduceMin, AllGather on every rank and loads 0..u-1, any failed subset."""
    outcomes = (None, TIMED_OUT) if isinstance(proto, PaperProtocolAsync) else (None,)
    for n, k in itertools.product(range(1, 5), range(0, 6)):
        for bits in range(1 << k):
            failed = {c for c in range(k) if bits >> c & 1}
            for how in outcomes:
                results: dict = {}
                kinds = _collective_kinds(proto, n, k, failed, how, results)
                assert all(seq == [("AllReduceMin", None), ("AllGather", None)] for seq in kinds), \
                    (n, k, failed, kinds)
                # T4's u: min over ranks of the first failed own chunk = the first failed chunk overall
                u = min(failed | {k})
                assert all(sorted(res) == list(range(u)) for res in results.values()), (n, k, failed, results)
                assert len(results) == n


def test_committed_counterexample_files_are_all_z3_variants():
    """Exactly one z3-*.json per flawed variant is committed."""
    names = sorted(p.name for p in Path(COUNTEREXAMPLE_DIR).glob("z3-*.json"))
    assert names == sorted(f"z3-{v}.json" for v in VARIANTS)


@pytest.mark.parametrize("cls_name", ["EarlyExitOnMiss", "SkipEmptyGather"])
def test_collective_cross_check_catches_desync_variants(cls_name):
    """The lockstep driver has teeth: variants branching collectives on local faults diverge for some failure subset."""
    import model.variants as variants
    proto = getattr(variants, cls_name)()
    diverged = False
    for n, k in itertools.product(range(2, 4), range(1, 5)):
        for bits in range(1 << k):
            failed = {c for c in range(k) if bits >> c & 1}
            kinds = _collective_kinds(proto, n, k, failed, None)
            diverged |= len({tuple(s) for s in kinds}) > 1
    assert diverged


@pytest.mark.parametrize("th", FLAWED, ids=lambda t: t.name)
def test_flawed_counterexample_is_minimal(reports, th):
    """Dropping a rank, the last chunk or one eviction from the Z3 counterexample loses the violation."""
    w = reports[th.name].counterexample
    n, k, cached = w["n_ranks"], w["n_chunks"], set(w["cached"])
    smaller = []
    if n > 1:
        smaller.append((n - 1, k, cached))
    if k > 0:
        smaller.append((n, k - 1, {c for c in cached if c < k - 1}))
    smaller += [(n, k, cached | {c}) for c in range(k) if c not in cached]
    for cfg in smaller:
        assert evaluate(w["variant"], *cfg)["property"] is None, cfg


@pytest.mark.parametrize("th", FLAWED, ids=lambda t: t.name)
def test_saved_counterexample_has_not_drifted(reports, th):
    """The committed z3-<variant>.json equals what Z3 and the simulator produce now (`shardcheck regen z3`)."""
    from adapters.catalogue import CLIENTS
    from proofs.traces import build_trace
    from runtime.registry import protocol_bug_expect
    r = reports[th.name]
    path = COUNTEREXAMPLE_DIR / f"z3-{r.counterexample['variant']}.json"
    assert path.read_text() == build_trace(r, protocol_bug_expect(CLIENTS)).dumps()
