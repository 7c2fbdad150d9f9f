"""Errors of protocol v1: the ``error`` event's detail, its codes, and helpers.

Re-exported by ``gateway.protocol``; import from there.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import ValidationError, field_validator

from gateway.protocol.config import _Lenient
from gateway.protocol.safe_json import MAX_ECHO_CHARS, echo

# The longest error message; messages may quote client input.
MAX_MESSAGE_CHARS = 1024

ErrorType = Literal[
    "invalid_request_error",
    "authentication_error",
    "rate_limit_error",
    "server_error",
    "engine_overloaded",
]


class ErrorCode(StrEnum):
    INVALID_JSON = "invalid_json"
    INVALID_EVENT = "invalid_event"
    MISSING_TYPE = "missing_type"
    UNKNOWN_EVENT_TYPE = "unknown_event_type"
    INVALID_VALUE = "invalid_value"
    READ_ONLY_FIELD = "read_only_field"
    MESSAGE_TOO_BIG = "message_too_big"
    BINARY_NOT_ALLOWED = "binary_not_allowed"
    CONTEXT_NOT_FOUND = "context_not_found"
    CONTEXT_ENDED = "context_ended"
    TOO_MANY_CONTEXTS = "too_many_contexts"
    TEXT_TOO_LONG = "text_too_long"
    VOICE_NOT_FOUND = "voice_not_found"
    VOICE_INVALID = "voice_invalid"
    VOICE_UNSUPPORTED = "voice_unsupported"
    AUTH_REQUIRED = "auth_required"
    AUTH_INVALID = "auth_invalid"
    TOKEN_EXPIRED = "token_expired"
    SESSION_LIMIT = "session_limit"
    KEY_SESSION_LIMIT = "key_session_limit"
    KEY_CONTEXT_LIMIT = "key_context_limit"
    ENGINE_ERROR = "engine_error"
    ENGINE_OVERLOADED = "engine_overloaded"
    ENGINE_UNAVAILABLE = "engine_unavailable"
    VOICE_STORE_UNAVAILABLE = "voice_store_unavailable"
    SERVER_SHUTTING_DOWN = "server_shutting_down"
    INTERNAL_ERROR = "internal_error"
    IDLE_TIMEOUT = "idle_timeout"


class ErrorDetail(_Lenient):
    type: ErrorType
    code: str
    message: str
    param: str | None = None
    context_id: str | None = None
    reply_to: str | None = None
    retryable: bool = False
    retry_after_ms: int | None = None

    # Fields that may quote a client are cut to a bounded, encodable prefix here,
    # where every error passes, so no reply can grow with (or fail on) its input.
    @field_validator("message")
    @classmethod
    def _bounded_message(cls, value: str) -> str:
        return echo(value, MAX_MESSAGE_CHARS)

    @field_validator("code", "param", "context_id", "reply_to")
    @classmethod
    def _bounded_echo(cls, value: str | None) -> str | None:
        return None if value is None else echo(value, MAX_ECHO_CHARS)


class ProtocolError(ValueError):
    """A client message cannot be accepted; carries the ``error`` event to send."""

    def __init__(self, detail: ErrorDetail) -> None:
        super().__init__(detail.message)
        self.detail = detail


def invalid_request(
    code: str,
    message: str,
    *,
    param: str | None = None,
    reply_to: str | None = None,
    context_id: str | None = None,
) -> ErrorDetail:
    return ErrorDetail(
        type="invalid_request_error",
        code=code,
        message=message,
        param=param,
        reply_to=reply_to,
        context_id=context_id,
    )


# A shared voice store that failed is usually back within a second or two.
RETRY_VOICE_STORE_MS = 1_000


def voice_store_unavailable(
    message: str, *, reply_to: str | None = None, context_id: str | None = None
) -> ErrorDetail:
    """The shared voice store (docs/scaling.md) did not answer: retryable."""
    return ErrorDetail(
        type="server_error",
        code=ErrorCode.VOICE_STORE_UNAVAILABLE,
        message=message,
        reply_to=reply_to,
        context_id=context_id,
        retryable=True,
        retry_after_ms=RETRY_VOICE_STORE_MS,
    )


def _loc_to_param(loc: tuple[int | str, ...], skip_tag: bool) -> str | None:
    parts = [str(p) for p in (loc[1:] if skip_tag else loc)]
    return ".".join(parts) or None


def validation_error_detail(
    err: ValidationError, *, reply_to: str | None, skip_tag: bool, prefix: str = ""
) -> ErrorDetail:
    """The first problem of a pydantic error as an ``invalid_request_error``."""
    first = err.errors(include_url=False)[0]
    kind = first["type"]
    if kind == "union_tag_not_found":
        return invalid_request(
            ErrorCode.MISSING_TYPE, "the event has no 'type'", param="type", reply_to=reply_to
        )
    if kind == "union_tag_invalid":
        tag = first.get("input", {}).get("type") if isinstance(first.get("input"), dict) else None
        return invalid_request(
            ErrorCode.UNKNOWN_EVENT_TYPE,
            f"unknown event type {echo(tag)!r}",
            param="type",
            reply_to=reply_to,
        )
    param = _loc_to_param(tuple(first["loc"]), skip_tag)
    if prefix:
        param = f"{prefix}.{param}" if param else prefix
    where = f"{param}: " if param else ""
    return invalid_request(
        ErrorCode.INVALID_VALUE, f"{where}{first['msg']}", param=param, reply_to=reply_to
    )
