"""Idle streaming sessions do not hold `max_num_seqs` slots (real engine, tiny model).

Stock vLLM 0.32 counts every session waiting for its next chunk against `max_num_seqs`: with more
idle sessions than slots, new sessions and one-shot requests stall. The plug-in parks idle sessions
outside that count.
"""

import asyncio

from engine.api import SamplingConfig
from engine.config import EngineConfig
from tests.conftest import collect

MAX_NUM_SEQS = 4
ANSWER = SamplingConfig(max_tokens=4)


async def test_three_times_max_num_seqs_idle_sessions_do_not_block_new_work():
    from engine.vllm_engine import create_engine

    engine = await create_engine(EngineConfig(model="tiny", max_model_len=1024, max_num_seqs=MAX_NUM_SEQS,
                                              kv_cache_memory_bytes=8 << 20, answer_budget_tokens=32))
    try:
        idle = [await engine.open_session() for _ in range(3 * MAX_NUM_SEQS)]
        for n, sid in enumerate(idle):
            await engine.append(sid, text=f"idle session {n} context words " * 4)
        await asyncio.wait_for(asyncio.gather(*(engine.wait_prefilled(sid) for sid in idle)), timeout=120)
        one_shot = collect(engine.generate(prompt="a one-shot question", sampling=ANSWER))

        async def new_session():
            sid = await engine.open_session()
            await engine.append(sid, text="a new session's context " * 4)
            return await collect(engine.finish(sid, question="and its question?", sampling=ANSWER))

        (ids_one, _), (ids_new, _) = await asyncio.wait_for(asyncio.gather(one_shot, new_session()),
                                                            timeout=120)
        assert ids_one and ids_new
        answers = await asyncio.wait_for(asyncio.gather(
            *(collect(engine.finish(sid, question="q?", sampling=ANSWER)) for sid in idle)), timeout=120)
        assert all(ids for ids, _ in answers)  # the idle sessions were intact
    finally:
        await engine.shutdown()
