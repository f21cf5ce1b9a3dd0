"""Every table of names, assembled where the command line builds the program and handed down from here: the tables
that name modules of several layers live in this, the composition root; the others are re-exported from the layer
that holds them.

- `STRATEGIES`: `check`'s strategies by name (`MOD:ATTR` of the class, in `checking/` and `properties/`), handed to
  `checking.check.run_check` in its `CheckPlan`, which runs them in the order of `runtime.registry.CHECK_SCHEDULE`.
- `DEMO_MODULES`: where each property layer's demos live (`model.checks.Property.demos` names them in that module:
  `model`, `properties` and `adapters`), for `runtime.registry.demo_refs` and `patch_refs`.
- `CLIENTS`, `SERVING_ENGINES`, `CATALOGUE` (and its `nemesis`): the named real clients and serving engines,
  `adapters.catalogue`'s.
"""
from __future__ import annotations

from adapters.catalogue import CATALOGUE, CLIENTS, SERVING_ENGINES

__all__ = ["STRATEGIES", "DEMO_MODULES", "CLIENTS", "SERVING_ENGINES", "CATALOGUE"]

#: The strategies of `check` (`checking.api.Strategy`), by name: what `runtime.registry.CHECK_SCHEDULE` names.
STRATEGIES: dict[str, str] = {
    "scenarios": "checking.scenarios:Scenarios",
    "nemesis": "checking.nemesis_strategy:Nemesis",
    "retention": "checking.retention:Retention",
    "concurrency": "checking.concurrency_strategy:Concurrency",
    "enumerate": "checking.search:Enumeration",
    "explore": "checking.explore.strategy:Explorer",
    "hypothesis": "properties.machine_search:HypothesisMachines",
    "random": "checking.search:RandomCases",
    "engine-cases": "checking.serving.engine_search:EngineCases",
    "engine-machine": "properties.engine_machine:EngineMachineSearch",
    "stack-cases": "checking.serving.stack_search:StackCases",
}

#: Where each property layer's demos live (`model.checks.Property.demos` names them in that module).
DEMO_MODULES: dict[str, str] = {"protocol": "model.variants", "store": "properties.bad_stores",
                                "concurrency": "properties.bad_stores", "nemesis": "adapters.valkey_clients",
                                "engine": "adapters.engine_demos", "stack": "adapters.vllm_stack.connector_demos",
                                # (not a layer: the `--engine-patch` demos of a stack's own agreement,
                                # `model.checks.Property.patches`)
                                "stack-patch": "adapters.sglang_hicache.patches"}
