"""The streaming engine's public surface: plain dataclasses and an abstract class.

Everything above `engine/` (pipeline, benchmarks, demo) talks to a `StreamingEngine`; only
`engine/vllm_engine.py` knows vLLM. A session is a prompt that grows (append) or is replaced
(replace) while retrieval runs, then is finished with the question and decoded.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from stream2llm.data.traces import ContextOp


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class SessionNotFoundError(EngineError):
    """The session id is unknown, or the session was already closed."""


class SessionStateError(EngineError):
    """The operation is not valid in the session's current state (e.g. append after finish)."""


class ContextTooLongError(EngineError):
    """The context (plus question and answer budget) would not fit in the model's context length."""

    def __init__(self, num_tokens: int, limit: int, session_closed: bool):
        self.num_tokens = num_tokens
        self.limit = limit
        self.session_closed = session_closed
        state = "closed" if session_closed else "left usable, with its previous context"
        super().__init__(
            f"context of {num_tokens} tokens exceeds the limit of {limit} tokens "
            f"(max_model_len minus the answer budget); session {state}"
        )

    def __reduce__(self):  # Ray re-raises errors on the caller's side by rebuilding them
        return (type(self), (self.num_tokens, self.limit, self.session_closed))


class InvalidInputError(EngineError):
    """The input itself is malformed (invalid UTF-8, token id out of range, empty question, ...)."""


@dataclass(frozen=True)
class SamplingConfig:
    """How the answer is decoded. Greedy by default so outputs are reproducible."""

    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None


@dataclass(frozen=True)
class OutputDelta:
    """A piece of the answer: new text and token ids since the previous delta."""

    text: str
    token_ids: tuple[int, ...]
    finished: bool = False
    finish_reason: str | None = None


@dataclass(frozen=True)
class OpenAIReply:
    """The head of an OpenAI-route answer from vLLM's serving layer: the HTTP status, and the JSON
    body (a response or OpenAI's error object), or None when SSE lines follow."""

    status: int
    body: dict | None


@dataclass
class OpenAITimings:
    """One OpenAI request as the engine timed it, whichever route and streaming mode."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    output_tokens: int = 0
    prompt_tokens: int = 0            # as the engine tokenized them (every prompt of the request)


@dataclass
class SessionStats:
    """Per-session timings (time.monotonic seconds) and token counts."""

    session_id: str
    first_chunk_at: float | None = None
    last_chunk_at: float | None = None
    finish_at: float | None = None
    first_token_at: float | None = None
    done_at: float | None = None
    chunks: int = 0
    replaces: int = 0
    context_tokens: int = 0
    tokens_prefilled_before_finish: int = 0
    tokens_invalidated: int = 0
    tokens_recomputed: int = 0
    output_tokens: int = 0

    @property
    def ttft_s(self) -> float | None:
        """Time to first token, measured from the moment the question (last piece) was handed over."""
        if self.first_token_at is None or self.finish_at is None:
            return None
        return self.first_token_at - self.finish_at


@dataclass
class EngineStats:
    kv_blocks_total: int
    kv_blocks_used: int
    block_size: int
    sessions_active: int
    sessions_idle: int
    sessions_decoding: int
    preemptions: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def kv_blocks_free(self) -> int:
        return self.kv_blocks_total - self.kv_blocks_used


class StreamingEngine(ABC):
    """A model replica that accepts prompts arriving in pieces.

    Lifecycle of a session: `open_session` -> any number of `append` / `replace` ->
    `finish(question)` (an async iterator of answer deltas) -> closed. `abort` closes at any point
    and frees its KV. `append` and `replace` never suspend, so calls on one session apply in call order.
    """

    @abstractmethod
    async def open_session(self, session_id: str | None = None) -> str:
        """Create an empty session; returns its id."""

    @abstractmethod
    async def append(self, session_id: str, text: str | None = None,
                     token_ids: Sequence[int] | None = None) -> int:
        """Append a piece of context and start prefilling it at once. Returns context length."""

    @abstractmethod
    async def replace(self, session_id: str, text: str | None = None,
                     token_ids: Sequence[int] | None = None) -> int:
        """Replace the whole context, keeping the KV of the longest common prefix."""

    async def change_context(self, session_id: str, op: ContextOp, text: str | None = None,
                             token_ids: Sequence[int] | None = None) -> int:
        """`append` or `replace`, as `op` says. Returns context length."""
        apply = self.append if op == ContextOp.APPEND else self.replace
        return await apply(session_id, text=text, token_ids=token_ids)

    @abstractmethod
    def finish(self, session_id: str, question: str | None = None,
               token_ids: Sequence[int] | None = None,
               sampling: SamplingConfig | None = None) -> AsyncIterator[OutputDelta]:
        """Add the last piece (the question) and stream the answer. The session closes when the
        answer ends or its reader leaves: closes the iterator (`aclose()`) or drops it unread."""

    @abstractmethod
    async def abort(self, session_id: str) -> None:
        """Close the session and free its KV; unknown ids (and a session already closing) raise
        `SessionNotFoundError`."""

    @abstractmethod
    async def wait_prefilled(self, session_id: str) -> int:
        """Wait until all context handed over so far is prefilled; returns the context length."""

    @abstractmethod
    def generate(self, prompt: str | None = None, token_ids: Sequence[int] | None = None,
                 sampling: SamplingConfig | None = None, stats: SessionStats | None = None,
                 cache_salt: str | None = None) -> AsyncIterator[OutputDelta]:
        """Baseline: one-shot (non-streaming) generation on the same engine.

        Requests with different `cache_salt`s never share prefix-cached KV: a fresh salt makes a
        baseline pay the full prefill even right after a streamed run of the same prompt.
        """

    def openai(self, route: str, body: dict) -> AsyncIterator["OpenAIReply | str | OpenAITimings"]:
        """An OpenAI route ("chat" or "completion") served as `vllm serve` serves it: one
        `OpenAIReply`, the SSE lines of a stream, then the request's `OpenAITimings`."""
        raise NotImplementedError(f"{type(self).__name__} has no OpenAI serving layer")

    @abstractmethod
    def session_stats(self, session_id: str) -> SessionStats:
        """Timings and counts of an open or recently closed session."""

    @abstractmethod
    async def stats(self) -> EngineStats:
        """KV blocks and session counts, fresh from the engine."""

    @abstractmethod
    def tokenize(self, text: str) -> list[int]:
        """The engine's tokenizer, without special tokens."""

    @property
    @abstractmethod
    def max_model_len(self) -> int: ...

    @abstractmethod
    async def shutdown(self) -> None: ...
