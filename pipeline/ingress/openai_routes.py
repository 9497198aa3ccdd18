"""OpenAI-compatible /v1/models, /v1/completions and /v1/chat/completions.

The engine replicas serve them with vLLM's own OpenAI serving layer, the classes `vllm serve` uses
(`engine.vllm_openai`), so every field vLLM supports works as it does there, and a field vLLM's
request models do not declare is a 400 naming it. The ingress keeps what it owns in front: the model
name (404 `model_not_found`), a max_tokens that no prompt could fit (400 `context_length_exceeded`),
admission by the central scheduler (`admit_request`: a lease on the replica it names, released when
the request ends, with the tokens it held; 429 with Retry-After when refused). It forwards the body
as the client sent it and streams back what the replica yields: vLLM's response or error object with
its status, or its SSE lines (`data: {...}` chunks, usage when `stream_options.include_usage`,
`data: [DONE]`).
"""

from __future__ import annotations

import json
import uuid

from fastapi.responses import JSONResponse

from engine.api import OpenAITimings
from pipeline.errors import ModelNotFound, NeverFits, openai_error
from pipeline.ingress.http_util import ClosingStreamingResponse
from pipeline.schemas import ChatCompletionRequest, CompletionRequest

ENDPOINT = {"completion": "text_completion", "chat": "chat.completion"}  # the TTFT histogram's label


def models(config) -> dict:
    name = config.model.served_name
    return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "stream2llm",
                                        "created": 0, "root": config.model.model,
                                        "max_model_len": config.model.max_model_len}]}


async def completions(ing, body: CompletionRequest):
    return await _serve(ing, "completion", body)


async def chat_completions(ing, body: ChatCompletionRequest):
    return await _serve(ing, "chat", body)


def _check(ing, body) -> None:
    served = ing.config.model.served_name
    if body.model != served:
        raise ModelNotFound(f"The model {body.model!r} does not exist; this server serves {served!r}")
    limit, answer = ing.config.model.max_model_len, body.answer_tokens()
    if answer is not None and answer >= limit:
        raise NeverFits(f"This model's maximum context length is {limit} tokens; max_tokens "
                                    f"{answer} leaves no room for any prompt")


async def _admit(ing, route: str, body) -> tuple[str, str]:
    """A lease for the prompt (estimated) and the answers (n x max tokens, or the answer budget when absent)."""
    request_id = uuid.uuid4().hex
    text, token_ids = body.prompt_parts()
    asked = body.answer_tokens()
    answer = asked or ing.config.model.answer_budget_tokens
    return request_id, await ing.client.admit_request(request_id, text, answer, token_ids, answers=body.n or 1,
                                                      fit_tokens=asked or 1, kind=route)


def _releaser(ing, route: str, body, request_id: str):
    """The lease's release, with the tokens the request really held; the prompt's count (the
    engine's) calibrates the estimate later leases are sized by."""
    seen: list[OpenAITimings] = []

    def release():
        held = None
        if seen and seen[-1].prompt_tokens:
            timings = seen[-1]
            text, token_ids = body.prompt_parts()
            ing.client.prompt_estimate(route).observe(len(text), timings.prompt_tokens - token_ids)
            held = timings.prompt_tokens + timings.output_tokens
        ing.client.central.release(request_id, held)  # posted: rides the process's next batch
    return seen, release


async def _serve(ing, route: str, body):
    _check(ing, body)
    request_id, replica_id = await _admit(ing, route, body)
    seen, release = _releaser(ing, route, body, request_id)
    items = _replica_items(ing.handle.options(stream=True).openai.remote(route, body.forwarded(),
                                                                          route_to=replica_id), seen)
    try:
        head = await items.__anext__()
    except BaseException:
        await items.aclose()
        release()
        raise
    if head.body is not None:  # a whole response or an error: vLLM's status and body
        await _finish(ing, route, items, release)
        return JSONResponse(head.body, status_code=head.status)
    return ClosingStreamingResponse(_lines(ing, route, items, release), media_type="text/event-stream")


async def _replica_items(stream, seen: list):
    """The replica's items (its `OpenAITimings` also into `seen`); a stream left early (the client
    went away) is cancelled, which aborts the request in the engine and frees its KV."""
    done = False
    try:
        async for item in stream:
            if isinstance(item, OpenAITimings):
                seen.append(item)
            yield item
        done = True
    finally:
        if not done:
            stream.cancel()


async def _finish(ing, route: str, items, release) -> None:
    """Read the timings that follow a whole response, then release the lease."""
    try:
        async for item in items:
            _observe(ing, route, item)
    finally:
        release()


async def _lines(ing, route: str, items, release):
    try:
        async for item in items:
            if isinstance(item, str):
                yield item
            else:
                _observe(ing, route, item)
    except Exception as e:  # the status line is gone: OpenAI's error object in-band
        yield f"data: {json.dumps(openai_error(e))}\n\ndata: [DONE]\n\n"
    finally:
        await items.aclose()
        release()


def _observe(ing, route: str, item) -> None:
    if isinstance(item, OpenAITimings):
        ing.metrics.observe_openai(ENDPOINT[route], item)

