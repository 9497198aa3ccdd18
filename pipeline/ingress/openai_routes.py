"""OpenAI-compatible /v1/models, /v1/completions and /v1/chat/completions (streaming and not).

One-shot generation on the engine replicas (`StreamingEngine.generate`), admitted by the central
scheduler like sessions (`admit_request`: a lease on the replica it names, released when the
request ends); streaming answers use OpenAI's `data: {...}` chunks ending in `[DONE]`. Errors are
OpenAI's error object (`{"error": {"message", "type", "param", "code"}}`), also in-band after a
stream started (a `data:` line with the error object, then `[DONE]`).
"""

from __future__ import annotations

import json
import time
import uuid

from pipeline.replica.answers import AnswerEnd
from pipeline.errors import ModelNotFound, openai_error
from pipeline.ingress.http_util import ClosingStreamingResponse
from pipeline.schemas import ChatCompletionRequest, CompletionRequest


def models(config) -> dict:
    name = config.model.served_name
    return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "stream2llm",
                                        "created": 0, "root": config.model.model}]}


def _check(ing, model: str, max_tokens: int) -> None:
    if model != ing.config.model.served_name:
        raise ModelNotFound(f"The model {model!r} does not exist; this server serves "
                            f"{ing.config.model.served_name!r}")
    ing.config.check_answer_length(max_tokens)


def _sampling(body, max_tokens: int) -> dict:
    return {"max_tokens": max_tokens, "temperature": body.temperature, "top_p": body.top_p, "seed": body.seed}


async def completions(ing, body: CompletionRequest):
    _check(ing, body.model, body.max_tokens)
    return await _respond(ing, body, body.prompt, body.max_tokens, "text_completion", _text_choice)


async def chat_completions(ing, body: ChatCompletionRequest):
    _check(ing, body.model, body.answer_tokens())
    messages = [m.model_dump() for m in body.messages]
    return await _respond(ing, body, {"messages": messages}, body.answer_tokens(), "chat.completion", _chat_choice)


async def _admit(ing, prompt: str | dict, max_tokens: int) -> tuple[str, str]:
    request_id = uuid.uuid4().hex
    text = prompt if isinstance(prompt, str) else "\n".join(_content_text(m["content"]) for m in prompt["messages"])
    return request_id, await ing.client.admit_request(request_id, text, max_tokens)


def _content_text(content) -> str:
    """A message's text: a string, or OpenAI's list of parts."""
    if isinstance(content, str):
        return content
    return "\n".join(part.get("text", "") for part in content if isinstance(part, dict))


async def _respond(ing, body, prompt: str | dict, max_tokens: int, kind: str, choice):
    """`prompt` is text, or {"messages": [...]} for the replica to render with the chat template."""
    request_id, replica_id = await _admit(ing, prompt, max_tokens)
    text, extra = (None, prompt) if isinstance(prompt, dict) else (prompt, {})
    stream = ing.handle.options(stream=True).generate.remote(text, _sampling(body, max_tokens), route_to=replica_id,
                                                             **extra)
    rid = f"{'chatcmpl' if kind.startswith('chat') else 'cmpl'}-{request_id}"
    head = {"id": rid, "created": int(time.time()), "model": body.model}
    def release():
        ing.client.central.release(request_id)  # posted: rides the process's next batch

    if body.stream:
        return ClosingStreamingResponse(_chunks(ing, stream, head, kind, choice, release),
                                        media_type="text/event-stream")
    try:
        text, reason, stats = "", None, {}
        async for item in stream:
            if isinstance(item, AnswerEnd):
                stats = item.stats
                continue
            text += item.text
            reason = item.finish_reason or reason
    finally:
        release()
    ing.metrics.observe_final(kind, stats)
    usage = {"prompt_tokens": stats.get("context_tokens", 0), "completion_tokens": stats.get("output_tokens", 0)}
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return {**head, "object": kind, "choices": [choice(text, reason, final=True)], "usage": usage}


async def _chunks(ing, stream, head: dict, kind: str, choice, release):
    obj = f"{kind}.chunk" if kind.startswith("chat") else kind
    try:
        async for item in stream:
            if isinstance(item, AnswerEnd):
                ing.metrics.observe_final(kind, item.stats)
                continue
            payload = {**head, "object": obj, "choices": [choice(item.text, item.finish_reason, final=False)]}
            yield f"data: {json.dumps(payload)}\n\n"
    except Exception as e:  # the status line is gone: OpenAI's error object in-band
        yield f"data: {json.dumps(openai_error(e))}\n\n"
    finally:
        release()
    yield "data: [DONE]\n\n"


def _text_choice(text: str, reason, final: bool) -> dict:
    return {"index": 0, "text": text, "finish_reason": reason, "logprobs": None}


def _chat_choice(text: str, reason, final: bool) -> dict:
    key = "message" if final else "delta"
    return {"index": 0, key: {"role": "assistant", "content": text}, "finish_reason": reason}
