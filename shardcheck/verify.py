"""`shardcheck verify` (what `make verify` runs): the proofs, the checks of every reference protocol and
demo variant, the explorer's manifest, the real LMCache clients against real Valkey servers started
here, and the corpus replayed against each client, with a summary table."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import attrs

from runtime import reaper
from runtime.registry import by_verdict, corpus_clients, patch_refs
from shardcheck.tables import CLIENTS, DEMO_MODULES, SERVING_ENGINES
from shardcheck.errors import EXIT_HELD, EXIT_VIOLATED, UsageError
from shardcheck.output import print_json

__all__ = ["REAL_CLIENTS", "run_verify", "cmd_verify"]

#: The real clients verify checks and replays the corpus on.
REAL_CLIENTS = corpus_clients(CLIENTS, real=True)
#: Stack connectors checked only by `verify --full`, with the budget each needs at least (seconds): `--engine vllm
#: --connector mooncake` takes 4-6 minutes to its finding (tests/test_mooncake.py catches its demos in about one).
_FULL_ONLY = {("vllm", "mooncake"): 300.0}


def _by_first(r: dict) -> str:
    """A check's verdict, naming the property a violation leads with (a demo must be found by its own property)."""
    return f"violated: {r['violations'][0]['property']}" if r["verdict"] == "violated" and r["violations"] \
        else r["verdict"]


def _step(rows: list[dict], name: str, expected: str, fn: Callable[[], tuple[str, str]]) -> None:
    print(f"... {name}", file=sys.stderr, flush=True)
    t = time.monotonic()
    try:
        got, detail = fn()
    except UsageError as exc:
        got, detail = "error", str(exc)
    except Exception as exc:  # noqa: BLE001 - one step that crashes is a failed row, never a lost table
        got, detail = "error", f"{type(exc).__name__}: {exc}"
    rows.append({"step": name, "expected": expected, "got": got, "ok": got == expected, "detail": detail,
                 "seconds": round(time.monotonic() - t, 1)})


