"""vLLM's CPU KV offloading with the project's recompute-vs-swap choice (GPU only).

vLLM V1 has no swap preemption mode. Its `OffloadingConnector` copies KV blocks to a bounded host
pool as they fill; a preempted request that is scheduled again finds its blocks there and loads
them instead of recomputing. This subclass asks the calibrated cost model, per resuming request and
on that request's own KV size, whether the load is cheaper than recomputing
(`scheduler.preemption.choose_resume_kind`); when it is not, the connector reports no hit and vLLM
recomputes. Enabled by `EngineConfig(kv_offload_gib=..., cost_model_path=...)`; without a cost
model vLLM's plain connector is used (always load).
"""

from __future__ import annotations

from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector

from engine.config import EngineConfigError
from scheduler.cost_model import load_cost_model
from scheduler.preemption import RECOMPUTE, choose_resume_kind

COST_MODEL_KEY = "stream2llm_cost_model"
CONNECTOR_NAME = "CostAwareOffloadingConnector"


class CostAwareOffloadingConnector(OffloadingConnector):
    def __init__(self, vllm_config, role, kv_cache_config):
        super().__init__(vllm_config, role, kv_cache_config)
        self._cost = load_cost_model(vllm_config.kv_transfer_config.kv_connector_extra_config[COST_MODEL_KEY])
        self._block_size = vllm_config.cache_config.block_size
        self.recomputed_instead_of_loaded = 0

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        tokens, load_async = super().get_num_new_matched_tokens(request, num_computed_tokens)
        if tokens and choose_resume_kind(tokens, self._block_size, self._cost) == RECOMPUTE:
            self.recomputed_instead_of_loaded += 1
            return 0, False  # no external hit: vLLM schedules the tokens as a prefill
        return tokens, load_async


def use_cost_aware_offload(vllm_config, cost_model_path: str) -> None:
    """Point an offloading-enabled `VllmConfig` at the cost-aware connector."""
    transfer = vllm_config.kv_transfer_config
    if transfer is None or transfer.kv_connector not in ("OffloadingConnector", CONNECTOR_NAME):
        raise EngineConfigError("cost-aware offload needs vLLM's native KV offloading (kv_offload_gib)")
    transfer.kv_connector = CONNECTOR_NAME
    transfer.kv_connector_module_path = __name__
    transfer.kv_connector_extra_config[COST_MODEL_KEY] = str(cost_model_path)
