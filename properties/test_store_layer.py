"""The store-client layer against `--client` (default: the in-memory `model` client)."""
import time

import pytest

from checking.retention import RetentionRun
from checking.scenarios import SCENARIOS, SHARED_SCENARIOS, ScenarioCoverage, run_scenarios
from checking.storeops import minimise_store_ops
from properties import config
from properties.machines import StoreMachine, write_found


class TestStoreLayer(StoreMachine.TestCase):
    """Every client call answers promptly and like the oracle, over every read path, and leaves the client usable."""


@pytest.mark.parametrize("scenario", SCENARIOS + SHARED_SCENARIOS)
def test_store_client_scenario(scenario):
    """What any store client owes its caller, as a fixed op sequence (`checking.scenarios`), on fresh stores; the
    shared-tier ones on two clients of the same servers (reported as not run, with the reason, for a client that
    cannot share its servers)."""
    cfg = config.current()
    ran = ScenarioCoverage()
    found = run_scenarios(cfg.resolved_client(), op_timeout=cfg.op_timeout, names=(scenario,),
                          options=cfg.client_options, coverage=ran, n_ranks=cfg.rank_cap(2))
    if not found and scenario not in ran.scenarios:  # not a failure: it cannot run on this client; the reason shown
        pytest.skip(f"scenario {scenario} did not run: {ran.shared_not_run or 'it needs 2 ranks (--max-ranks)'}")
    for trace in found:
        if cfg.write_traces and not cfg.in_memory() and cfg.minimise_seconds > 0:  # cut down on fresh stores
            stop_at = time.monotonic() + cfg.minimise_seconds
            trace, _ = minimise_store_ops(trace, cfg.resolved_client(), should_stop=lambda: time.monotonic() >= stop_at,
                                          options=cfg.client_options)
        path = write_found(trace, cfg, cfg.client_label(), trace.property) if cfg.write_traces else None
        pytest.fail(f"{trace.summary} (counterexample trace: {path})", pytrace=False)


def test_values_nobody_deleted_are_kept():
    """A sample of values put and never deleted reads back the same once `--retention` seconds old (or just before
    the client's declared `retention` runs out), through every declared path (`checking.retention`)."""
    cfg = config.current()
    aged = RetentionRun(cfg.resolved_client(), retention=cfg.retention, op_timeout=cfg.op_timeout,
                        options=cfg.client_options, n_ranks=cfg.rank_cap(2))
    try:
        if aged.sample is None:
            pytest.skip(f"retention {aged.note}")  # not a failure: nothing to test (--retention 0, or no promise)
        trace = aged.finish(time.monotonic() + aged.sample.age + 5 * cfg.op_timeout)
    finally:
        aged.close()
    if trace is not None:
        path = write_found(trace, cfg, cfg.client_label(), trace.property) if cfg.write_traces else None
        pytest.fail(f"{trace.summary} (counterexample trace: {path})", pytrace=False)