def _engine_steps(rows: list[dict], budget: float, out_dir: str, only: str | None, full: bool = False) -> None:
    """The engine layer: stock LMCache's engine path violated, the patched one held; each serving stack on each of its
    connectors. With `full`, every engine demo caught (each in its own process: a demo patches LMCache for good), every
    stack demo (a connector) caught by its property, and the engine corpus replayed on both engines."""
    from pathlib import Path

    from model.checks import CATALOG
    from shardcheck.check_cmd import run_check
    from shardcheck.engine_findings import ENGINE_CORPUS
    from shardcheck.replay_cmd import run_replay
    engines = [only] if only else list(SERVING_ENGINES)
    stacks = [e for e in engines if SERVING_ENGINES[e].seam == "stack"]
    engines = [e for e in engines if SERVING_ENGINES[e].seam == "deployment"]
    secs = max(budget, 60.0)

    def check(engine: str, patches: tuple = (), secs: float = secs, connector: str | None = None,
              demo: bool = False, want: str | None = None) -> Callable[[], tuple[str, str]]:
        def go() -> tuple[str, str]:
            if patches or demo:  # in a fresh interpreter: the patch stays applied in the process that applied it
                argv = [sys.executable, "-m", "shardcheck", "check", "--engine", engine, "--budget", str(secs),
                        "--json", "--out", out_dir, *[a for p in patches for a in ("--engine-patch", p)],
                        *(("--connector", connector) if connector else ())]
                got = reaper.run_child(argv, timeout=secs * 3, cwd=Path(__file__).resolve().parents[1])
                if got.returncode not in (0, 1):
                    return "error", got.stderr.strip().splitlines()[-1] if got.stderr.strip() else "no output"
                r = json.loads(got.stdout)
            else:
                r = run_check(None, None, budget=secs, out_dir=out_dir, engine=engine, connector=connector)
            props = sorted({v["property"] for v in r["violations"]})
            if want is not None:  # (found by `want` among the finding's violations, whichever leads)
                verdict = f"violated: {want}" if want in props else _by_first(r)
                return verdict, f"{r['stats']['cases']} cases; {', '.join(props) or 'none'}"
            return _by_first(r) if patches or demo else r["verdict"], f"{r['stats']['cases']} cases" + (
                f"; {', '.join(props)}" if props else "")
        return go

    for engine in engines:
        expect = SERVING_ENGINES[engine].expect
        # (a fixed engine holds for as long as it is given: the newcomer's run gives it half a minute)
        _step(rows, f"check --engine {engine} ({'stock' if expect == 'violated' else 'fixed'}, real Valkey)", expect,
              check(engine, secs=secs if full or expect != "held" else max(budget, 30.0)))
        if expect != "held" or not full:
            continue
        for p in CATALOG:  # the engine demos, patched into a fixed engine
            if p.layer == "engine":
                for demo in p.demos:
                    _step(rows, f"check --engine {engine} --engine-patch {demo} -> {p.name}", f"violated: {p.name}",
                          check(engine, (f"adapters.engine_demos:{demo}",)))
    for stack in stacks:  # a serving stack on each connector; with `full`, each stack demo caught by its property
        entry = SERVING_ENGINES[stack]
        # (the in-memory stack and SGLang's prefetch run hundreds of cases a minute: the budget as given, at most 30 s
        # for SGLang's, whose ranks start in 8 s)
        small = {"memory-stack": budget, "sglang-hicache": min(budget, 30.0)}
        for connector in entry.connectors or (None,):
            name = f"check --engine {stack}" + (f" --connector {connector}" if len(entry.connectors) > 1 else "")
            if (stack, connector) in _FULL_ONLY:  # (minutes: a vLLM start, then cases that wait out RPC deadlines)
                if not full:
                    continue
                from adapters.mooncake_servers import unavailable
                reason = unavailable()
                if reason:
                    rows.append({"step": name, "expected": "skipped", "got": "skipped", "ok": True, "detail": reason,
                                 "seconds": 0.0})
                    continue
                secs_here = max(secs, _FULL_ONLY[(stack, connector)])
            elif entry.expected(connector) == "held" and not full:  # (as a fixed engine: half a minute)
                secs_here = small.get(stack, max(budget, 30.0))
            else:
                secs_here = small.get(stack, secs)
            _step(rows, name, entry.expected(connector), check(stack, secs=secs_here, connector=connector))
        if entry.patch_demos:  # its own agreement broken by an --engine-patch demo, found by the property it breaks
            for p in CATALOG:
                for ref in patch_refs(p, DEMO_MODULES):
                    _step(rows, f"check --engine {stack} --engine-patch {ref} -> {p.name}", f"violated: {p.name}",
                          check(stack, (ref,), secs=small.get(stack, secs), want=p.name))
        if stack != "vllm" or not full:
            continue
        for p in CATALOG:
            if p.layer == "stack":
                for demo in p.demos:
                    _step(rows, f"check --engine {stack} --connector {demo} -> {p.name}", f"violated: {p.name}",
                          check(stack, connector=f"{DEMO_MODULES['stack']}:{demo}", demo=True))
    for engine in engines if full else ():  # (minutes: each trace on fresh deployments, 10 or more runs of a fix)
        def replay(engine: str = engine) -> tuple[str, str]:
            res = run_replay([str(ENGINE_CORPUS)], engine=engine)
            off = [r["path"] for r in res if not r["matches"]]
            return ("as expected" if not off else "unexpected"), f"{len(res)} traces" + (f"; off: {off}" if off else "")
        _step(rows, f"replay counterexamples/engine --expect on {engine}", "as expected", replay)


def run_verify(*, budget: float, as_json: bool, engine: str | None = None, full: bool = False) -> int:
    """Every step (or, with `engine`, the engine layer alone: on that engine, `all` on every one); the table or the
    JSON; the exit code. This run's counterexamples go to a new dir (removed if the run is cut short with none)."""
    if engine is not None and engine != "all" and engine not in SERVING_ENGINES:
        raise UsageError(f"verify --engine {engine!r}: expected all or one of {', '.join(SERVING_ENGINES)}")
    beside = EngineLayer.start(budget, full) if engine is None else None  # (most of both waits on budgets, builds)
    rows: list[dict] = []
    out_dir = tempfile.mkdtemp(prefix="shardcheck-verify-")
    out_dirs = [out_dir]
    try:
        if engine is not None:
            _engine_steps(rows, budget, out_dir, None if engine == "all" else engine, full)
        else:
            _steps(rows, budget, out_dir, full)
            engine_rows, engine_dir = beside.rows()
            rows += engine_rows
            out_dirs += [engine_dir] if engine_dir else []
    except BaseException:  # (Ctrl-C, a crash: no empty dir left behind)
        with contextlib.suppress(OSError):
            os.rmdir(out_dir)
        raise
    return _report(rows, as_json, out_dirs)


