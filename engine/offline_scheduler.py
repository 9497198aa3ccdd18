"""A real vLLM scheduler (normally our plug-in) built in this process with no model and no
workers: for tests and benchmarks of scheduling logic on vLLM's own request states, queues and
block pool."""

from __future__ import annotations

import collections
import itertools

import torch
from vllm import SamplingParams
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.utils.hashing import sha256_cbor
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from engine.models import resolve_model
from engine.vllm_scheduler import POLICY_KEY
from engine.vllm_views import PARTIAL_TURN_ARG

BS = 16
init_none_hash(sha256_cbor)
BLOCK_HASHER = get_request_block_hasher(BS, sha256_cbor)  # for Requests made outside the engine
PARTIAL = SamplingParams(max_tokens=1, temperature=0.0, extra_args={PARTIAL_TURN_ARG: True})


def final(max_tokens: int = 2) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0)


def make_scheduler(scheduler_cls, policy: str, num_blocks: int = 64, max_num_seqs: int = 4,
                   budget: int = 256, log_stats: bool = False, watermark: float = 0.0,
                   kv_transfer_config=None) -> Scheduler:
    """`kv_transfer_config` (vLLM's `KVTransferConfig`) gives the scheduler its KV connector's
    scheduler side, built by vLLM as in an engine core."""
    path = resolve_model("tiny")
    model = ModelConfig(model=path, tokenizer=path, max_model_len=2048, dtype="float32",
                        skip_tokenizer_init=True)
    sched = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=2048,
                            is_encoder_decoder=False, watermark=watermark)
    cache = CacheConfig(block_size=BS, enable_prefix_caching=True)
    cache.num_gpu_blocks = num_blocks
    config = VllmConfig(model_config=model, cache_config=cache, scheduler_config=sched,
                        additional_config={POLICY_KEY: policy}, kv_transfer_config=kv_transfer_config)
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                       kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    return scheduler_cls(vllm_config=config, kv_cache_config=kv,
                         structured_output_manager=StructuredOutputManager(config), block_size=BS,
                         log_stats=log_stats)


class Driver:
    """Feeds requests and turns to a scheduler and runs steps the way the engine core does; plays
    the model runner: one sampled token for each scheduled request past its prefill.

    `depth` is the engine core's batch queue: 1 runs `schedule()` then `update_from_output()` in
    lockstep (the synchronous engine); 2 is vLLM's async scheduling (`EngineCore.step_with_batch_queue`):
    the next step is scheduled before the last one's output is back, so requests carry output
    placeholders when they are scheduled and viewed."""

    def __init__(self, scheduler: Scheduler, depth: int = 1):
        self.s = scheduler
        self.depth = depth
        self.in_flight: collections.deque = collections.deque()  # (output, runner output), newest first
        self.clock = itertools.count(1)
        self.tokens = itertools.count(1000)
        self.finished: set[str] = set()
        self.outputs: dict[str, list[int]] = {}
        self.kv_params: dict[str, dict] = {}  # final outputs' kv_transfer_params, by request
        self.stats = None                     # the last step's SchedulerStats (when log_stats is on)
        self.stop_reasons: dict[str, list] = {}  # stop reason of every turn's end, by request
        self.loaded: set[str] = set()  # KV loads the next delivered output reports done (the worker's part)

    def turn(self, rid: str, n: int, params=PARTIAL, resumable: bool = True) -> None:
        ids = [next(self.tokens) % 5000 for _ in range(n)]
        self.s.add_request(Request(rid, ids, params, None, arrival_time=float(next(self.clock)),
                                   resumable=resumable, block_hasher=BLOCK_HASHER))

    def end(self, rid: str) -> None:
        """Close a streamed session (the input generator ended)."""
        self.s.add_request(Request(rid, [1], PARTIAL, None, resumable=False))

    def step(self):
        """One engine-core iteration; returns the step it scheduled (None if it scheduled none)."""
        out = None
        if self.depth == 1 or self.s.has_requests():
            out = self.s.schedule()
            ids = list(out.num_scheduled_tokens)
            # a request past its prefill samples a token (vLLM: not `is_prefill_chunk` after the step)
            sampled = [[] if self.s.requests[rid].is_prefill_chunk else [7] for rid in ids]
            self.in_flight.appendleft((out, ModelRunnerOutput(
                req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled)))
            if len(self.in_flight) < self.depth and (out.total_num_scheduled_tokens or self.s.has_requests()):
                return out
        if self.in_flight:
            self._deliver(*self.in_flight.pop())
        return out

    def _deliver(self, out, runner) -> None:
        if self.loaded:
            runner.kv_connector_output = KVConnectorOutput(finished_recving=set(self.loaded))
            self.loaded.clear()
        for outputs in self.s.update_from_output(out, runner).values():
            self.stats = outputs.scheduler_stats or self.stats
            for o in outputs.outputs:
                self.outputs.setdefault(o.request_id, []).extend(o.new_token_ids)
                if o.finish_reason is not None:
                    self.stop_reasons.setdefault(o.request_id, []).append(o.stop_reason)
                if o.kv_transfer_params:
                    self.kv_params[o.request_id] = o.kv_transfer_params
                if o.finish_reason is not None:
                    self.finished.add(o.request_id)

    def run_until(self, done, max_steps: int = 500) -> int:
        for n in range(max_steps):
            if done():
                return n
            self.step()
        raise AssertionError(f"condition not reached in {max_steps} steps")
