"""Typed errors of the pipeline and their HTTP status codes."""

from __future__ import annotations

from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError

from engine.api import (ContextTooLongError, EngineError, InvalidInputError, SessionBusyError,
                        SessionNotFoundError, SessionStateError)


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


class LimitExceeded(PipelineError):
    status = 413


class ContextLimitExceeded(LimitExceeded):
    """Picklable stand-in for the engine's `ContextTooLongError` across Ray (its __init__ takes 3
    arguments, so Ray cannot rebuild it on the caller side)."""


class SessionGone(PipelineError):
    status = 404


class BadRequest(PipelineError):
    status = 400


class SourceUnavailable(PipelineError):
    status = 501


_ENGINE_STATUS = {
    SessionNotFoundError: 404,
    SessionStateError: 409,
    SessionBusyError: 409,
    ContextTooLongError: 413,
    InvalidInputError: 400,
}


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