def _steps(rows: list[dict], budget: float, out_dir: str, full: bool) -> None:
    """Every step but the engine layer's, in order, into `rows`."""
    import proofs
    from model.protocols import REFERENCE_PROTOCOLS
    from model.variants import DEMO_VARIANTS
    from shardcheck.check_cmd import run_check
    from shardcheck.replay_cmd import run_replay
    from shardcheck.corpus import CORPUS

    def prove() -> tuple[str, str]:
        results = proofs.run_all(seeds=10)
        bad = [r["theorem"] for r in results if r["result"] != r["expected"]]
        worst = max(r["seconds"] for r in results)
        return ("as expected" if not bad else "unexpected"), (
            f"{len(results)} theorems/refutations on 10 seeds, max {worst:.2f} s" + (f"; off: {bad}" if bad else ""))

    _step(rows, "Z3 proofs (T1-T5, flawed variants)", "as expected", prove)

    def check(spec: str, client: str | None = None, secs: float = budget,
              demo: bool = False) -> Callable[[], tuple[str, str]]:
        def go() -> tuple[str, str]:
            r = run_check(spec, client, budget=secs, out_dir=out_dir)
            props = sorted({v["property"] for v in r["violations"]})
            verdict = _by_first(r) if demo else r["verdict"]  # (a demo: the property it is found by)
            if props:
                return verdict, f"{r['stats']['cases']} cases; {', '.join(props)}"
            return verdict, _coverage(r["stats"]["coverage"], r["stats"]["cases"])
        return go

    for name in REFERENCE_PROTOCOLS:  # (each held for 15 s in the newcomer's run: the budget given with --full)
        _step(rows, f"check {name} (model)", "held", check(name, secs=budget if full else min(budget, 15)))
    for variant, prop in DEMO_VARIANTS.items():
        ref = f"{variant.__module__}:{variant.__name__}"
        _step(rows, f"check demo {variant.__name__} -> {prop}", f"violated: {prop}",
              check(ref, secs=min(budget, 10), demo=True))

    from properties.bad_stores import BAD_STORES  # what one client's op-by-op checks cannot see: caught too
    for bad, (_, prop) in BAD_STORES.items():
        if prop not in ("wrong-key", "shared-tier", "retention"):
            continue  # (the other store demos are caught by tests/test_properties_stores.py)
        spec = f"properties.bad_stores:{bad.replace('-', '_')}_factory"
        _step(rows, f"check store client {bad} -> {prop}", f"violated: {prop}",
              check(None, spec, secs=min(budget, 10), demo=True))

    from properties.bad_stores import RACY_STORES  # the concurrent layer: racy clients caught, a correct one holds
    # (by any property: `check` meets a race in its earlier strategies too, e.g. the lost wake-up as the `store-hang` of
    # a scenario's burst of async reads; tests/test_concurrency.py holds each to its own property in its layer)
    for racy, (_, prop) in RACY_STORES.items():
        spec = f"properties.bad_stores:{racy.replace('-', '_')}_factory"
        _step(rows, f"check racy client {racy} -> {prop}", "violated", check(None, spec, secs=min(budget, 60)))
    _step(rows, "check correct jittery client", "held", check(None, "properties.bad_stores:jitter_factory",
                                                               secs=min(budget, 10)))

    def processes(spec: str) -> Callable[[], tuple[str, str]]:
        def go() -> tuple[str, str]:
            r = run_check(spec, None, budget=min(budget, 15), out_dir=out_dir, runner="processes")
            props = sorted({v["property"] for v in r["violations"]})
            return _by_first(r), f"{r['stats']['cases']} cases on rank processes (gloo)" + (
                f"; {', '.join(props)}" if props else "")
        return go

    _step(rows, "check paper --runner processes (gloo collectives)", "held", processes("paper"))
    _step(rows, "check demo EarlyExitOnMiss --runner processes -> desync", "violated: desync",
          processes("model.variants:EarlyExitOnMiss"))

    _scale_tier_manifest_steps(rows, out_dir)
    for client in (*by_verdict(CLIENTS, "violated"), *by_verdict(CLIENTS, "held")):
        expect = CLIENTS[client].expect
        _step(rows, f"check paper on {client} ({'stock' if expect == 'violated' else 'fixed'}, real Valkey)", expect,
              lambda client=client: _child_check(client, budget, out_dir))

    _mooncake_steps(rows, budget, out_dir)

    from shardcheck.verify_nemesis import nemesis_steps  # real faults on the servers (--nemesis)
    nemesis_steps(lambda name, expected, fn: _step(rows, name, expected, fn), out_dir=out_dir, budget=budget, full=full)

    # (the corpus on the in-memory client and on the fixed clients; with `full`, on the stock ones too: minutes)
    for client in corpus_clients(CLIENTS) if full else (*corpus_clients(CLIENTS, real=False),
                                                        *by_verdict(CLIENTS, "held")):
        def replay(client: str = client) -> tuple[str, str]:
            res = run_replay([str(CORPUS)], client)
            off = [r["path"] for r in res if not r["matches"]]
            return ("as expected" if not off else "unexpected"), f"{len(res)} traces" + (f"; off: {off}" if off else "")
        _step(rows, f"replay corpus --expect on {client}", "as expected", replay)


