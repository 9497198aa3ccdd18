"""Request bodies (pydantic at the HTTP boundary; strict types, unknown fields rejected).

The OpenAI-compatible models read only what the ingress acts on (model, stream, max tokens, the
prompt for an admission estimate) and keep every other field as sent: the body goes on to vLLM's own
request models on the replica (`engine.vllm_openai`), which validate it as `vllm serve` does.
Importing those here would load vLLM into the ingress process (seconds and hundreds of MB).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator

from stream2llm.data.traces import PromptMode


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Sampling(_Body):
    max_tokens: StrictInt = Field(64, ge=1)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: StrictInt | None = None


class Source(_Body):
    """Where /v1/rag looks: exactly the fields of its `type`."""

    type: Literal["crawl", "search", "vector", "trace", "documents", "corpus"]
    seed_urls: list[StrictStr] | None = None     # crawl
    query: StrictStr | None = None               # search, vector (default: the question)
    trace: StrictStr | None = None               # trace: file name under the trace folder
    documents: list[StrictStr] | None = None     # documents: inline texts (client-side retrieval)
    doc_ids: list[StrictStr] | None = None       # corpus: offline Wikipedia doc ids
    top_k: StrictInt | None = Field(None, ge=1, le=64)

    @model_validator(mode="after")
    def _needs(self):
        need = {"crawl": "seed_urls", "trace": "trace", "documents": "documents", "corpus": "doc_ids"}
        field = need.get(self.type)
        if field and not getattr(self, field):
            raise ValueError(f"source type {self.type!r} needs a non-empty {field!r}")
        return self


class RagRequest(_Body):
    question: StrictStr = Field(min_length=1)
    source: Source
    stream: StrictBool = True
    prompt_mode: PromptMode = Field(
        PromptMode.STREAM,
        description="stream: prefill context as it arrives; oneshot: the baseline, one prompt after retrieval")
    sampling: Sampling = Field(default_factory=Sampling)


class OpenStream(_Body):
    source_type: StrictStr = Field("client", min_length=1, max_length=32)


SEQ_DOC = ("Client sequence number of this change, increasing per session: a change whose seq is not above "
           "the last applied one is a retry and a no-op (answered with the session's summary, duplicate=true).")


class ChunkBody(_Body):
    text: StrictStr = Field(min_length=1, description="The chunk's text.")
    source_id: StrictStr | None = Field(None, description="Names the document (citations).")
    title: StrictStr | None = Field(None, description="The document's title.")
    seq: StrictInt | None = Field(None, ge=0, description=SEQ_DOC)


class ReplaceBody(_Body):
    chunks: list[ChunkBody] = Field(min_length=1, description="The whole new context, in order.")
    seq: StrictInt | None = Field(None, ge=0, description=SEQ_DOC)


class FinishBody(_Body):
    question: StrictStr = Field(min_length=1)
    stream: StrictBool = True
    sampling: Sampling = Field(default_factory=Sampling)


class _OpenAIRequest(BaseModel):
    """The fields of an OpenAI request the ingress reads; the others are kept as sent and forwarded."""

    model_config = ConfigDict(extra="allow")
    model: StrictStr = Field(description="The served model name (`model.served_name`); another name is a 404.")
    stream: StrictBool | None = Field(None, description="Answer as server-sent `data:` chunks ending in [DONE].")
    max_tokens: StrictInt | None = Field(None, ge=1, description="Most tokens to generate (vLLM's default when "
                                         "absent: what the context length leaves).")

    n: StrictInt | None = Field(None, ge=1, description="Completions to generate for the prompt (each holds its "
                                "own answer's KV: admission counts them).")

    def forwarded(self) -> dict:
        """The body as the client sent it (unset fields stay unset), for vLLM's request models."""
        return self.model_dump(exclude_unset=True)


