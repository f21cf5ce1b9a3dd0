"""`--engine lmcache`: the factory of the stock deployment, in this process or with one OS process per rank."""
from __future__ import annotations

from typing import Any

from adapters.lmcache_engine.deployment import LMCacheDeployment
from adapters.lmcache_engine.process_deployment import ProcessDeployment

__all__ = ["stock_factory"]


def stock_factory(n_ranks: int, **options: Any) -> LMCacheDeployment:
    """`--engine lmcache`: stock LMCache 0.5.6 (`adapters.lmcache_engine.deployment`); `runner="processes"`: one OS
    process per rank (`adapters.lmcache_engine.process_deployment.ProcessDeployment`)."""
    if options.pop("runner", "in-process") == "processes":
        return ProcessDeployment(n_ranks, **options)
    return LMCacheDeployment(n_ranks, **options)
