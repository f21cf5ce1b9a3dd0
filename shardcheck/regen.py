"""`shardcheck regen`: the one way to regenerate what the repository records as expected.

Targets (default: `manifest corpus z3`, which need nothing but the venv):
- `manifest`: the explorer's manifest, every entry re-explored (`checking/manifest.json`);
- `corpus`: the shrunk counterexample of every demo variant (`counterexamples/demo-*.json`); with `--real` each is
  also replayed on the real clients (real Valkey servers) and the outcomes recorded as their expectations;
- `z3`: the flawed variants' Z3 counterexamples as traces (`counterexamples/z3-*.json`);
- `findings`: the store-client findings of stock lmcache, deterministic and racy, and the nemesis's (through real
  faults on the servers: `counterexamples/nemesis/`), measured on every client
  (`counterexamples/lmcache-*.json`; real Valkey servers, a few minutes);
- `engine`: the engine-path findings of stock lmcache (`--engine`), found by the engine search, minimised, measured
  and replayed on lmcache-patched (`counterexamples/engine/*.json`; real engines, a quarter of an hour).

`--check` writes nothing: it reports each file that differs from what would be written, and exits 1 if any does.
"""
from __future__ import annotations

import argparse
import io
import sys
from typing import Any

from shardcheck.errors import EXIT_HELD, EXIT_VIOLATED, UsageError

__all__ = ["TARGETS", "DEFAULT_TARGETS", "add_arguments", "cmd_regen"]

TARGETS = ("manifest", "corpus", "z3", "findings", "engine")
DEFAULT_TARGETS = ("manifest", "corpus", "z3")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("targets", nargs="*", metavar="TARGET",
                   help=f"what to regenerate: {', '.join(TARGETS)} (default: {' '.join(DEFAULT_TARGETS)})")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 when a file would change (default: off)")
    p.add_argument("--real", action="store_true",
                   help="corpus: also measure each trace's expectation on the real clients (default: off)")


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _manifest(check: bool, real: bool) -> list[str]:
    from checking import manifest
    if check:
        report = io.StringIO()
        bad = manifest.check(out=report)
        return [line for line in report.getvalue().splitlines() if line.startswith("DRIFT")] if bad else []
    manifest.update(out=sys.stderr)
    return []


def _corpus(check: bool, real: bool) -> list[str]:
    from model.trace import Trace
    from shardcheck.corpus import CORPUS, REAL_CLIENTS, demo_traces, measure_real_expectations, without_real
    drift, written = [], []
    for name, trace in demo_traces().items():
        path = CORPUS / name
        if check:
            if not path.exists() or without_real(Trace.load(path)) != without_real(trace):
                drift.append(f"{path}: differs from the demo variant's shrunk counterexample")
            continue
        if path.exists():  # keep the real clients' measured expectations unless they are measured again
            measured = {c: o for c, o in Trace.load(path).expect.items() if c in REAL_CLIENTS}
            trace.expect = {**trace.expect, **measured}
        trace.save(path, overwrite=True)
        written.append(path)
        _say(f"wrote {path}")
    if real and written:
        measure_real_expectations(written)
    return drift


def _z3(check: bool, real: bool) -> list[str]:
    from proofs.traces import COUNTEREXAMPLE_DIR, z3_traces
    from runtime.registry import protocol_bug_expect
    from shardcheck.tables import CLIENTS
    drift = []
    for name, trace in z3_traces(expect=protocol_bug_expect(CLIENTS)).items():
        path = COUNTEREXAMPLE_DIR / name
        if check:
            if not path.exists() or path.read_text() != trace.dumps():
                drift.append(f"{path}: differs from the Z3 counterexample")
            continue
        trace.save(path, overwrite=True)
        _say(f"wrote {path}")
    return drift


def _findings(check: bool, real: bool) -> list[str]:
    from adapters import nemesis_findings, racy_findings, storeops_findings
    if check:
        raise UsageError("regen findings --check is not supported: the findings are measured on real servers "
                         "(replay them with `shardcheck replay counterexamples/lmcache-*.json --expect`)")
    storeops_findings.build(progress=_say)
    racy_findings.build(progress=_say)
    nemesis_findings.build(progress=_say)
    return []


def _engine(check: bool, real: bool) -> list[str]:
    from shardcheck.engine_findings import build
    if check:
        raise UsageError("regen engine --check is not supported: the findings are searched for and measured on real "
                         "engines (replay them with `shardcheck replay counterexamples/engine/ --expect`)")
    build(progress=_say)
    return []


_RUN = {"manifest": _manifest, "corpus": _corpus, "z3": _z3, "findings": _findings, "engine": _engine}


def cmd_regen(args: Any) -> int:
    targets = args.targets or list(DEFAULT_TARGETS)
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        raise UsageError(f"unknown target(s) {', '.join(unknown)}: expected {', '.join(TARGETS)}")
    drift: list[str] = []
    for target in dict.fromkeys(targets):
        _say(f"regen {target}{' --check' if args.check else ''} ...")
        drift += _RUN[target](args.check, args.real)
    for line in drift:
        print(line)
    if drift:
        print(f"{len(drift)} file(s) drifted; if intended, run `shardcheck regen {' '.join(targets)}` and review "
              "the diff", file=sys.stderr)
        return EXIT_VIOLATED
    return EXIT_HELD
