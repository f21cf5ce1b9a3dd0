"""`shardcheck verify`'s real-fault steps: each known-bad client is caught by its property under a server pause, the
reference valkey-py client holds under every fault kind in `check`, lmcache-patched holds under every kind, and the
nemesis's findings in stock lmcache replay as recorded on every LMCache client.

The steps that drive LMCache through real faults run in a child process each (`in_child`): after stock lmcache's
native client has been through killed connections, a later garbage collection in the same process crashed it
(a segfault while the valkey:// connector closed, 1 of 3 runs of the four replays in one process), and one crash
must not lose the table.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

__all__ = ["nemesis_steps", "in_child"]

ROOT = Path(__file__).resolve().parents[1]


def in_child(*args: str, timeout: float = 900) -> Any:
    """`python -m shardcheck ARGS --json` in a child process: its JSON, or `RuntimeError` naming how it ended."""
    from runtime.reaper import run_child
    try:  # (on Ctrl-C it stops its servers and removes its dirs first: `run_child` never kills it first)
        out = run_child([sys.executable, "-m", "shardcheck", *args, "--json"], timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"shardcheck {args[0]} did not end within {timeout:g} s") from None
    start = out.stdout.find("{")
    if start < 0:
        raise RuntimeError(f"shardcheck {args[0]} ended with exit {out.returncode} and no result: "
                           f"{out.stderr.strip().splitlines()[-1:] or ''}")
    return json.loads(out.stdout[start:])


def nemesis_steps(step: Callable[[str, str, Callable[[], tuple[str, str]]], None], *, out_dir: str,
                  budget: float, full: bool = False) -> None:
    """Add the steps through `step(name, expected, fn)`: the nemesis findings replayed on the fixed clients (with
    `full`: on every client they are measured on)."""
    from adapters.nemesis_findings import CLIENTS, OUT_DIR
    from adapters.valkey_clients import NEMESIS_DEMOS
    from runtime.registry import by_verdict
    from shardcheck.tables import CLIENTS as registry_clients
    from shardcheck.check_cmd import run_check

    def check(client: str, kinds: str, secs: float) -> Callable[[], tuple[str, str]]:
        def go() -> tuple[str, str]:
            r = run_check(None, client, budget=secs, out_dir=out_dir, op_timeout=0.5, nemesis=kinds)
            props = sorted({v["property"] for v in r["violations"]})
            return r["verdict"], "; ".join(props) or r["stats"]["coverage"].get("nemesis", {}).get("text", "")
        return go

    for demo, (_, prop) in sorted(NEMESIS_DEMOS.items()):
        step(f"check --nemesis pause: {demo} client -> {prop}", "violated",
             check(f"adapters.valkey_clients:{demo.replace('-', '_')}_factory", "pause", min(budget, 15)))
    step("check --nemesis all: the reference valkey-py client", "held",
         check("adapters.valkey_clients:reference_factory", "all", max(budget, 30)))

    def patched(fixed: str) -> tuple[str, str]:
        r = in_child("check", "--client", fixed, "--nemesis", "all", "--budget", str(max(60.0, 3 * budget)),
                     "--out", out_dir)
        nem = r["stats"]["coverage"].get("nemesis", {})
        props = sorted({v["property"] for v in r["violations"]})
        return r["verdict"], "; ".join(props) or nem.get("text", "")
    for fixed in by_verdict(registry_clients, "held"):  # the fixed real clients hold through every fault
        step(f"check --nemesis all on {fixed} (real Valkey)", "held", lambda fixed=fixed: patched(fixed))

    from model.trace import Trace  # (on the clients the findings record an expectation for: LMCache's, over Valkey)
    expected = {name for path in OUT_DIR.glob("*.json") for name in Trace.load(path).expect}
    on = [c for c in CLIENTS if c in expected]
    for client in on if full else by_verdict({c: registry_clients[c] for c in on}, "held"):
        def replay(client: str = client) -> tuple[str, str]:
            res = in_child("replay", str(OUT_DIR), "--client", client)["results"]
            off = [r["path"] for r in res if not r["matches"]]
            return ("as expected" if not off else "unexpected"), f"{len(res)} traces" + (f"; off: {off}" if off else "")
        step(f"replay counterexamples/nemesis --expect on {client}", "as expected", replay)
