"""The store-client layer against `--client` (default: the in-memory `model` client)."""
import time

import pytest

from engines.scenarios import SCENARIOS, run_scenarios
from engines.storeops import minimise_store_ops
from properties import config
from properties.machines import StoreMachine, write_found


class TestStoreLayer(StoreMachine.TestCase):
    """Every client call answers promptly and like the oracle, over every read path, and leaves the client usable."""


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_store_client_scenario(scenario):
    """What any store client owes its caller, as a fixed op sequence (`engines.scenarios`), on fresh stores."""
    cfg = config.current()
    for trace in run_scenarios(cfg.resolved_client(), op_timeout=cfg.op_timeout, names=(scenario,)):
        if cfg.write_traces and not cfg.in_memory() and cfg.minimise_seconds > 0:  # cut down on fresh stores
            stop_at = time.monotonic() + cfg.minimise_seconds
            trace, _ = minimise_store_ops(trace, cfg.resolved_client(), should_stop=lambda: time.monotonic() >= stop_at)
        path = write_found(trace, cfg, cfg.client_label(), trace.property) if cfg.write_traces else None
        pytest.fail(f"{trace.summary} (counterexample trace: {path})", pytrace=False)
