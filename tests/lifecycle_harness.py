"""A tiny float32 engine on its own event-loop thread, for the session lifecycle tests.

Hypothesis rules are synchronous and the engine is asyncio: the engine lives on a loop in a thread
and each step runs there with a deadline, so a hang fails the step instead of the whole run.
"""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from engine.api import SamplingConfig
from engine.config import EngineConfig

STEP_DEADLINE_S = float(os.environ.get("STREAM2LLM_STATEFUL_DEADLINE_S", "90"))  # one step on 2 loaded cores: a few tiny-model prefills and 8 decode steps
GREEDY = SamplingConfig(max_tokens=8)
MAX_MODEL_LEN, ANSWER_BUDGET = 512, 16
# float32 (1 KiB per token for the tiny model): 640 tokens = 20 blocks, a full session and a bit
# (max_model_len needs 16), so two or three open sessions force the scheduler to evict. float32
# because recomputing an evicted context can flip a bfloat16 near-tie of the random-weight model
# (tests/test_engine_pressure.py).
KV_BYTES = 640 << 10
# TailGuard ranks idle streams last, so a session with work evicts them (under default_vllm's
# first-come order an earlier idle session is never evicted for a later one: the later one waits).
POLICY = os.environ.get("STREAM2LLM_STATEFUL_POLICY", "tailguard")
PIECES = [" ".join(f"p{p} w{w} v{(p * 7 + w) % 11}" for w in range(words))
          for p, words in enumerate([6, 12, 20, 30, 45, 60])]
QUESTION = "Question: which value comes first?"


class LoopThread:
    """An event loop in a thread that runs one coroutine at a time for synchronous callers."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = STEP_DEADLINE_S):
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise AssertionError(f"a step hung for more than {timeout} s") from None

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def engine_on_thread():
    from engine.vllm_engine import create_engine

    runner = LoopThread()
    engine = runner.run(create_engine(EngineConfig(
        model="tiny", dtype="float32", max_model_len=MAX_MODEL_LEN, kv_cache_memory_bytes=KV_BYTES,
        max_num_seqs=8, answer_budget_tokens=ANSWER_BUDGET, policy=POLICY)), timeout=600)
    yield engine, runner
    runner.run(engine.shutdown(), timeout=120)
    runner.stop()


async def read_answer(deltas, limit: int | None = None) -> tuple[list[int], str | None]:
    """Read the answer (`limit` deltas at most, then close the reader): token ids, finish reason."""
    ids, reason = [], None
    try:
        async for delta in deltas:
            ids.extend(delta.token_ids)
            reason = delta.finish_reason if delta.finished else reason
            if limit is not None and (limit := limit - 1) <= 0:
                break
    finally:
        await deltas.aclose()
    return ids, reason


async def settled(engine, timeout_s: float = 60.0) -> None:
    """KV, vLLM requests, slots and sessions back to baseline (stats settle after the last step)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        stats = await engine.stats()
        left = {"kv_blocks_used": stats.kv_blocks_used, "sessions_active": stats.sessions_active,
                **{k: stats.extra[k] for k in ("requests_in_flight", "running", "waiting")}}
        if not any(left.values()):
            return
        if loop.time() > deadline:
            raise AssertionError(f"not back to baseline after all sessions ended: {left}")
        await asyncio.sleep(0.1)