@attrs.define
class EngineLayer:
    """The engine layer's steps (`verify --engine all --json`) in a child process started first and run beside the
    others; its rows join the table at the end (its progress lines go to stderr as they come). Bounded: past
    `ENGINE_LAYER_SECONDS` it is stopped and the layer is one failed row; Ctrl-C and the exit end it
    (`runtime.reaper.stop_child`)."""

    proc: subprocess.Popen
    out: Any
    bound: float
    started: float

    @classmethod
    def start(cls, budget: float, full: bool) -> "EngineLayer":
        from shardcheck.verify_nemesis import ROOT
        print("... the engine layer (verify --engine all), in a child process beside the steps below",
              file=sys.stderr, flush=True)
        out = tempfile.TemporaryFile(mode="w+", encoding="utf-8")  # (not a pipe: nobody reads it until the end)
        args = [sys.executable, "-m", "shardcheck", "verify", "--engine", "all", "--json", "--budget", str(budget)]
        proc = subprocess.Popen(args + (["--full"] if full else []), stdout=out, cwd=ROOT)
        reaper.register(proc, lambda: reaper.stop_child(proc), bound=40.0)  # (grace, SIGINT, kill)
        return cls(proc, out, ENGINE_LAYER_SECONDS * (3 if full else 1), time.monotonic())

    def rows(self) -> tuple[list[dict], str | None]:
        """Its rows and where its counterexamples went (waiting for it, within its bound)."""
        name = "the engine layer (verify --engine all, beside the other steps)"
        try:
            code = self.proc.wait(max(1.0, self.started + self.bound - time.monotonic()))
        except subprocess.TimeoutExpired:
            code = None
        finally:
            reaper.stop_child(self.proc, grace=0.0)
            reaper.unregister(self.proc)
        self.out.seek(0)
        text = self.out.read()
        self.out.close()
        start = text.find("{")
        try:
            got = json.loads(text[start:]) if code is not None and start >= 0 else None
        except json.JSONDecodeError:
            got = None
        if got is None:
            why = (f"did not end within {self.bound:g} s (stopped)" if code is None
                   else f"ended with exit {code} and no result")
            return [{"step": name, "expected": "as expected", "got": "error", "ok": False, "detail": why,
                     "seconds": round(time.monotonic() - self.started, 1)}], None
        return got["steps"], (got.get("out_dirs") or [None])[0]


#: The most seconds the engine layer's child may take (three times that with `--full`); it took 3.5 min beside the
#: other steps on two cores.
ENGINE_LAYER_SECONDS = 1200.0


def _scale_tier_manifest_steps(rows: list[dict], out_dir: str) -> None:
    """The explorer on worker processes, the tier measured with the cost model, the explorer's manifest."""
    def explore_workers() -> tuple[str, str]:
        from checking.explore.shards import ShardSpec
        from checking.explore.workers import explore_workers as run
        res = run(ShardSpec(protocol="paper", n_ranks=6, n_chunks=12, lazy=True), 2, timeout=300)
        return res.verdict, f"{res.states:,} states in {res.seconds:.1f} s on {res.workers} worker processes"

    _step(rows, "explore paper N=6 K=12 1 fault, lazy, 2 workers", "held", explore_workers)

    def tier() -> tuple[str, str]:
        import argparse
        from shardcheck.tier_cmd import add_arguments, run_tier
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        r = run_tier(parser.parse_args(["--plots", out_dir]))
        name, best = max(r["verdict"]["by_setup"].items(), key=lambda kv: kv[1]["B"])
        pays = (f"a hit pays above {best['break_even_tokens']:,.0f} tokens" if best["pays"]
                else "no prompt length makes a hit pay")
        return "measured", (f"best {name}: B = {best['B'] / 1e9:.2f} GB/s vs B* = {r['verdict']['B_star'] / 1e9:.2f} "
                            f"GB/s, {pays}; T0 {r['measured']['t0'] * 1e3:.1f} ms; {r['cores']} cores")

    _step(rows, "tier: LMCache on embedded Valkey, the cost model applied", "measured", tier)

    def manifest() -> tuple[str, str]:
        import io
        from checking import manifest as explore_manifest
        report = io.StringIO()
        bad = explore_manifest.check(out=report)
        n = len(explore_manifest.load()["entries"])
        return ("no drift" if not bad else "drift"), (report.getvalue().strip().replace("\n", "; ")
                                                       if bad else f"{n} entries match")

    _step(rows, "explorer manifest", "no drift", manifest)


