"""Typed exceptions raised by the SDK.

Server ``error`` events become :class:`ServerError` subclasses by their
``type``; a closed socket becomes :class:`ConnectionClosedError` (subclassed by
close code); a message the SDK cannot understand is a
:class:`ProtocolViolationError`.
"""

from __future__ import annotations

from gateway.protocol import (
    CLOSE_NORMAL,
    CLOSE_POLICY,
    CLOSE_SERVER_ERROR,
    CLOSE_TOO_BIG,
    CLOSE_TRY_AGAIN,
    ErrorDetail,
)


class ClientError(Exception):
    """Base of every SDK error."""


class ServerError(ClientError):
    """The server answered with an ``error`` event."""

    def __init__(self, detail: ErrorDetail) -> None:
        super().__init__(f"{detail.type}/{detail.code}: {detail.message}")
        self.detail = detail

    @property
    def code(self) -> str:
        return self.detail.code

    @property
    def retryable(self) -> bool:
        return self.detail.retryable


class InvalidRequestError(ServerError):
    pass


class AuthenticationError(ServerError):
    pass


class RateLimitError(ServerError):
    @property
    def retry_after_ms(self) -> int | None:
        return self.detail.retry_after_ms


class EngineOverloadedError(ServerError):
    pass


class InternalServerError(ServerError):
    pass


_BY_TYPE: dict[str, type[ServerError]] = {
    "invalid_request_error": InvalidRequestError,
    "authentication_error": AuthenticationError,
    "rate_limit_error": RateLimitError,
    "engine_overloaded": EngineOverloadedError,
    "server_error": InternalServerError,
}


def error_from_detail(detail: ErrorDetail) -> ServerError:
    return _BY_TYPE.get(detail.type, ServerError)(detail)


class ConnectionClosedError(ClientError):
    """The WebSocket closed (or could not be opened)."""

    def __init__(self, code: int | None, reason: str = "") -> None:
        super().__init__(
            f"connection closed (code {code}): {reason}"
            if reason
            else f"connection closed (code {code})"
        )
        self.code = code
        self.reason = reason


class PolicyViolationError(ConnectionClosedError):
    """Closed with 1008: authentication failed or the protocol was abused."""


class MessageTooBigError(ConnectionClosedError):
    """Closed with 1009."""


class ServerClosedError(ConnectionClosedError):
    """Closed with 1011: the server failed."""


class TryAgainLaterError(ConnectionClosedError):
    """Closed with 1013: the server is draining or at its session limit."""


class HandshakeError(ConnectionClosedError):
    """The HTTP upgrade was refused (``status`` is the HTTP status code)."""

    def __init__(self, status: int, reason: str = "") -> None:
        super().__init__(None, reason or f"HTTP {status}")
        self.status = status


def closed_error(code: int | None, reason: str = "") -> ConnectionClosedError:
    kind = {
        CLOSE_POLICY: PolicyViolationError,
        CLOSE_TOO_BIG: MessageTooBigError,
        CLOSE_SERVER_ERROR: ServerClosedError,
        CLOSE_TRY_AGAIN: TryAgainLaterError,
    }.get(code or CLOSE_NORMAL, ConnectionClosedError)
    return kind(code, reason)


class ProtocolViolationError(ClientError):
    """The server sent something this SDK cannot parse."""


class ContextCancelledError(ClientError):
    """Audio of a cancelled context was asked for after the cancel."""
