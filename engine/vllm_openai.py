"""vLLM's own OpenAI serving layer (the classes `vllm serve` uses) over a replica's AsyncLLM.

As Ray Serve LLM does: `init_app_state` with the arguments `vllm serve` would parse for this
engine, then `OpenAIServingChat.create_chat_completion` / `OpenAIServingCompletion.create_completion`
per request, so every field vLLM supports works as it does there. Two differences, both on purpose:
a field vLLM's request model does not declare is a 400 naming it (vLLM logs and ignores it), and a
prompt over the context length carries OpenAI's code `context_length_exceeded`.

What crosses Ray is plain data (`OpenAIReply`, SSE strings, `OpenAITimings`): the ingress never
imports vLLM.
"""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterator

from engine.api import OpenAIReply, OpenAITimings

ROUTES = ("chat", "completion")
_timings: contextvars.ContextVar[OpenAITimings | None] = contextvars.ContextVar("openai_timings", default=None)


class _TimedEngineClient:
    """The AsyncLLM, with `generate` timed into the request's `OpenAITimings` (TTFT, TPOT)."""

    def __init__(self, llm):
        self._llm = llm

    def __getattr__(self, name):
        return getattr(self._llm, name)

    async def generate(self, *args, **kwargs):
        timings = _timings.get()
        first = True
        async for output in self._llm.generate(*args, **kwargs):
            if timings is not None and first:  # each prompt of the request is one generate call
                timings.prompt_tokens += len(output.prompt_token_ids or ())
            first = False
            if timings is not None and output.metrics is not None:
                _observe(timings, output.metrics)
            yield output


def _observe(timings: OpenAITimings, stats) -> None:
    """vLLM's own per-request stats (`RequestStateStats`): first-token latency, token timestamps."""
    if stats.num_generation_tokens > 0:
        timings.ttft_s = stats.first_token_latency
        timings.output_tokens = stats.num_generation_tokens
    if stats.num_generation_tokens > 1:
        timings.tpot_s = (stats.last_token_ts - stats.first_token_ts) / (stats.num_generation_tokens - 1)


def serve_args(engine_kwargs: dict):
    """The Namespace `vllm serve` parses for this engine: its CLI defaults, then our engine's args."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args([])
    for key, value in engine_kwargs.items():
        setattr(args, key, value)
    return args


class OpenAIFrontend:
    """Chat and completion serving of one replica's engine."""

    def __init__(self, chat, completion, request_classes: dict):
        self._serving = {"chat": chat, "completion": completion}
        self._request_classes = request_classes

    @classmethod
    async def create(cls, llm, config) -> "OpenAIFrontend":
        from starlette.datastructures import State
        from vllm.entrypoints.openai.api_server import init_app_state
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest

        from engine.engine_args import engine_kwargs

        state = State()
        await init_app_state(_TimedEngineClient(llm), state, serve_args(engine_kwargs(config)),
                             supported_tasks=await llm.get_supported_tasks())
        return cls(state.openai_serving_chat, state.openai_serving_completion,
                   {"chat": ChatCompletionRequest, "completion": CompletionRequest})

    def unknown_fields(self, route: str, body: dict) -> list[str]:
        request_class = self._request_classes[route]
        known = set(request_class.model_fields)
        known |= {f.alias for f in request_class.model_fields.values() if f.alias}
        return sorted(set(body) - known)

    async def serve(self, route: str, body: dict) -> AsyncIterator[OpenAIReply | str | OpenAITimings]:
        """One `OpenAIReply` (the status; the body unless it streams), then the SSE strings of a
        stream, then the request's `OpenAITimings`."""
        from pydantic import ValidationError
        from vllm.entrypoints.serve.engine.protocol import ErrorResponse
        from vllm.entrypoints.serve.exception_handling.error_response import create_error_response

        if route not in ROUTES:
            raise ValueError(f"unknown OpenAI route {route!r}; known: {ROUTES}")
        unknown = self.unknown_fields(route, body)
        if unknown:
            yield _error(400, f"Unrecognized request argument supplied: {', '.join(unknown)} (not supported "
                         "by this server)", "invalid_request_error", unknown[0], "unknown_parameter")
            return
        try:
            request = self._request_classes[route].model_validate(body)
        except ValidationError as e:
            yield _error(400, str(e), "BadRequestError", None, 400)
            return
        timings = OpenAITimings()
        token = _timings.set(timings)
        try:
            serving = self._serving[route]
            create = serving.create_chat_completion if route == "chat" else serving.create_completion
            try:
                result = await create(request, None)
            except Exception as e:  # as `vllm serve`'s exception handlers answer them
                result = create_error_response(e)
            if isinstance(result, ErrorResponse):
                yield _from_vllm_error(result.model_dump())
            elif hasattr(result, "model_dump"):
                yield OpenAIReply(200, result.model_dump())
            else:
                yield OpenAIReply(200, None)
                async for line in result:
                    yield line
        finally:
            _timings.reset(token)
        yield timings


def _error(status: int, message: str, kind: str, param: str | None, code) -> OpenAIReply:
    return OpenAIReply(status, {"error": {"message": message, "type": kind, "param": param, "code": code}})


def _from_vllm_error(body: dict) -> OpenAIReply:
    """vLLM's error object (its `code` is the HTTP status); an over-long prompt gets OpenAI's code."""
    error = body["error"]
    status = int(error.get("code") or 400)
    if status == 400 and "maximum context length" in error.get("message", ""):
        error = {**error, "code": "context_length_exceeded"}
    return OpenAIReply(status, {"error": error})
