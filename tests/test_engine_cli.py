"""The command line with `--engine`: bad input is one line and exit 2; `check --engine lmcache` finds a violation and
saves an engine trace that `replay` judges `reproduces` on lmcache and `fixed` on lmcache-patched, and `show` draws."""
import json

import pytest

from checking.layers import ReplayOn
from checking.replay import ENGINE_MAX_RUNS, clean_runs
from model.trace import Trace
from tests.conftest import default_signals, run_cli


@pytest.mark.parametrize("args, says", [
    (["check", "--engine", "nope"], "engine 'nope'"),
    (["check", "--engine", "lmcache", "--engine-option", "bogus=1"], "takes no option 'bogus'"),
    (["check", "--engine", "lmcache", "--engine-option", "ranks=0"], "ranks=0"),
    (["check", "--engine", "lmcache", "--engine-patch", "no_such_module:fn"], "no_such_module"),
    (["check", "--engine", "lmcache", "--client", "lmcache"], "takes no --protocol, --client"),
    (["check", "--engine-patch", "adapters.engine_demos:take_max"], "need --engine"),
    (["check", "--engine", "lmcache", "--engine-option", "urls=127.0.0.1:1"], "cannot be reached"),
    (["check", "--engine", "lmcache", "--nemesis", "all"], "strike their own"),
    # bad values of the options an engine takes are refused when parsed, naming the option (never a traceback)
    (["check", "--engine", "lmcache", "--engine-option", "lookup_timeout_ms=abc"], "lookup_timeout_ms='abc'"),
    (["check", "--engine", "lmcache-patched", "--engine-option", "lookup_timeout_ms=0"], "lookup_timeout_ms=0"),
    (["check", "--engine", "lmcache", "--engine-option", "close_timeout=-1"], "close_timeout=-1"),
    (["check", "--engine", "lmcache", "--engine-option", "close_timeout=soon"], "close_timeout='soon'"),
    (["check", "--engine", "lmcache", "--engine-option", "urls=garbage"], "urls='garbage'"),
    (["check", "--engine", "lmcache", "--engine-option", "urls=127.0.0.1:1,h:port"], "urls='127.0.0.1:1,h:port'"),
    (["check", "--engine", "lmcache", "--engine-option", "urls=127.0.0.1:1", "--max-ranks", "2"],
     "urls names 1 server(s)"),
])
def test_bad_engine_input_is_exit_2(args, says):
    got = run_cli(*args, "--budget", "5", timeout=60)
    assert got.returncode == 2 and says in got.stderr, (got.returncode, got.stderr[-400:])
    assert len(got.stderr.strip().splitlines()) == 1


@pytest.mark.real
def test_a_sync_client_that_memoises_per_request_id_is_found_by_its_property_in_the_first_cases(tmp_path):
    """A scheduler-side sync client that answers a request id it has looked up before from a memo (the engine demo
    `memoise_sync_lookup`, on lmcache-patched, which holds without it: stock LMCache's own close never returns and
    is found first on every case) is found by engine-completeness among the first cases of the enumeration: one
    request looked up before its prompt is stored and again after (it was found at case ~100 when the enumeration
    looked a request id up again only in its disturbed shapes). Counted in cases, not timed (the budget is room for
    importing LMCache and building the first deployments on a loaded machine)."""
    from checking.serving.engine_cases import FIRST_CASES
    got = run_cli("check", "--engine", "lmcache-patched", "--lookup", "sync", "--engine-patch",
                  "adapters.engine_demos:memoise_sync_lookup", "--budget", "90",
                  "--json", "--out", str(tmp_path), timeout=300)
    assert got.returncode == 1, got.stderr[-2000:]
    result = json.loads(got.stdout)
    assert result["violations"][0]["property"] == "engine-completeness", result["violations"]
    cases = result["stats"]["coverage"]["engine-cases"]
    assert result["stats"]["counterexample"]["strategy"] == "engine-cases" and cases["cases"] <= FIRST_CASES, cases


@pytest.mark.real
def test_check_engine_lmcache_finds_saves_and_replays(tmp_path):
    """Stock LMCache's async path violates an engine property within a short budget; the trace reproduces on it and
    is fixed on lmcache-patched."""
    # (the budget counts importing LMCache and building the first deployment: 10-20 s on a loaded machine)
    got = run_cli("check", "--engine", "lmcache", "--lookup", "async", "--budget", "30", "--json", "--out",
                  str(tmp_path), timeout=240)
    assert got.returncode == 1, got.stderr[-2000:]
    result = json.loads(got.stdout)
    assert result["engine"] == "lmcache" and result["verdict"] == "violated"
    # (a replay is never capped: a finding the short budget measured as racy could ask the patched engine for
    # hundreds of runs; the first one a replay can clear in ENGINE_MAX_RUNS is judged here)
    on = ReplayOn()
    first = next((v for v in result["violations"]
                  if clean_runs(Trace.load(v["counterexample"]), on)[0] <= ENGINE_MAX_RUNS), None)
    assert first is not None, result["violations"]
    assert first["property"].startswith("engine-") or first["property"] == "pins"
    trace = Trace.load(first["counterexample"])
    assert trace.kind == "engine" and trace.config["engine"] == "lmcache" and trace.config["rate"]["k"] >= 1
    assert len(trace.config["source"]) == 16  # (the engine factory's module: a replay can tell it unchanged)
    shown = run_cli("show", first["counterexample"], "--engine", "lmcache-patched", timeout=60)
    assert shown.returncode == 0 and ">>" in shown.stdout and "engine lmcache" in shown.stdout
    rows = {}
    for engine in ("lmcache", "lmcache-patched"):
        rep = run_cli("replay", first["counterexample"], "--engine", engine, "--json", timeout=300)
        rows[engine] = json.loads(rep.stdout)["results"][0]
    assert rows["lmcache"]["outcome"] == "reproduces", rows["lmcache"]
    assert rows["lmcache-patched"]["outcome"] == "fixed", rows["lmcache-patched"]


