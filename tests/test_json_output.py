"""With `--json`, stdout carries the JSON alone, whatever a dependency or a child process writes to stdout; and
`replay --json` on a directory has a row per file, error rows included."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli

#: glide's and LMCache's own logging left at their defaults (glide's Rust core then logs WARN lines to stdout).
LOUD = {"SHARDCHECK_LMCACHE_LOGS": "1"}


def _json_of(done: subprocess.CompletedProcess) -> dict | list:
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError as exc:
        raise AssertionError(f"stdout is not JSON alone ({exc}):\n{done.stdout[:600]}\nstderr:\n{done.stderr[-600:]}")


def _cli(*args: str, timeout: float = 180, env: dict | None = None) -> subprocess.CompletedProcess:
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        return run_cli(*args, timeout=timeout)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_json_stdout_moves_every_other_writer_to_stderr(tmp_path):
    """Inside `json_stdout`, a print, a write to fd 1 and a child process's stdout land on stderr; only
    `print_json` reaches stdout."""
    program = (
        "import os, subprocess, sys\n"
        "from shardcheck.output import json_stdout, print_json\n"
        "with json_stdout(True):\n"
        "    print('a print')\n"
        "    os.write(1, b'a raw write\\n')\n"
        "    subprocess.run([sys.executable, '-c', 'print(\"a child\")'])\n"
        "    print_json({'ok': 1})\n"
        "print('after')\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    first, _, rest = done.stdout.partition("}\n")
    assert json.loads(first + "}") == {"ok": 1} and rest == "after\n"
    for text in ("a print", "a raw write", "a child"):
        assert text in done.stderr


def test_no_command_prints_json_past_print_json():
    """Every command's JSON goes through `shardcheck.output.print_json` (the one writer of the real stdout)."""
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "shardcheck").rglob("*.py")
                 if p.name not in ("output.py", "bench_real.py")  # bench_real: the program its child runs
                 and re.search(r"print\(json\.dumps", p.read_text())]
    assert offenders == []


@pytest.mark.real
def test_replay_directory_json_parses_with_glide_and_lmcache_logging_on(tmp_path):
    """The curated traces (the lmcache-valkey ones make glide's Rust core log to stdout), a malformed file and an
    empty store-ops trace: stdout is one JSON document with a row per file, the bad ones as error rows."""
    traces = tmp_path / "traces"
    # every kind of trace, property and client of the corpus, less two replays that only wait longer (6 s on a hang,
    # 2 s of racy runs) for a kind, property and client that another trace here covers
    slow = ("lmcache-async-miss-never-completes.json", "lmcache-sync-prefix-count-lost-completion.json")
    shutil.copytree(ROOT / "counterexamples", traces, ignore=shutil.ignore_patterns("found", "*.md", *slow))
    (traces / "zz-not-json.json").write_text("{nope")
    empty = json.loads((ROOT / "counterexamples" / "lmcache-missing-get-hangs.json").read_text())
    empty["ops"] = []
    (traces / "zz-no-ops.json").write_text(json.dumps(empty))
    done = _cli("replay", str(traces), "--json", env=LOUD)
    rows = _json_of(done)["results"]
    assert {Path(r["path"]).name for r in rows} == {p.name for p in traces.glob("*.json")}
    errors = {Path(r["path"]).name: r["why"] for r in rows if r["outcome"] == "error"}
    assert set(errors) == {"zz-not-json.json", "zz-no-ops.json"}
    assert "field 'ops'" in errors["zz-no-ops.json"] and "not valid JSON" in errors["zz-not-json.json"]
    assert done.returncode == 2


@pytest.mark.parametrize("args", [
    ("check", "--budget", "2", "--json"),
    ("prove", "--seeds", "1", "--json"),
    ("explore", "--protocol", "paper", "--ranks", "2", "--chunks", "2", "--json"),
    ("replay", "counterexamples/demo-early-exit-on-miss.json", "--json"),
], ids=lambda a: a[0])
def test_every_json_command_prints_json_alone(args):
    """check, prove, explore and replay: stdout parses as JSON."""
    _json_of(_cli(*args, env=LOUD))


@pytest.mark.real
def test_tier_json_parses(tmp_path):
    """tier (embedded servers, the real LMCache client, plots): stdout parses as JSON. (256 KB chunks, not the
    paper's 12 MB: what is written where does not depend on their size; filling 12 MB chunks took 7 s more.)"""
    data = _json_of(_cli("tier", "--seconds", "0.1", "--bytes-per-token", "1000", "--plots", str(tmp_path), "--json",
                         env=LOUD))
    assert "verdict" in data
