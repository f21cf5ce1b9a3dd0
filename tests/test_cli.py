"""The command line: exit codes 0/1/2, the JSON shape of check, replay, and a user's own protocol."""
import json
import re
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli as sc


def test_check_reference_holds_json(tmp_path):
    """check --json on the reference exits 0 with verdict held and the contract's keys, having run cases (how many
    depends on the machine: the budget counts the interpreter's start, seconds under load)."""
    r = sc("check", "--json", "--budget", "3", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert set(data) == {"protocol", "client", "verdict", "violations", "stats"}
    assert data["verdict"] == "held" and data["violations"] == [] and data["client"] == "model"
    assert data["stats"]["cases"] > 0


def test_check_variant_violated_with_counterexample(tmp_path):
    """check on a demo variant exits 1 and saves a trace naming the property; replay reproduces it."""
    r = sc("check", "--json", "--budget", "5", "--out", str(tmp_path), "--protocol", "model.variants:SkipEmptyGather")
    assert r.returncode == 1, r.stderr
    data = json.loads(r.stdout)
    assert data["verdict"] == "violated"
    v = data["violations"][0]
    assert v["property"] == "deadlock" and Path(v["counterexample"]).exists()
    assert json.loads(Path(v["counterexample"]).read_text())["property"] == "deadlock"
    rr = sc("replay", v["counterexample"], "--json")
    assert rr.returncode == 1 and json.loads(rr.stdout)["results"][0]["outcome"] == "reproduces"
    assert sc("replay", v["counterexample"], "--expect").returncode == 0


def test_budget_is_honoured(tmp_path):
    """check ends near its budget by itself: its engines use it up to the reserves kept at its end for a finding and
    the clean-up (`checking.check.Deadlines`; the last unit that would not fit is not started), and stop there (a
    generous bound tells that from a hang; the schedule itself is tested on a fake clock in tests/test_deadline.py)."""
    r = sc("check", "--budget", "3", "--json", "--out", str(tmp_path))
    assert r.returncode == 0 and 3 / 2 <= json.loads(r.stdout)["stats"]["seconds"] < 3 + 30


@pytest.mark.parametrize("args, needle", [
    (["check", "--protocol", "no_such_module:X"], "no_such_module"),
    (["check", "--protocol", "model.protocols:Nope"], "Nope"),
    (["check", "--client", "bogus"], "bogus"),
    (["check", "--budget", "0"], "--budget"),
    (["replay", "does/not/exist.json"], "does/not/exist.json"),
])
def test_unusable_input_exits_2_naming_it(args, needle):
    """Bad specs and paths exit 2 with a message naming what is wrong."""
    r = sc(*args)
    assert r.returncode == 2 and needle in r.stderr, r.stderr


def test_malformed_trace_exits_2_naming_file_and_field(tmp_path):
    """replay of a malformed trace exits 2 naming the file and the field."""
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "shardcheck-trace", "version": 1, "kind": "protocol"}))
    r = sc("replay", str(bad))
    assert r.returncode == 2 and "bad.json" in r.stderr and "summary" in r.stderr


def test_user_protocol_from_pythonpath(tmp_path):
    """A protocol written elsewhere against the contract is checked with --protocol mod:Class."""
    (tmp_path / "userproto.py").write_text(textwrap.dedent('''
        from model.effects import AllGather, AllReduceMin, Get, Put

        class Striped:
            name = "striped"
            def owner(self, chunk, n_ranks): return (chunk // 2) % n_ranks
            def key(self, chunk, chunk_hash, rank, n_ranks): return f"u:{chunk_hash}:{rank}"
            def rank_store(self, rank, n_ranks, hashes, kv):
                for c in range(len(hashes)):
                    if self.owner(c, n_ranks) == rank:
                        yield Put(self.key(c, hashes[c], rank, n_ranks), kv[c])
            def rank_lookup(self, rank, n_ranks, hashes, contains):
                for c in range(len(hashes)):
                    if self.owner(c, n_ranks) == rank and not contains(self.key(c, hashes[c], rank, n_ranks)):
                        return c
                return len(hashes)
            def combine(self, reports, n_chunks): return min(reports, default=n_chunks)
            def rank_load(self, rank, n_ranks, hashes, planned):
                got, fail = {}, planned
                for c in range(planned):
                    if self.owner(c, n_ranks) == rank:
                        v = yield Get(self.key(c, hashes[c], rank, n_ranks))
                        if v is None:
                            fail = c
                            break
                        got[c] = v
                u = yield AllReduceMin(fail)
                merged = {}
                for share in (yield AllGather({c: v for c, v in got.items() if c < u})):
                    merged.update(share)
                return merged
    '''))
    r = sc("check", "--json", "--budget", "2", "--out", str(tmp_path / "o"), "--protocol", "userproto:Striped",
           cwd=tmp_path, env_extra=[str(tmp_path)])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["protocol"] == "striped"


