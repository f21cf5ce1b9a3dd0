"""`--protocol`/`--client` resolution, the pytest plugin end to end, profiles, and runnable printed programs."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.stateful import run_state_machine_as_test

from checking.storeops import bounded_factory, replay
from model.harness import run_case
from model.protocols import PaperProtocol, PaperProtocolAsync, Rank0SingleWriter
from model.store import MemoryStore, memory_factory
from model.trace import Trace
from model.variants import GiveUpOnLocalMiss, MaxCombine
from properties import config, profiles
from properties.bad_stores import TruncatingStore, async_key_mismatch_factory
from properties.machines import ProtocolMachine, StoreMachine, violated_properties
from runtime.registry import MEMORY_CLIENTS, ResolveError, resolve_client, resolve_protocol
from shardcheck.tables import CLIENTS

ROOT = Path(__file__).resolve().parents[1]

#: A protocol instance and a zero-argument factory, for `MOD:ATTR` naming them.
INSTANCE = PaperProtocolAsync(wait_timeout=2.0)


def make_protocol() -> Rank0SingleWriter:
    return Rank0SingleWriter()


def test_short_protocol_names():
    """`paper`, `paper-async`, `rank0-single-writer` and no value resolve to the reference protocols."""
    assert type(resolve_protocol(None).obj) is PaperProtocol
    assert type(resolve_protocol("paper").obj) is PaperProtocol
    assert resolve_protocol("paper").ref == "model.protocols:PaperProtocol"
    assert type(resolve_protocol("paper-async").obj) is PaperProtocolAsync
    assert type(resolve_protocol("rank0-single-writer").obj) is Rank0SingleWriter


def test_mod_attr_class_instance_and_factory():
    """MOD:ATTR may name a class (instantiated), an instance (used as is) or a factory (called)."""
    assert type(resolve_protocol("model.variants:MaxCombine").obj) is MaxCombine
    assert resolve_protocol(f"{__name__}:INSTANCE").obj is INSTANCE
    assert type(resolve_protocol(f"{__name__}:make_protocol").obj) is Rank0SingleWriter


@pytest.mark.parametrize("spec, named", [
    ("nosuch.module:P", "nosuch.module"),
    ("model.protocols:NoSuchProtocol", "NoSuchProtocol"),
    ("model.protocols", "MOD:ATTR"),
    ("model.store:MemoryStore", "lacks the ShardingProtocol method"),
])
def test_unusable_protocol_is_a_clear_error(spec, named):
    """An unimportable or non-protocol value raises ResolveError naming the value and the problem."""
    with pytest.raises(ResolveError, match=re.escape(named)) as info:
        resolve_protocol(spec)
    assert spec in str(info.value)


def test_client_names():
    """The client table has the shared contract's names plus `mooncake` (docs/CONTRACT.md names it), and nothing else;
    `model` is the in-memory factory, the only in-memory one."""
    contract = {"model", "lmcache", "lmcache-native", "lmcache-valkey", "lmcache-patched"}
    assert set(CLIENTS) == contract | {"mooncake"}
    assert resolve_client(None, CLIENTS).factory is memory_factory
    assert resolve_client("model", CLIENTS).factory is memory_factory
    assert [name for name, e in CLIENTS.items() if e.in_memory] == ["model"]
    truncating = resolve_client("properties.bad_stores:TruncatingStore", CLIENTS)
    stores = truncating.stores(3)
    assert len(stores) == 3 and all(type(s) is TruncatingStore for s in stores)
    assert not truncating.in_memory  # a user's client is bounded and driven as a real one
    with pytest.raises(ResolveError, match="nosuch"):
        resolve_client("nosuch:factory", CLIENTS)
    with pytest.raises(ResolveError, match="model.effects:TIMED_OUT"):
        resolve_client("model.effects:TIMED_OUT", CLIENTS)


def test_profiles():
    """dev is the default and keeps a directory database; ci is derandomized; an unknown profile name is an error."""
    profiles.register(ROOT)  # as the plugin did: no change to the session's profiles
    assert profiles.chosen({}) == "dev" and profiles.chosen({"HYPOTHESIS_PROFILE": "ci"}) == "ci"
    with pytest.raises(ValueError, match="HYPOTHESIS_PROFILE='fast'"):
        profiles.chosen({"HYPOTHESIS_PROFILE": "fast"})
    ci = settings.get_profile("ci")
    assert ci.database is None and ci.derandomize
    assert isinstance(settings.get_profile("dev").database, DirectoryBasedExampleDatabase)
    assert settings.get_profile("nightly").max_examples > ci.max_examples > settings.get_profile("dev").max_examples


def test_profiles_ignore_hypothesis_ci_detection():
    """With `CI` set, Hypothesis loads its own derandomized, database-less `ci` profile; ours must not inherit it."""
    probe = ("from hypothesis import settings; from properties import profiles; profiles.register('.'); "
             "ci = settings.get_profile('ci'); dev = settings.get_profile('dev'); "
             "print(type(dev.database).__name__, ci.derandomize, dev.derandomize, dev.print_blob)")
    run = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "CI": "true", "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["DirectoryBasedExampleDatabase", "True", "False", "False"]


def _pytest(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYPOTHESIS_PROFILE": "dev"}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=240)


def test_plugin_usage_error_names_the_value(tmp_path):
    """An unimportable --protocol stops pytest with a usage error (exit 4) that names it."""
    run = _pytest(tmp_path, str(ROOT / "properties" / "test_protocol_layer.py"), "--protocol", "nosuch.mod:P")
    assert run.returncode == 4, run.stdout + run.stderr
    assert "nosuch.mod:P" in run.stderr


def test_plugin_names_come_from_the_catalogue_handed_to_it(tmp_path):
    """The plugin (a layer below the adapters) has the named clients through its hook, which
    `shardcheck.pytest_catalogue` answers (`-p` in the repository's pytest options): an unknown client's error lists
    the catalogue's names. Without that plugin only the model's names resolve, and a real client's name is a usage
    error that says where the names come from."""
    layer = str(ROOT / "properties" / "test_store_layer.py")
    named = _pytest(tmp_path, layer, "--collect-only", "--client", "nosuch")
    assert named.returncode == 4 and f"expected one of {', '.join(CLIENTS)}, or MOD:ATTR" in named.stderr, named.stderr
    alone = _pytest(tmp_path, layer, "--collect-only", "-p", "no:shardcheck.pytest_catalogue", "--client", "lmcache")
    assert alone.returncode == 4 and "-p shardcheck.pytest_catalogue" in alone.stderr, alone.stderr
    model = _pytest(tmp_path, layer, "--collect-only", "-p", "no:shardcheck.pytest_catalogue", "--client", "model")
    assert model.returncode == 0, model.stdout[-2000:] + model.stderr
    assert list(MEMORY_CLIENTS) == ["model"]


def test_plugin_finds_bugs_from_another_directory(tmp_path):
    """`pytest <repo>/properties --protocol M:A --client M:A` from elsewhere fails both layers and writes traces
    (the directory collected whole; the protocol and store layers run, the concurrent layer has its own tests)."""
    found = tmp_path / "found"
    run = _pytest(tmp_path, str(ROOT / "properties"), "--protocol", "model.variants:MaxCombine",
                  "--client", "properties.bad_stores:async_key_mismatch_factory", "--found-dir", str(found),
                  "--hypothesis-seed", "0", "-k", "ProtocolLayer or StoreLayer")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "SoundnessViolated" in run.stdout and "StoreRoundtripViolated" in run.stdout, run.stdout
    kinds = {Trace.load(p).kind: Trace.load(p) for p in found.glob("*.json")}
    assert {"protocol", "store-ops"} <= set(kinds) <= {"protocol", "store-ops", "concurrent"}  # (every layer that fails)
    assert "soundness" in run_case(MaxCombine(), kinds["protocol"].case()).violated()
    store = kinds["store-ops"]  # not shrunk by Hypothesis (a MOD:ATTR client), so minimised before it is written
    assert "1-minimal" in store.notes and len(store.ops) <= 3, store.ops
    made = bounded_factory(store, resolve_client(store.client, CLIENTS))
    assert replay(store, made)[0] == "reproduces"
    # (each records its subject's source, as `check` does: a replay on the unchanged subject is never `fixed`)
    from runtime.source import source_digest
    from properties import bad_stores
    assert store.config["source"] == source_digest([bad_stores.async_key_mismatch_factory])
    assert kinds["protocol"].config["source"] == source_digest([bad_stores.async_key_mismatch_factory, MaxCombine])


FIND = settings(max_examples=300, derandomize=True, deadline=None, phases=(Phase.generate, Phase.shrink),
                report_multiple_bugs=False, suppress_health_check=list(HealthCheck))


def _program(exc: BaseException) -> str:
    """The Python lines of the failing program Hypothesis attached to `exc`."""
    lines = getattr(exc, "__notes__", [])
    return "\n".join(line for line in lines if re.match(r"(state\b|\w+_\d+ = state\.)", line))


@pytest.mark.parametrize("machine, changes, prop", [
    (ProtocolMachine, {"protocol": GiveUpOnLocalMiss()}, "agreement"),
    (StoreMachine, {"client": async_key_mismatch_factory}, "store-roundtrip"),
])
def test_printed_program_runs_as_is(machine, changes, prop, tmp_path):
    """The program Hypothesis prints for a failure runs as plain Python and fails the same way."""
    with config.using(found_dir=tmp_path, **changes):
        with pytest.raises((AssertionError, ExceptionGroup)) as info:
            run_state_machine_as_test(machine, settings=FIND)
        assert prop in violated_properties(info.value)
        program = _program(info.value)
        assert program.startswith(f"state = {machine.__name__}()") and program.endswith("state.teardown()")
        namespace: dict = {}
        with pytest.raises((AssertionError, ExceptionGroup)) as again:
            exec("from properties.machines import *\n" + program, namespace)
    assert prop in violated_properties(again.value)


def test_memory_store_is_the_default_session_store():
    """With no --client the machines use in-memory stores, shared across a session and renewed on discard."""
    with config.using(client=None) as cur:
        first = cur.stores(2)
        assert all(type(s) is MemoryStore for s in first) and cur.stores(2) == first
        cur.discard()
        assert cur.stores(2)[0] is not first[0]


def test_found_traces_are_never_overwritten(tmp_path):
    """The same trace maps to the same file (kept); a different one under a taken name gets a new name; a config that
    collects traces in memory keeps them there and writes nothing."""
    from properties.machines import write_found

    trace = Trace(kind="store-ops", property="store-hang", summary="s", protocol={"name": "-"}, client="model",
                  config={"n_ranks": 1}, ops=[{"op": "get", "rank": 0, "key": "k"}])
    cfg = config.RunConfig(found_dir=tmp_path)
    first = write_found(trace, cfg, "model", "store-hang")
    assert write_found(trace, cfg, "model", "store-hang") == first
    first.write_text("something else\n")
    second = write_found(trace, cfg, "model", "store-hang")
    assert second != first and first.read_text() == "something else\n"
    assert first.name.startswith("model-store-hang-") and second.name.endswith("-2.json")
    kept: list = []
    assert write_found(trace, config.RunConfig(found_dir=tmp_path / "none", found=kept), "x") == "kept in memory"
    assert kept == [trace] and not (tmp_path / "none").exists()
