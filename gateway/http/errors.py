"""Errors of the OpenAI-compatible HTTP API, rendered as ``{"error": {...}}``."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from gateway.auth import AuthError
from gateway.protocol import (
    ErrorCode,
    ErrorDetail,
    invalid_request,
    safe_json,
    voice_store_unavailable,
)
from gateway.state import GatewayState


class ApiError(Exception):
    """An HTTP API failure with its status and the protocol's error detail."""

    def __init__(self, status: int, detail: ErrorDetail) -> None:
        super().__init__(detail.message)
        self.status = status
        self.detail = detail

    def body(self) -> dict[str, Any]:
        error = self.detail.model_dump(exclude_none=True)
        error.setdefault("param", None)  # OpenAI always carries the key
        return {"error": error}


def bad_request(message: str, param: str | None, code: str = ErrorCode.INVALID_VALUE) -> ApiError:
    return ApiError(400, invalid_request(code, message, param=param))


def store_unavailable(error: Exception) -> ApiError:
    """The shared voice store failed: 503, retryable."""
    return ApiError(503, voice_store_unavailable(str(error)))


def error_response(error: ApiError, state: GatewayState) -> JSONResponse:
    state.metrics.error(error.detail.type, error.detail.code)
    return JSONResponse(error.body(), status_code=error.status)


def authenticate(request: Request, state: GatewayState) -> str:
    """Bearer key (or an ephemeral ``?token=``) when the server has keys; the caller's key id."""
    try:
        return state.auth.authenticate(
            request.headers.get("authorization"), request.query_params.get("token")
        ).key_id
    except AuthError as e:
        raise ApiError(
            401, ErrorDetail(type="authentication_error", code=e.code, message=e.message)
        ) from e


def parse_json_body(raw: bytes) -> Any:
    """A request body as JSON, depth-bounded and text-checked (``gateway.safe_json``)."""
    try:
        return safe_json.loads(raw)
    except safe_json.JsonRejected as e:
        code = ErrorCode.INVALID_VALUE if e.param else ErrorCode.INVALID_JSON
        raise bad_request(str(e), e.param, code) from e
    except ValueError as e:  # UnicodeDecodeError included
        raise bad_request(f"the body is not valid JSON: {e}", None, ErrorCode.INVALID_JSON) from e