def test_broken_user_code_is_reported_not_crashed(tmp_path):
    """A combine that raises is a counterexample (exit 1); a factory returning too few stores exits 2."""
    (tmp_path / "broken.py").write_text(textwrap.dedent('''
        from model.protocols import PaperProtocol
        from model.store import MemoryStore

        class CombineRaises(PaperProtocol):
            name = "combine-raises"
            def combine(self, reports, n_chunks):
                raise ValueError("boom")

        def short_factory(n_ranks, **options):
            return [MemoryStore()]
    '''))
    r = sc("check", "--json", "--budget", "3", "--out", str(tmp_path / "o"), "--protocol", "broken:CombineRaises",
           env_extra=[str(tmp_path)])
    assert r.returncode == 1 and json.loads(r.stdout)["violations"][0]["property"] == "termination"
    r = sc("check", "--budget", "3", "--out", str(tmp_path / "o"), "--client", "broken:short_factory",
           env_extra=[str(tmp_path)])
    assert r.returncode == 2 and "broken:short_factory" in r.stderr, r.stderr


@pytest.mark.parametrize("args, named", [
    (["check", "--budget", "nan"], "--budget"),
    (["check", "--budget", "3", "--op-timeout", "0"], "--op-timeout"),
    (["prove", "--seeds", "0"], "--seeds"),
    (["replay", "counterexamples/demo-max-combine.json", "--protocol", "nosuch:X", "--expect"], "nosuch")])
def test_more_unusable_input_exits_2(args, named):
    """NaN budgets, a zero op timeout, zero seeds and an unimportable --protocol exit 2 with one line naming it."""
    r = sc(*args, timeout=60)
    assert r.returncode == 2 and named in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_check_minimises_a_store_ops_counterexample(tmp_path):
    """A store-client finding of check is cut down to a 1-minimal op sequence that still replays."""
    client = "properties.bad_stores:shared_server_factory"
    r = sc("check", "--json", "--budget", "6", "--out", str(tmp_path), "--client", client)
    assert r.returncode == 1, r.stderr
    data = json.loads(r.stdout)
    found = data["stats"]["counterexample"]
    cut = [re.match(r"minimised from (\d+) to (\d+) ops \(1-minimal\)", n) for n in found["notes"]]
    (before, saved), = [tuple(map(int, m.groups())) for m in cut if m]
    assert saved < before and found["ops"] == saved, found
    path = data["violations"][0]["counterexample"]
    trace = json.loads(Path(path).read_text())
    assert len(trace["ops"]) == saved and "minimised from" in trace["notes"] and trace["config"]["rate"]["k"] >= 1
    rr = sc("replay", path, "--client", client, "--json")
    assert rr.returncode == 1 and json.loads(rr.stdout)["results"][0]["outcome"] == "reproduces", rr.stderr


def test_replay_runs_the_recorded_client_with_no_flags(tmp_path):
    """A trace found on a MOD:ATTR client replays on that client with no --client, and the row names it."""
    client = "properties.bad_stores:shared_server_factory"
    r = sc("check", "--json", "--budget", "4", "--out", str(tmp_path), "--client", client)
    assert r.returncode == 1, r.stderr
    path = json.loads(r.stdout)["violations"][0]["counterexample"]
    rr = sc("replay", path, "--json", "--expect")
    (row,) = json.loads(rr.stdout)["results"]
    assert rr.returncode == 0 and row["client"] == client and row["outcome"] == row["expected"] == "reproduces"
    model = sc("replay", path, "--client", "model", "--json", "--expect")
    (row,) = json.loads(model.stdout)["results"]
    assert model.returncode == 1 and (row["client"], row["outcome"], row["expected"]) == ("model", "fixed", None)
    assert "no expectation recorded for client model" in sc("replay", path, "--client", "model", "--expect").stdout


def test_directory_replay_reports_every_file(tmp_path):
    """A directory with a good and a bad trace gets a row for each; the bad one is an error naming its field."""
    good = json.loads((ROOT / "counterexamples" / "demo-max-combine.json").read_text())
    (tmp_path / "a-good.json").write_text(json.dumps(good))
    (tmp_path / "b-bad.json").write_text(json.dumps({**good, "config": {**good["config"], "n_ranks": 100_000}}))
    (tmp_path / "c-binary.json").write_bytes(b"\xff\xfe{")
    r = sc("replay", str(tmp_path), "--client", "model", "--json")
    rows = {Path(row["path"]).name: row for row in json.loads(r.stdout)["results"]}
    assert r.returncode == 2 and set(rows) == {"a-good.json", "b-bad.json", "c-binary.json"}
    assert rows["a-good.json"]["outcome"] == "reproduces"
    assert rows["b-bad.json"]["outcome"] == "error" and "config.n_ranks" in rows["b-bad.json"]["why"]
    assert rows["c-binary.json"]["outcome"] == "error" and "UTF-8" in rows["c-binary.json"]["why"]


