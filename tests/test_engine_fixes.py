"""The fixes of `lmcache-patched` whose race the connector's fix (E6) would hide: the corpus trace of each (E2, E4, E5)
runs that fix's own path on `lmcache-patched` (the deployment's `facts` count it, and its property holds), and its
replay with that fix taken out (`adapters.engine_unfixes`), every other fix kept, reproduces (its replay runs in a
fresh process of its own, so the unfix patches nothing here)."""
import pytest

from adapters.catalogue import SERVING_ENGINES
from adapters.engine_patched import E2_DEFERRED, E4_ENDED, E4_UNDELIVERED, E5_DROPPED, E5_GAVE_UP, E5_OWED
from checking.serving.engine_run import run_engine_case
from checking.serving.engine_search import call_of, engine_target, facts_of, shows
from model.engine_case import case_from_json
from model.outcome import Violation
from model.trace import Trace
from shardcheck.engine_findings import ENGINE_CORPUS

pytestmark = pytest.mark.real

#: corpus trace -> (the `--engine-patch` taking its fix out, the facts the fix's path counts).
FIXES = {"lmcache-async-pins-late-prefetch.json": ("without_e2", (E2_DEFERRED,)),
         "lmcache-sync-pins-outlived.json": ("without_e4", (E4_ENDED,)),
         "lmcache-sync-pins-queued.json": ("without_e4", (E4_UNDELIVERED,)),
         "lmcache-async-engine-returns-late-answers.json": ("without_e5", (E5_GAVE_UP, E5_OWED, E5_DROPPED)),
         "lmcache-async-engine-returns-lookup_cache-timed-out.json": ("without_e5", (E5_GAVE_UP, E5_OWED, E5_DROPPED))}


def _recorded_call(trace: Trace) -> str | None:
    first = trace.verdict["violations"][0]
    return call_of(Violation(first["property"], first["summary"], first["detail"]))


@pytest.mark.parametrize("name", sorted(FIXES))
def test_the_fix_runs_its_own_path_and_is_needed(name):
    """On `lmcache-patched` the trace's property holds and the fix's path ran (its facts > 0); a replay with the fix
    taken out reproduces (so the trace fails if the fix goes, even with the connector's fix kept)."""
    from shardcheck.replay_cmd import run_replay
    unfix, counted = FIXES[name]
    path = ENGINE_CORPUS / name
    trace = Trace.load(path)
    assert trace.expect == {"lmcache": "reproduces", "lmcache-patched": "fixed"}
    assert trace.config["options"].get("lookup_timeout_ms"), "the race needs a scheduler more impatient than E6"
    case, call = case_from_json(trace.config["case"]), _recorded_call(trace)
    patched = run_engine_case(engine_target("lmcache-patched", lookup=case.lookup, options=trace.config["options"],
                                            engines=SERVING_ENGINES).make, case)
    assert not shows(patched.violations, trace.property, call), patched.violations
    facts = facts_of(patched)
    assert all(facts.get(c, 0) > 0 for c in counted), facts
    spec = f"adapters.engine_unfixes:{unfix}"
    [row] = run_replay([str(path)], engine="lmcache-patched", engine_patches=(spec,))  # (in a fresh process: hermetic)
    assert row["outcome"] == "reproduces", row
    assert row["client"] == f"lmcache-patched+{spec}" and row["patches"] == [spec], row
