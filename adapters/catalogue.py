"""The named real clients, serving engines and nemesis: the tables of names whose entries are the adapters' (and the
model's), here because this is the lowest layer that may import everything they name.

- `CLIENTS` (`--client NAME`): a `runtime.registry.ClientTable` of `ClientEntry`s, the in-memory `model` of
  `runtime.registry.MEMORY_CLIENTS` and the real ones; a client that names no servers to share has embedded Valkey
  servers (`VALKEY_TIER`).
- `SERVING_ENGINES` (`--engine NAME`): name -> `runtime.serving.ServingEngineEntry`, the deployments and stacks.
- `nemesis(user_servers=...)`: `control_for(stores, kind)` of `adapters.nemesis`, the real faults on the servers.
- `CATALOGUE`: the three as one `runtime.registry.Catalogue`, what the layers below are handed (the engines by the
  command line, the property machines by the pytest plugin through `shardcheck.pytest_catalogue`).

The entries name their factories as `MOD:ATTR`: a module is imported when its name is resolved, so a missing
optional adapter (LMCache, Mooncake, vLLM, SGLang) only matters when it is used.
"""
from __future__ import annotations

from typing import Any, Callable

from runtime.registry import Catalogue, ClientEntry, ClientTable, MEMORY_CLIENTS
from runtime.serving import ServingEngineEntry

__all__ = ["VALKEY_TIER", "CLIENTS", "ENGINE_OPTIONS", "SERVING_ENGINES", "nemesis", "CATALOGUE"]

#: What starts the servers several clients of a real client share: embedded Valkey, or the user's `urls`.
VALKEY_TIER = "adapters.shared_tier:valkey_tier"

_LMCACHE_OPTIONS = ("topology", "use_mla", "op_timeout", "urls", "password", "num_workers")

#: Client names accepted by `--client`.
CLIENTS = ClientTable({
    **MEMORY_CLIENTS,
    "lmcache": ClientEntry(ref="adapters.lmcache_stores:resp_factory", self_bounded=True, options=_LMCACHE_OPTIONS,
                           about="LMCache's RemoteBackend over resp://, one real Valkey server per rank", corpus=True,
                           expect="violated"),
    "lmcache-native": ClientEntry(ref="adapters.lmcache_native:native_factory", self_bounded=True,
                                  options=_LMCACHE_OPTIONS, about="LMCache's native RESP client"),
    "lmcache-valkey": ClientEntry(ref="adapters.lmcache_stores:valkey_factory", self_bounded=True,
                                  options=_LMCACHE_OPTIONS, about="LMCache's Valkey connector over valkey://"),
    "lmcache-patched": ClientEntry(ref="adapters.patched:patched_factory", self_bounded=True,
                                   options=_LMCACHE_OPTIONS, about="lmcache with shardcheck's fixes applied",
                                   corpus=True, expect="held"),
    "mooncake": ClientEntry(ref="adapters.mooncake_store:mooncake_factory", self_bounded=True,
                            options=("op_timeout", "rpc_timeout_ms", "segment_mb", "lease_ttl_ms"),
                            about="the Mooncake store's client over tcp, one mooncake_master per rank in a private "
                                  "network namespace"),
}, tier=VALKEY_TIER)


#: The factory options of the LMCache engines (`--engine-option KEY=VALUE`; shardcheck itself gives `runner`, the
#: `--runner` of the deployment, and `patches`, the `--engine-patch` functions a rank process applies first).
ENGINE_OPTIONS = ("urls", "lookup_timeout_ms", "close_timeout", "runner", "patches")


#: Serving engine names accepted by `--engine` (a real engine's own lookup-and-load path under test).
SERVING_ENGINES: dict[str, ServingEngineEntry] = {
    "lmcache": ServingEngineEntry(ref="adapters.lmcache_engine.factory:stock_factory", options=ENGINE_OPTIONS,
                           about="stock LMCache 0.5.6: N LMCacheEngine ranks on CPU (LocalCPU + resp:// to each "
                                 "rank's own Valkey), the real lookup servers and the scheduler's real lookup client"),
    "lmcache-patched": ServingEngineEntry(ref="adapters.engine_patched:patched_factory", options=ENGINE_OPTIONS,
                                   about="lmcache with shardcheck's fixes to its lookup-and-load path", expect="held"),
    "vllm": ServingEngineEntry(ref="adapters.vllm_stack:vllm_stack", seam="stack",
                               connectors=("lmcache", "lmcache-patched", "mooncake"),
                               connector_expect={"lmcache-patched": "held", "mooncake": "violated"},
                               options=("tp", "lookup_timeout_ms", "max_blocks", "async_loading", "urls", "chunk_size",
                                        "local_cpu_gb", "cpu_connector", "max_model_len", "start_timeout",
                                        "call_timeout", "close_timeout", "log_level", "segment_mb"),
                               about="vLLM 0.31 on CPU (a tiny local Llama) with a KV connector: LMCache 0.5.6, one "
                                     "Valkey server per tensor-parallel rank, or vLLM's MooncakeStoreConnector over "
                                     "a Mooncake master"),
    "memory-stack": ServingEngineEntry(ref="model.stack_memory:memory_stack", seam="stack", connectors=("memory",),
                                       options=("chunk_size", "block_size", "blocks", "lookup_timeout", "tp"),
                                       about="the serving stack in memory: the behaviour real stacks are judged "
                                             "against", expect="held"),
    "sglang-hicache": ServingEngineEntry(ref="adapters.sglang_hicache.sgl_stack:factory", seam="stack",
                                         connectors=("file",), ranks=2, patch_demos=True,
                                         options=("tp", "page_size", "lookup_timeout", "sync_timeout", "call_timeout",
                                                  "start_timeout", "host_tokens", "prefetch_policy",
                                                  "patches"),
                                         about="SGLang 0.5.23's own HiCache storage prefetch (HybridCacheController: "
                                               "the hit query, its MIN agreement over gloo, the page load, the ack "
                                               "MIN, the write-back) in N rank processes, each with its own storage",
                                         expect="held"),
}


def nemesis(*, user_servers: bool = False) -> Callable[[Any, Any], Any]:
    """`control_for(stores, kind)` of the nemesis (`adapters.nemesis.control_maker`: real faults on the servers
    shardcheck started, and on the user's own with `user_servers`); its module is imported when it is first asked
    for."""
    from adapters.nemesis import control_maker
    return control_maker(user_servers=user_servers)


#: What the layers below resolve the names a user gives in.
CATALOGUE = Catalogue(clients=CLIENTS, engines=SERVING_ENGINES, nemesis=nemesis)
