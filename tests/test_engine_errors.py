"""Bad input gets a typed error and leaves the engine clean (real vLLM on CPU)."""

import asyncio

import pytest

from engine.api import (ContextTooLongError, InvalidInputError, SamplingConfig,
                        SessionNotFoundError, SessionStateError)
from tests.conftest import collect, wait_for_kv_blocks

SHORT = SamplingConfig(max_tokens=4)


async def test_context_too_long_leaves_session_usable(tiny_engine):
    sid = await tiny_engine.open_session()
    await tiny_engine.append(sid, "a short first chunk")
    before = tiny_engine.session_stats(sid).context_tokens
    with pytest.raises(ContextTooLongError) as caught:
        await tiny_engine.append(sid, token_ids=[5] * tiny_engine.max_model_len)
    assert caught.value.limit == tiny_engine.max_model_len - 32 and not caught.value.session_closed
    assert str(caught.value.limit) in str(caught.value)
    with pytest.raises(ContextTooLongError):
        await tiny_engine.replace(sid, token_ids=[5] * tiny_engine.max_model_len)
    assert tiny_engine.session_stats(sid).context_tokens == before
    with pytest.raises(ContextTooLongError):  # the answer budget would not fit either
        tiny_engine.finish(sid, "why?", sampling=SamplingConfig(max_tokens=tiny_engine.max_model_len))
    ids, _ = await collect(tiny_engine.finish(sid, "still fine?", sampling=SHORT))
    assert len(ids) == SHORT.max_tokens


async def test_input_after_finish_and_unknown_sessions(tiny_engine):
    sid = await tiny_engine.open_session()
    await tiny_engine.append(sid, "context")
    answer = tiny_engine.finish(sid, "question?", sampling=SHORT)
    with pytest.raises(SessionStateError):
        await tiny_engine.append(sid, "late chunk")
    with pytest.raises(SessionStateError):
        tiny_engine.finish(sid, "again?")
    await collect(answer)
    for call in (tiny_engine.append(sid, "x"), tiny_engine.abort(sid), tiny_engine.append("nope", "x")):
        with pytest.raises(SessionNotFoundError):
            await call
    with pytest.raises(SessionStateError):
        await tiny_engine.open_session(await tiny_engine.open_session("dup"))
    await tiny_engine.abort("dup")


@pytest.mark.parametrize("bad", [b"\xff\xfe broken", "lone \udc80 surrogate", 42])
async def test_invalid_text_is_rejected(tiny_engine, bad):
    sid = await tiny_engine.open_session()
    with pytest.raises(InvalidInputError):
        await tiny_engine.append(sid, bad)
    await tiny_engine.append(sid, "valid text still works".encode())
    await tiny_engine.abort(sid)


async def test_invalid_token_ids_and_arguments(tiny_engine):
    sid = await tiny_engine.open_session()
    for kwargs in ({"token_ids": [-1]}, {"token_ids": [10**9]}, {"token_ids": [1.5]}, {},
                   {"text": "a", "token_ids": [1]}):
        with pytest.raises(InvalidInputError):
            await tiny_engine.append(sid, **kwargs)
    with pytest.raises(InvalidInputError):
        tiny_engine.finish(sid, "")
    await tiny_engine.abort(sid)


async def test_interleaved_operations_on_one_session_apply_in_call_order(tiny_engine):
    # append and update never suspend, so concurrent calls cannot interleave inside each other
    sid = await tiny_engine.open_session()
    await tiny_engine.append(sid, "first context " * 20)
    replaced = "entirely different context " * 20
    update = asyncio.create_task(tiny_engine.replace(sid, replaced))
    append = asyncio.create_task(tiny_engine.append(sid, " racing chunk"))
    await asyncio.gather(update, append)
    expected = len(tiny_engine.tokenize(replaced)) + len(tiny_engine.tokenize(" racing chunk"))
    assert tiny_engine.session_stats(sid).context_tokens == expected
    ids, _ = await collect(tiny_engine.finish(sid, "ok?", sampling=SHORT))
    assert len(ids) == SHORT.max_tokens
    assert await wait_for_kv_blocks(tiny_engine, 0) == 0