class CompletionRequest(_OpenAIRequest):
    """OpenAI /v1/completions, served by vLLM's completion serving on a replica."""

    prompt: StrictStr | list = Field(description="Text, a list of texts, token ids, or a list of token-id lists.")

    def answer_tokens(self) -> int | None:
        return self.max_tokens

    def prompt_parts(self) -> tuple[str, int]:
        """The prompt's text (its texts joined) and how many token ids it gives as ids."""
        return _parts(self.prompt)


class ChatCompletionRequest(_OpenAIRequest):
    """OpenAI /v1/chat/completions, served by vLLM's chat serving (the model's chat template)."""

    messages: list[dict] = Field(min_length=1, description="The conversation; `content` a string or a list "
                                 "of parts, as OpenAI's API takes it.")
    max_completion_tokens: StrictInt | None = Field(None, ge=1, description="OpenAI's newer name of max_tokens; "
                                                    "wins over it.")

    def answer_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def prompt_parts(self) -> tuple[str, int]:
        """The messages' text (a string content, or the text of its parts) and their token ids (none)."""
        return _parts([m.get("content") for m in self.messages])


def _parts(content) -> tuple[str, int]:
    """Text and token-id count of a prompt or message content: text, text parts, token ids, or lists of those."""
    if isinstance(content, str):
        return content, 0
    if isinstance(content, int):
        return "", 1
    if isinstance(content, dict):
        return _parts(content.get("text"))
    if isinstance(content, list):
        parts = [_parts(c) for c in content]
        return "\n".join(text for text, _ in parts if text), sum(ids for _, ids in parts)
    return "", 0


# ---- documented responses (OpenAPI): the error shapes of pipeline.ingress.http_util -------------------
class ErrorBody(BaseModel):
    """Every error of the stream2llm routes (extra fields: `retry_after_s` on 429)."""

    model_config = ConfigDict(extra="allow")
    error: str = Field(description="The error's kind, e.g. SessionGone, ValidationError, AdmissionRejected.")
    reason: str = Field(description="What was wrong, for a person.")


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class OpenAIErrorBody(BaseModel):
    """Errors of the OpenAI-compatible routes, as OpenAI's API shapes them."""

    error: OpenAIErrorDetail


_STATUS_MEANING = {
    400: ("Malformed JSON, input the engine refuses (e.g. a bad Last-Event-ID), or a request that can never "
          "fit: context plus answer over the model's length (OpenAI code context_length_exceeded)."),
    401: "Missing or wrong bearer token (when the app is configured with tokens).",
    404: "No such session, model or path.",
    409: "The session's state refuses the call (e.g. input after finish, a second finish).",
    413: "The body, the chunks per session or the answer budget exceeds its limit.",
    422: "The body does not match the schema.",
    429: "Admission refused: no replica has room; retry after the Retry-After header's seconds.",
    501: "The source is not available on this deployment.",
    503: "No engine replica has started yet; retry after the Retry-After header's seconds.",
}
BODY_ERRORS = (400, 401, 413, 422)  # what any route with a body can answer before it runs


def error_responses(*statuses: int, openai: bool = False) -> dict:
    """OpenAPI `responses` for a route's error statuses (401 on every route: auth is optional)."""
    model = OpenAIErrorBody if openai else ErrorBody
    return {status: {"model": model, "description": _STATUS_MEANING[status]}
            for status in sorted({*statuses, 401})}


_TEXT = {"schema": {"type": "string"}}


def text_response(media_type: str, description: str) -> dict:
    """A 200 whose body is text of `media_type` (an SSE stream, Prometheus metrics)."""
    return {200: {"description": description, "content": {media_type: _TEXT}}}


def event_stream_or_json(description: str) -> dict:
    """A 200 that is an SSE stream when the body asks `stream: true`, else one JSON object."""
    return {200: {"description": description,
                  "content": {"text/event-stream": _TEXT, "application/json": {"schema": {"type": "object"}}}}}


HEALTH_RESPONSES = {503: {"description": "The central scheduler does not answer, or no replica is up."}}
