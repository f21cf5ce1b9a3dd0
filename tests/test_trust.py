"""A user's own client on a user's own tier: a racy finding is judged by its rate (no false `fixed`), a tier that
cannot be reached is exit 2 with one line, and a factory over the user's servers is checked within them."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from adapters.valkey_servers import start_servers
from shardcheck.replay_cmd import run_replay
from shardcheck.targets import parse_options
from shardcheck.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]
RACY = "tests.user_clients:shared_reply_factory"
CORRECT = "tests.user_clients:locked_reply_factory"
USER = "tests.user_clients:valkey_factory"
#: The same client with a factory that wants exactly one url per rank (issue 28: `factory(1)` was called with both).
STRICT = "tests.user_clients:strict_valkey_factory"


def sc(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shardcheck", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def racy_trace(tmp_path_factory) -> str:
    """The trace `check` saves of the racy client."""
    out = tmp_path_factory.mktemp("racy")
    r = sc("check", "--client", RACY, "--budget", "10", "--json", "--out", str(out))
    assert r.returncode == 1, r.stderr[-2000:]
    return json.loads(r.stdout)["violations"][0]["counterexample"]


def test_a_racy_finding_records_its_rate_and_never_replays_fixed_on_the_unchanged_client(racy_trace):
    """check measures a racy client's finding on fresh stores before saving it, and records the client's source;
    replayed 10 times on the unchanged client it is never `fixed` (it reproduces, or on a machine loaded enough to
    hide the race it is `undecided`, saying the source is unchanged), and on the client with the race fixed it is
    `fixed`, the racy client having shown it beside it in the same replay."""
    path = racy_trace
    rate = json.loads(Path(path).read_text())["config"]["rate"]
    assert 1 <= rate["k"] <= rate["n"] >= 2 and not rate.get("deterministic"), rate
    assert json.loads(Path(path).read_text())["config"]["source"] == _source(RACY)
    rows = [run_replay([path])[0] for _ in range(10)]
    # (on a loaded machine the race can fall far below its recorded rate: the unchanged client is then `undecided`)
    assert all(r["outcome"] == "reproduces" or (r["outcome"] == "undecided" and "source unchanged" in r["why"])
               for r in rows), [(r["outcome"], r["why"]) for r in rows]
    (row,) = run_replay([path], CORRECT)
    if rate["k"] < rate["n"]:  # (a race measured as one: the racy client it records runs beside it, the control)
        assert row["outcome"] == "fixed" and row["candidate"]["k"] == 0 and row["control"]["k"] >= 7, row
        assert row["control"]["subject"] == RACY and "Fisher" in row["why"], row
    else:  # (on a quiet machine the race showed in every run: judged as a deterministic trace is, by clean runs)
        assert row["outcome"] == "fixed" and row["control"] is None and "as for a deterministic trace" in row["why"]


def _source(spec: str) -> str:
    from runtime.registry import load_attr
    from runtime.source import source_digest
    return source_digest([load_attr(spec, "client")])


@pytest.mark.parametrize("source,outcome", [("now", "undecided"), ("edited", "fixed"), (None, "fixed")])
def test_a_race_the_unchanged_recorded_client_does_not_show_is_undecided_never_fixed(tmp_path, racy_trace, source,
                                                                                     outcome):
    """A racy trace replayed on the client it records, which does not show it: with the source the trace records
    still there, the machine is what changed (`undecided`, exit 4); with that source edited since (the user's patch
    made in place), or none recorded, the clean runs its rate asks say `fixed`."""
    trace = json.loads(Path(racy_trace).read_text())
    trace["client"] = CORRECT  # (recorded on the correct client: it never shows the race)
    trace["config"]["rate"] = {"k": 1, "n": 2}
    if source is None:
        del trace["config"]["source"]
    else:
        trace["config"]["source"] = _source(CORRECT) if source == "now" else "0" * 16
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))
    (row,) = run_replay([path])
    assert row["outcome"] == outcome and row["control"] is None, row
    if outcome == "undecided":
        assert "its source unchanged" in row["why"] and "nothing was fixed" in row["why"], row["why"]
        r = sc("replay", str(path))
        assert r.returncode == 4, r.stdout[-2000:] + r.stderr[-2000:]


def test_a_tier_that_cannot_be_reached_is_exit_2_in_one_line_and_writes_nothing(tmp_path):
    """A factory over servers that are down: exit 2, one line naming the client and the cause, no counterexample."""
    servers = start_servers(2)
    urls = ",".join(servers.urls)
    servers.stop()
    out = tmp_path / "found"
    r = sc("check", "--client", USER, "--client-option", f"urls={urls}", "--budget", "5", "--out", str(out))
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "cannot be reached" in lines[0] and USER in lines[0] and "Traceback" not in r.stderr
    assert not out.exists()


def test_pytest_properties_on_a_down_tier_is_exit_2(tmp_path):
    """The pytest plugin refuses an unreachable tier the same way, before any property runs."""
    servers = start_servers(1)
    url = servers.urls[0]
    servers.stop()
    r = subprocess.run([sys.executable, "-m", "pytest", "properties/test_store_layer.py", "-q", "-p", "no:cacheprovider",
                        "--client", USER, "--client-option", f"urls={url}", "--found-dir", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "cannot be reached" in r.stdout + r.stderr, r.stdout[-2000:] + r.stderr[-2000:]


@pytest.mark.real
@pytest.mark.parametrize("factory", [USER, STRICT])
def test_a_factory_over_the_users_two_servers_is_checked_within_them(tmp_path, factory):
    """`--client-option urls=a,b --max-ranks 2`: every engine stays within the two servers, and the client holds,
    also when the factory wants exactly one url per rank (every layer hands a call of n ranks its n urls)."""
    with start_servers(2) as servers:
        r = sc("check", "--client", factory, "--client-option", f"urls={','.join(servers.urls)}", "--max-ranks", "2",
               "--budget", "12", "--json", "--out", str(tmp_path))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    data = json.loads(r.stdout)
    cov = data["stats"]["coverage"]
    assert data["verdict"] == "held" and cov["scenarios"]["scenarios"], cov
    for engine in ("enumerate", "random"):
        if cov.get(engine, {}).get("largest"):
            assert cov[engine]["largest"][0] <= 2, cov[engine]


def test_a_factory_call_gets_the_urls_of_its_own_ranks():
    """The one derivation of a call's urls: the first n of the user's for n ranks, rank r's alone in rank r's process,
    and a list too short for the call handed as given (one shared server, or the factory's own refusal)."""
    from adapters.rank_process import _make_store
    from model.store import MemoryStore
    from runtime.registry import Client, options_for_ranks
    urls = ["redis://a:1", "redis://b:2", "redis://c:3"]
    assert options_for_ranks({"urls": urls, "x": 1}, 2) == {"urls": urls[:2], "x": 1}
    assert options_for_ranks({"urls": urls}, 1, first=2) == {"urls": urls[2:]}
    assert options_for_ranks({"urls": urls[:1]}, 2) == {"urls": urls[:1]}
    assert options_for_ranks({"op_timeout": 1.0}, 2) == {"op_timeout": 1.0}
    calls: list = []

    def factory(n_ranks, urls=None):
        calls.append((n_ranks, urls))
        return [MemoryStore() for _ in range(n_ranks)]
    client = Client(name="rec", factory=factory, in_memory=True)
    client.stores(1, urls=urls)
    client.stores(3, urls=urls)
    _make_store(client, 1, {"urls": urls}, 1.0)
    assert calls == [(1, urls[:1]), (3, urls), (1, urls[1:2])]


def test_client_options_parse_as_json_or_text_and_unknown_ones_are_refused():
    """Values that parse as JSON are JSON, `urls` is a comma list; an option a named client does not take is exit 2."""
    got = parse_options(["urls=redis://a:1, redis://b:2", "use_mla=true", "topology=shared", "op_timeout=0.5"])
    assert got == {"urls": ["redis://a:1", "redis://b:2"], "use_mla": True, "topology": "shared", "op_timeout": 0.5}
    for bad in (["nokey"], ["urls="], ["a=1", "a=2"]):
        with pytest.raises(UsageError):
            parse_options(bad)
    r = sc("check", "--client", "lmcache", "--client-option", "colour=blue", "--budget", "1")
    assert r.returncode == 2 and "unknown option 'colour'" in r.stderr, r.stderr
    r = sc("check", "--max-ranks", "0", "--budget", "1")
    assert r.returncode == 2 and "--max-ranks" in r.stderr