@pytest.mark.real
@pytest.mark.parametrize("runner, presses", [("in-process", 1), ("processes", 1), ("in-process", 2)])
def test_ctrl_c_during_check_engine_leaves_nothing_behind(tmp_path, runner, presses, request):
    """Ctrl-C (SIGINT to the process group, once, or twice 0.3 s apart: a second one lands in the clean-up) during
    `check --engine lmcache`: exit 130, no process of the run left (servers, rank processes, the forkserver),
    nothing left in its temp dir (sockets, server dirs). (A Ctrl-C at each point of a server's start:
    tests/test_adapters_servers.py.)"""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    import shutil
    import tempfile
    tmp = Path(tempfile.mkdtemp(prefix="sc-", dir="/tmp"))  # (ZMQ socket paths must stay within 107 bytes)
    request.addfinalizer(lambda: shutil.rmtree(tmp, ignore_errors=True))
    args = [sys.executable, "-m", "shardcheck", "check", "--engine", "lmcache", "--lookup", "sync", "--budget", "60",
            "--out", str(tmp_path / "found")] + (["--runner", "processes"] if runner == "processes" else [])
    p = subprocess.Popen(args, cwd=root, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, "TMPDIR": str(tmp), "SHARDCHECK_ENGINE_TRACE": "1"},
                         preexec_fn=default_signals)
    try:
        said = []
        for line in p.stderr:  # the first case ran: servers, engines and sockets exist
            said.append(line)
            if line.startswith("[engine]"):
                break
        os.killpg(p.pid, signal.SIGINT)
        for _ in range(presses - 1):
            time.sleep(0.3)
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGINT)
        code = p.wait(30)
        assert code == 130, "".join(said)[-2000:] + p.stderr.read()[-2000:]
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
        p.stderr.close()

    def group() -> list[str]:
        out = subprocess.run(["ps", "-eo", "pgid="], capture_output=True, text=True).stdout.split()
        return [g for g in out if g == str(p.pid)]

    for _ in range(300):
        if not group():
            break
        time.sleep(0.1)
    assert group() == []
    assert sorted(str(q.relative_to(tmp)) for q in tmp.rglob("*")) == []


@pytest.mark.real
def test_a_temp_dir_too_long_for_zmq_sockets_is_one_line_and_exit_2(tmp_path):
    """LMCache's ipc socket names must fit `sockaddr_un`: a TMPDIR too long for them is unusable input, said in
    one line before any engine is built (not a traceback from deep inside LMCache)."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    deep = tmp_path / ("d" * 90)
    deep.mkdir()
    r = subprocess.run([sys.executable, "-m", "shardcheck", "check", "--engine", "lmcache", "--lookup", "sync",
                        "--budget", "30", "--out", str(tmp_path / "found")], cwd=Path(__file__).resolve().parents[1],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "TMPDIR": str(deep)})
    assert r.returncode == 2, r.stderr[-2000:]
    assert "TMPDIR" in r.stderr and "too long" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]


@pytest.mark.real
def test_pytest_properties_engine_writes_a_minimised_measured_trace(tmp_path):
    """`pytest properties/ --engine lmcache`: the engine machine's failure is written as a trace cut down and measured
    on fresh deployments by the engine row's minimiser (`checking.serving.engine_search.serving_minimised`). Stock
    LMCache's close never returns on any deployment: the trace is cut to no steps and shows in every run measured."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    got = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:xdist",
                          "properties/test_engine_layer.py", "--engine", "lmcache", "--found-dir", str(tmp_path),
                          "--minimise-seconds", "20"], cwd=root, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "HYPOTHESIS_PROFILE": "dev"})
    assert got.returncode == 1, got.stdout[-2000:] + got.stderr[-2000:]
    (path,) = tmp_path.glob("*.json")
    trace = Trace.load(str(path))
    assert trace.kind == "engine" and trace.property == "engine-returns", trace.summary
    rate = trace.config["rate"]
    assert trace.config["case"]["steps"] == [] and rate["k"] == rate["n"] >= 3, (trace.config["case"], rate)
