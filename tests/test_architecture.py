"""ARCHITECTURE.md as tests: every engine reports its coverage, every client name resolves, and the "Where to add
things" table holds when it is done: an engine is its module and one registry entry, a client its factory and one
registry entry."""
from __future__ import annotations

import sys
import time
import types

import pytest

from engines.api import Coverage, SearchContext, Target, target_kind
from model.finding import Finding
from model.harness import run_case
from runtime import registry
from runtime.registry import CHECK_ENGINES, CHECK_SCHEDULE, CLIENTS, resolve_client, resolve_engine, resolve_protocol


def _ctx(client: str, polls: int = 30) -> SearchContext:
    left = iter(range(polls))
    now = time.monotonic()
    return SearchContext(target=Target(protocol=resolve_protocol("paper"), client=resolve_client(client)),
                         run=run_case, should_stop=lambda: next(left, None) is None, phase_end=now + 3,
                         deadline=now + 3, coverage=Coverage())


@pytest.mark.parametrize("name", list(CHECK_ENGINES))
def test_every_engine_is_scheduled_and_reports_its_coverage(name):
    """Each engine of `check` is in a schedule, is named as registered, and fills its own coverage record (with a
    line of text and JSON) when it runs."""
    assert any(name in dict(steps) for steps in CHECK_SCHEDULE.values()), name
    engine = resolve_engine(name)
    assert engine.name == name
    kinds = [kind for kind, steps in CHECK_SCHEDULE.items() if name in dict(steps)]
    client = "model" if "in-memory" in kinds else "properties.bad_stores:jitter_factory"
    ctx = _ctx(client)
    assert target_kind(ctx.target) in kinds
    found = engine.search(ctx)
    assert found is None, found.summary if found else ""
    record = ctx.coverage.records[name]
    assert record.text() and isinstance(record.to_json(), dict)


@pytest.mark.parametrize("name", list(CLIENTS))
def test_every_client_name_resolves_with_its_capabilities(name):
    """Every named client resolves to a callable factory; only `model` is in memory."""
    client = resolve_client(name)
    assert callable(client.factory) and client.name == name
    assert client.in_memory == (name == "model")


class _ToyEngine:
    """A toy engine that reports a made-up violation of its first case (to show a new engine needs nothing else)."""

    name = "toy"

    def search(self, ctx: SearchContext) -> Finding | None:
        from model.outcome import Case, Violation
        case = Case(1, 1)
        out = ctx.run(ctx.target.protocol.obj, case)
        out.violations = [Violation("soundness", "the toy engine's finding")]
        return ctx.protocol_finding(case, out, self.name)


def test_an_engine_is_its_module_and_one_registry_entry(monkeypatch, tmp_path):
    """A new engine: a class in a module, one `CHECK_ENGINES` entry and a place in a schedule; `check` runs it and
    saves its finding."""
    from shardcheck.check_cmd import run_check
    module = types.ModuleType("toy_engine_module")
    module.ToyEngine = _ToyEngine
    monkeypatch.setitem(sys.modules, "toy_engine_module", module)
    monkeypatch.setitem(CHECK_ENGINES, "toy", "toy_engine_module:ToyEngine")
    monkeypatch.setitem(CHECK_SCHEDULE, "in-memory", (("toy", "rest"),))
    result = run_check(None, None, budget=2.0, out_dir=str(tmp_path))
    assert result["verdict"] == "violated" and result["stats"]["counterexample"]["engine"] == "toy"


def test_a_client_is_its_factory_and_one_registry_entry(monkeypatch, tmp_path):
    """A new named client: a factory and one `ClientEntry`; `--client NAME` then works in check and replay."""
    from shardcheck.check_cmd import run_check
    from shardcheck.replay import run_replay
    module = types.ModuleType("toy_client_module")
    module.factory = lambda n_ranks, **options: resolve_client("properties.bad_stores:truncating_factory").factory(n_ranks)
    monkeypatch.setitem(sys.modules, "toy_client_module", module)
    monkeypatch.setitem(CLIENTS, "toy", registry.ClientEntry(ref="toy_client_module:factory", about="a toy client",
                                                             options=()))
    result = run_check(None, "toy", budget=3.0, out_dir=str(tmp_path))
    assert result["client"] == "toy" and result["verdict"] == "violated"
    (row,) = run_replay([result["violations"][0]["counterexample"]])
    assert row["client"] == "toy" and row["outcome"] == "reproduces"
