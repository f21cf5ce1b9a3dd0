"""`verify`'s engine layer runs in a child process beside the other steps (`shardcheck.verify.EngineLayer`): its rows
join the table, and a child that hangs or dies is one failed row, never a lost table or a process left behind."""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time

from shardcheck.verify import EngineLayer


def _layer(code: str, bound: float = 60.0) -> EngineLayer:
    out = tempfile.TemporaryFile(mode="w+", encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=out)
    return EngineLayer(proc, out, bound, time.monotonic())


def test_its_rows_and_counterexample_dir_join_the_table():
    row = {"step": "check --engine x", "expected": "held", "got": "held", "ok": True, "detail": "", "seconds": 1.0}
    result = json.dumps({"ok": True, "steps": [row], "out_dirs": ["/tmp/e"]})
    layer = _layer(f"print('a line a dependency printed'); print({result!r})")
    assert layer.rows() == ([row], "/tmp/e")


def test_a_child_past_its_bound_is_killed_and_is_one_failed_row():
    layer = _layer("import time; time.sleep(600)", bound=1.0)
    t = time.monotonic()
    rows, out_dir = layer.rows()
    assert time.monotonic() - t < 30 and layer.proc.poll() is not None and out_dir is None
    assert [(r["got"], r["ok"]) for r in rows] == [("error", False)] and "did not end within 1 s" in rows[0]["detail"]


def test_a_child_that_dies_without_a_result_is_one_failed_row():
    rows, _ = _layer("import sys; sys.exit(3)").rows()
    assert not rows[0]["ok"] and rows[0]["detail"] == "ended with exit 3 and no result"