def test_replay_under_a_fixed_protocol_never_errors_on_a_stale_schedule():
    """Every demo trace replayed under the reference protocol is fixed, also where the recorded schedule no longer fits."""
    r = sc("replay", *map(str, sorted((ROOT / "counterexamples").glob("demo-*.json"))), "--protocol", "paper",
           "--client", "model", "--json")
    rows = json.loads(r.stdout)["results"]
    assert r.returncode == 0 and {row["outcome"] for row in rows} == {"fixed"}
    stale = [row for row in rows if "no longer fits" in row["why"]]
    assert stale and all(row["protocol"] == "paper" for row in rows), rows


def test_held_reports_its_coverage(tmp_path):
    """A held check says what it covered, per engine, in JSON and in words; --until-exhausted reaches its size."""
    r = sc("check", "--json", "--budget", "1", "--until-exhausted", "2,4", "--out", str(tmp_path))
    cov = json.loads(r.stdout)["stats"]["coverage"]
    assert r.returncode == 0 and cov["enumerate"]["exhausted"]["ranks"] >= 2
    assert cov["enumerate"]["exhausted"]["chunks"] >= 4 and cov["enumerate"]["cases"] > 0
    text = sc("check", "--budget", "3", "--out", str(tmp_path)).stdout
    assert "verdict HELD" in text and "enumerate: exhausted 1-" in text and "explore: " in text, text
    assert sc("check", "--until-exhausted", "9,9", "--budget", "1").returncode == 2


def test_a_factory_of_incomplete_stores_is_one_line_and_exit_2(tmp_path):
    """A store factory whose objects lack RankStore methods is refused in one line naming the missing methods."""
    (tmp_path / "halfstore.py").write_text(textwrap.dedent('''
        class Half:
            def put(self, key, value): pass
            def get(self, key): return None
        def factory(n_ranks, **options):
            return [Half() for _ in range(n_ranks)]
    '''))
    r = sc("check", "--client", "halfstore:factory", "--budget", "3", env_extra=[str(tmp_path)])
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "halfstore:factory" in r.stderr and "contains" in r.stderr and "get_async" in r.stderr


def test_an_exception_in_protocol_code_names_rank_method_and_line(tmp_path):
    """A rank program that raises is a termination violation naming the rank, the method and file:line."""
    (tmp_path / "raising.py").write_text(textwrap.dedent('''
        from model.protocols import PaperProtocol

        class RaisingLoad(PaperProtocol):
            name = "raising-load"

            def rank_load(self, rank, n_ranks, chunk_hashes, planned):
                if rank == 1:
                    raise ValueError("boom")
                return (yield from super().rank_load(rank, n_ranks, chunk_hashes, planned))
    '''))
    r = sc("check", "--json", "--protocol", "raising:RaisingLoad", "--budget", "3", "--out", str(tmp_path / "o"),
           env_extra=[str(tmp_path)])
    (v,) = json.loads(r.stdout)["violations"]
    assert v["property"] == "termination" and "rank 1's rank_load raised ValueError: boom" in v["summary"]
    assert f"{tmp_path / 'raising.py'}:9" in v["summary"], v["summary"]


def test_pytest_properties_imports_a_protocol_module_of_the_working_directory(tmp_path):
    """`pytest <repo>/properties --protocol mymod:X` finds mymod in the directory it runs from, as the README says."""
    import subprocess
    import sys
    (tmp_path / "mymod.py").write_text("from model.variants import MaxCombine as X\n")
    # -x: the first failure (the protocol layer's) shows the import worked; the store layers after it do not matter
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", str(ROOT / "properties"),
                        "--protocol", "mymod:X", "--found-dir", str(tmp_path / "found")], cwd=tmp_path,
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 1 and "SoundnessViolated" in r.stdout, r.stdout[-2000:] + r.stderr


def test_every_option_says_its_default():
    """Every option of every subcommand has help text that names its default (or that it is required)."""
    import argparse
    from shardcheck.cli import _parser
    missing = []
    for action in _parser()._subparsers._group_actions:
        for name, sub in action.choices.items():
            for a in sub._actions:
                if a.option_strings and not isinstance(a, argparse._HelpAction):
                    if not a.help or not ("default" in a.help or "required" in a.help):
                        missing.append(f"{name} {a.option_strings[0]}")
    assert missing == []
