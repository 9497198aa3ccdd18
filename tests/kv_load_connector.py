"""A KV connector for scheduler tests (vLLM's connector interface, built by vLLM from its module
path): every request whose id starts with `load-` finds its prompt's KV, but one block, in external
storage, loaded asynchronously, so vLLM parks it in `WAITING_FOR_REMOTE_KVS` with its blocks
allocated until the worker reports the load done (`tests.sched_harness.Driver.loaded`). Nothing is
stored or moved: the scheduler side is what these tests exercise."""

from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
    ExampleConnector,
    ExampleConnectorMetadata,
)

LOAD_PREFIX = "load-"


class AsyncLoadConnector(ExampleConnector):
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        if not request.request_id.startswith(LOAD_PREFIX) or request.num_preemptions:
            return 0, False
        hit = (request.num_prompt_tokens - 1) // self._block_size * self._block_size
        return max(0, hit - num_computed_tokens), hit > num_computed_tokens

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        pass

    def build_connector_meta(self, scheduler_output):
        return ExampleConnectorMetadata()
