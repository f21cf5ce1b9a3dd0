"""The `real.*` figures of `shardcheck bench`: wall seconds of the real runs, each in a fresh interpreter so
process start (Python, torch, LMCache imports, the forkserver) is included.

- `real.processes_case_s`: one `--runner processes` case (PaperProtocol, 4 ranks, 8 chunks, one eviction after
  the lookup) from interpreter start; `real.processes_warm_case_s`: the same case again in that process;
- `real.tier_s`: a full `shardcheck tier --json` on the embedded default servers, with its headline figures.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from runtime import reaper

__all__ = ["TARGETS", "measure_real"]

TARGETS = {"real.processes_case_s": 10.0, "real.tier_s": 90.0}
ROOT = Path(__file__).resolve().parents[1]

_CASE = """
import json, time
t = time.monotonic()
from adapters.processes import ProcessRunner
from model.faults import Eviction, FaultPlan
from model.outcome import Case
from model.protocols import PaperProtocol
def main():
    case = Case(4, 8, faults=FaultPlan.of(after_lookup=[Eviction(5)]))
    with ProcessRunner() as r:
        out = r.run(PaperProtocol(), case)
        first = time.monotonic()
        again = r.run(PaperProtocol(), case)
    print(json.dumps({"violations": out.violated() + again.violated(), "warm": time.monotonic() - first}))
if __name__ == "__main__":
    main()
"""


def _timed(argv: list[str], timeout: float) -> tuple[float, str]:
    start = time.monotonic()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = reaper.run_child(argv, timeout=timeout, cwd=ROOT, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])}... exited {done.returncode}: {done.stderr.strip()[-300:]}")
    return time.monotonic() - start, done.stdout


def measure_real() -> dict:
    """Every `real.*` figure (seconds; the tier's GB/s as it measured them)."""
    with tempfile.TemporaryDirectory(prefix="shardcheck-bench-") as tmp:
        script = Path(tmp) / "case.py"
        script.write_text(_CASE)
        case_s, out = _timed([sys.executable, str(script)], 120)
        case = json.loads(out.strip().splitlines()[-1])
        tier_s, out = _timed([sys.executable, "-m", "shardcheck", "tier", "--json", "--plots", tmp], 300)
    tier = json.loads(out)
    bw = tier["measured"]["bandwidth"]
    return {"processes_case_s": round(case_s, 3), "processes_warm_case_s": round(case["warm"], 3),
            "processes_case_violations": case["violations"], "tier_s": round(tier_s, 3), "cores": tier["cores"],
            "tier_shared_best_GBps": round(max(bw["shared"].values()) / 1e9, 3),
            "tier_per_rank_best_GBps": round(max(bw["per_rank"].values()) / 1e9, 3),
            "tier_t0_ms": round(tier["measured"]["t0"] * 1e3, 2)}
