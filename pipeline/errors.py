"""Typed errors of the pipeline and their HTTP status codes."""

from __future__ import annotations

import contextlib

from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError

from engine.api import (ContextTooLongError, EngineError, InvalidInputError, SessionNotFoundError,
                        SessionStateError)


class PipelineError(Exception):
    status = 400

    def __init__(self, reason: str, **extra):
        super().__init__(reason)
        self.reason = reason
        self.extra = extra


class AdmissionRejected(PipelineError):
    """No replica has room and the bounded queue is full or timed out: 429 with Retry-After."""

    status = 429

    def __init__(self, reason: str, retry_after_s: int):
        super().__init__(reason, retry_after_s=retry_after_s)
        self.retry_after_s = retry_after_s


class ReplicaNotReady(PipelineError):
    """No engine replica could serve within the request's deadline because none has started yet:
    503 with Retry-After (the load is not the cause; ask again once they are up)."""

    status = 503

    def __init__(self, reason: str, retry_after_s: int):
        super().__init__(reason, retry_after_s=retry_after_s)
        self.retry_after_s = retry_after_s


class LimitExceeded(PipelineError):
    status = 413


class NeverFits(PipelineError):
    """The request's context plus its answer exceed what the model (or every replica's KV) holds:
    400 at once, since waiting or retrying cannot help (OpenAI's `context_length_exceeded`)."""

    status = 400


class ContextLimitExceeded(NeverFits):
    """Picklable stand-in for the engine's `ContextTooLongError` across Ray (its __init__ takes 3
    arguments, so Ray cannot rebuild it on the caller side)."""


@contextlib.contextmanager
def context_limit_errors():
    """Inside a replica: the engine's `ContextTooLongError` leaves as `ContextLimitExceeded`."""
    try:
        yield
    except ContextTooLongError as e:
        raise ContextLimitExceeded(str(e)) from None


class SessionGone(PipelineError):
    status = 404


class SessionConflict(PipelineError):
    """The session is in a state that refuses the call (e.g. a second finish): 409."""

    status = 409


class AnswerNotReproducible(PipelineError):
    """A replica was lost mid-answer and the sampling is neither greedy nor seeded, so another
    replica cannot continue the same answer: the client must ask again."""

    status = 409


class AnswerDiverged(PipelineError):
    """A replica was lost mid-answer and the answer regenerated on another one differs from the
    tokens the client already has (its context was rebuilt differently, e.g. a retrieval that
    returned other pages when run again): the answer cannot be continued, the client must ask again."""

    status = 409


class ModelNotFound(PipelineError):
    status = 404


class BadRequest(PipelineError):
    status = 400


class SourceUnavailable(PipelineError):
    status = 501


_ENGINE_STATUS = {
    SessionNotFoundError: 404,
    SessionStateError: 409,
    ContextTooLongError: 400,
    InvalidInputError: 400,
}


def admission_error(decision: dict) -> PipelineError | None:
    """The error of a central scheduler's admission decision that placed nothing (None if placed)."""
    if "never_fits" in decision:
        return NeverFits(decision["never_fits"])
    if "unavailable" in decision:
        return ReplicaNotReady(decision["unavailable"], decision["retry_after_s"])
    if "rejected" in decision:
        return AdmissionRejected(decision["rejected"], decision["retry_after_s"])
    return None


def unwrap(error: BaseException) -> BaseException:
    """The user exception inside Ray's wrappers (a replica raised it)."""
    while isinstance(error, RayTaskError) and getattr(error, "cause", None) is not None:
        error = error.cause
    return error


def is_replica_gone(error: BaseException) -> bool:
    return isinstance(unwrap(error), (ActorDiedError, ActorUnavailableError, RayActorError))


def http_status(error: BaseException) -> int:
    error = unwrap(error)
    if isinstance(error, PipelineError):
        return error.status
    for kind, status in _ENGINE_STATUS.items():
        if isinstance(error, kind):
            return status
    return 400 if isinstance(error, EngineError) else 500


def error_body(error: BaseException) -> dict:
    error = unwrap(error)
    body = {"error": type(error).__name__, "reason": str(error)}
    if isinstance(error, PipelineError):
        body.update(error.extra)
    return body


# ---- OpenAI-compatible routes answer with OpenAI's error object --------------------------------
OPENAI_PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/models")
_OPENAI_TYPE = {401: "authentication_error", 429: "rate_limit_error"}
_OPENAI_CODE = {ModelNotFound: "model_not_found", AdmissionRejected: "rate_limit_exceeded",
                LimitExceeded: "context_length_exceeded", NeverFits: "context_length_exceeded",
                ContextTooLongError: "context_length_exceeded"}


def is_openai_path(path: str) -> bool:
    return path.startswith(OPENAI_PATHS)


def openai_error_body(status: int, kind: str, reason: str, code: str | None = None,
                      param: str | None = None) -> dict:
    """`{"error": {"message", "type", "param", "code"}}` as OpenAI's API returns it."""
    etype = _OPENAI_TYPE.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": reason, "type": etype, "param": param, "code": code or kind}}


def openai_error(error: BaseException) -> dict:
    cause = unwrap(error)
    code = next((c for kind, c in _OPENAI_CODE.items() if isinstance(cause, kind)), None)
    return openai_error_body(http_status(error), type(cause).__name__, str(cause), code)
