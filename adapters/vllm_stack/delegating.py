"""`DelegatingConnector`: a `KVConnectorBase_V1` that passes every hook of vLLM 0.31's connector interface to the
connector it wraps (`self.inner`), scheduler side and worker side: the base of the recording connector and of the
demo connectors, which override only the hooks they change."""
from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata

__all__ = ["DelegatingConnector"]


class DelegatingConnector(KVConnectorBase_V1):
    """Every hook goes to `self.inner` (set by the subclass's constructor)."""

    inner: Any = None

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        return False

    # -- scheduler side -------------------------------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        return self.inner.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        return self.inner.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return self.inner.build_connector_meta(scheduler_output)

    def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, dict | None]:
        return self.inner.request_finished(request, block_ids)

    def update_connector_output(self, connector_output: Any) -> None:
        return self.inner.update_connector_output(connector_output)

    def take_events(self) -> Any:
        return self.inner.take_events()

    def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
        super().bind_kv_cache_manager(kv_cache_manager)
        return self.inner.bind_kv_cache_manager(kv_cache_manager)

    def bind_gpu_block_pool(self, gpu_block_pool: Any) -> None:
        return self.inner.bind_gpu_block_pool(gpu_block_pool)

    def on_new_request(self, request: Any) -> None:
        return self.inner.on_new_request(request)

    def has_pending_block_frees(self) -> bool:
        return self.inner.has_pending_block_frees()

    def has_pending_push_work(self) -> bool:
        return self.inner.has_pending_push_work()

    def register_finished_partial_tail(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.register_finished_partial_tail(*args, **kwargs)

    def get_finished_count(self) -> int | None:
        return self.inner.get_finished_count()

    def reset_cache(self) -> bool | None:
        return self.inner.reset_cache()

    # -- worker side ----------------------------------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict) -> None:
        return self.inner.register_kv_caches(kv_caches)

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        return self.inner.bind_connector_metadata(connector_metadata)

    def clear_connector_metadata(self) -> None:
        super().clear_connector_metadata()
        return self.inner.clear_connector_metadata()

    def handle_preemptions(self, kv_connector_metadata: Any) -> None:
        return self.inner.handle_preemptions(kv_connector_metadata)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        return self.inner.start_load_kv(forward_context, **kwargs)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return self.inner.wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        return self.inner.save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)

    def wait_for_save(self) -> None:
        return self.inner.wait_for_save()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return self.inner.get_finished(finished_req_ids)

    def get_transfer_results(self, finished_req_ids: set[str]) -> Any:
        if type(self.inner).get_transfer_results is not KVConnectorBase_V1.get_transfer_results:
            return self.inner.get_transfer_results(finished_req_ids)
        # (the base class answers from `self.get_finished`: a subclass's `get_finished` is the one heard)
        return KVConnectorBase_V1.get_transfer_results(self, finished_req_ids)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.inner.get_block_ids_with_load_errors()

    def get_kv_connector_stats(self) -> Any:
        return self.inner.get_kv_connector_stats()

    def get_kv_connector_kv_cache_events(self) -> Any:
        return self.inner.get_kv_connector_kv_cache_events()

    def build_connector_worker_meta(self) -> Any:
        return self.inner.build_connector_worker_meta()

    def get_handshake_metadata(self) -> Any:
        return self.inner.get_handshake_metadata()

    def finish_forward(self) -> None:
        return self.inner.finish_forward()

    def reset_capture_state(self) -> None:
        return self.inner.reset_capture_state()

    def set_host_xfer_buffer_ops(self, copy_operation: Any) -> None:
        return self.inner.set_host_xfer_buffer_ops(copy_operation)

    def get_mem_pool_context(self) -> Any:
        return self.inner.get_mem_pool_context()

    def shutdown(self) -> None:
        return self.inner.shutdown()