def _report(rows: list[dict], as_json: bool, out_dirs: list[str]) -> int:
    """The table (or the JSON: `ok`, `steps`, `out_dirs`, where this run's counterexamples went); the exit code."""
    ok = all(r["ok"] for r in rows)
    if as_json:
        print_json({"ok": ok, "steps": rows, "out_dirs": out_dirs})
    else:
        w = max(len(r["step"]) for r in rows)
        e = max(12, *(len(r[k]) for r in rows for k in ("expected", "got")))
        print(f"\n{'step':<{w}}  {'expected':<{e}} {'got':<{e}} {'s':>6}  detail")
        for r in rows:
            mark = "" if r["ok"] else "  <-- FAILED"
            print(f"{r['step']:<{w}}  {r['expected']:<{e}} {r['got']:<{e}} {r['seconds']:>6}  {r['detail'][:130]}{mark}")
        print(f"\nverify: {'ALL AS EXPECTED' if ok else 'SOME STEPS FAILED'} "
              f"({sum(r['ok'] for r in rows)}/{len(rows)}); counterexamples of this run under {' and '.join(out_dirs)}")
    return EXIT_HELD if ok else EXIT_VIOLATED


def _mooncake_steps(rows: list[dict], budget: float, out_dir: str) -> None:
    """The Mooncake store client (stock: violated) and vLLM's MooncakeStoreConnector rank-keyed lookup (stock and the
    every-rank patch hold, the any-rank patch breaks engine-soundness); `skipped` with the reason where Mooncake
    cannot run (`adapters.mooncake_servers.unavailable`)."""
    from adapters.mooncake_servers import unavailable

    reason = unavailable()
    if reason:
        for name in ("check paper on the Mooncake client", "vLLM MooncakeStoreConnector lookup"):
            rows.append({"step": name, "expected": "skipped", "got": "skipped", "ok": True, "detail": reason,
                         "seconds": 0.0})
        return
    name = next(n for n, e in CLIENTS.items() if e.ref.startswith("adapters.mooncake_store:"))
    _step(rows, f"check paper on {name} (stock, Mooncake masters)", "violated",
          lambda: _child_check(name, budget, out_dir))

    def lookup() -> tuple[str, str]:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        run = reaper.run_child([sys.executable, "-m", "adapters.vllm_stack.mooncake_lookup"], timeout=600, cwd=root)
        got = json.loads(run.stdout.strip().splitlines()[-1])
        ok = not got["stock"] and "engine-soundness" in got["any_rank"] and not got["every_rank"]
        return ("as expected" if ok else "unexpected"), (
            f"stock {got['stock'] or 'held'}; any-rank patch {got['any_rank']}; every-rank patch "
            f"{got['every_rank'] or 'held'}")
    _step(rows, "vLLM MooncakeStoreConnector lookup over PCP rank keys (any-rank patch -> engine-soundness)",
          "as expected", lookup)


def _child_check(client: str, budget: float, out_dir: str) -> tuple[str, str]:
    """`check --protocol paper --client CLIENT` in a child process (real faults are on by default for it: a crash of
    LMCache's native code after them must not lose the table)."""
    from shardcheck.verify_nemesis import in_child
    r = in_child("check", "--protocol", "paper", "--client", client, "--budget", str(budget), "--out", out_dir)
    props = sorted({v["property"] for v in r["violations"]})
    return r["verdict"], (f"{r['stats']['cases']} cases; {', '.join(props)}" if props
                          else _coverage(r["stats"]["coverage"], r["stats"]["cases"]))


def _coverage(c: dict, cases: int) -> str:
    """What a `held` covered, in a table cell: the enumeration's box, the explorer's last size, Hypothesis, paths."""
    parts = [f"{cases:,} cases"]
    box = c.get("enumerate", {}).get("exhausted")
    if box:
        parts.append(f"exhausted {box['ranks']}x{box['chunks']}")
    explored = c.get("explore", {}).get("exhausted") or []
    if explored:
        parts.append(f"explored up to {explored[-1]['ranks']}x{explored[-1]['chunks']}/{explored[-1]['faults']}f")
    if "hypothesis" in c:
        parts.append(f"{c['hypothesis']['rule_steps']:,} hyp. steps")
    if "paths" in c:
        parts.append("paths " + "/".join(c["paths"]))
    return "; ".join(parts)


def cmd_verify(args: Any) -> int:
    return run_verify(budget=args.budget, as_json=args.json, engine=getattr(args, "engine", None),
                      full=getattr(args, "full", False))
