"""Whether the gateway takes new work now, and the retryable refusal when not.

One answer for new WebSocket sessions (sent before close 1013), new contexts
in open sessions (an ``error`` event) and HTTP speech requests (503).
"""

from __future__ import annotations

from gateway.protocol import ErrorCode, ErrorDetail
from gateway.state import GatewayState

# How long a client should wait before retrying, by reason.
RETRY_WARMING_MS = 1000
RETRY_DRAINING_MS = 1000  # another replica (or this one, restarted) takes over soon
RETRY_ENGINE_DEAD_MS = 5000  # a supervisor has to restart the process first


def refusal(state: GatewayState, *, warming: bool = True) -> ErrorDetail | None:
    """Why new work would be refused, or None when the gateway takes it.

    ``warming=False``: work is taken while the engine warms up (HTTP requests
    simply wait for it).
    """
    if state.draining:
        return ErrorDetail(
            type="server_error",
            code=ErrorCode.SERVER_SHUTTING_DOWN,
            message="the server is shutting down; retry (another replica may take it)",
            retryable=True,
            retry_after_ms=RETRY_DRAINING_MS,
        )
    if state.engine_error is not None:
        return engine_unavailable(state)
    if warming and not state.ready:
        return ErrorDetail(
            type="engine_overloaded",
            code=ErrorCode.ENGINE_OVERLOADED,
            message="the engine is warming up",
            retryable=True,
            retry_after_ms=RETRY_WARMING_MS,
        )
    return None


def engine_unavailable(state: GatewayState) -> ErrorDetail:
    return ErrorDetail(
        type="server_error",
        code=ErrorCode.ENGINE_UNAVAILABLE,
        message=f"the {state.engine.name} engine is unavailable: {state.engine_error}",
        retryable=True,
        retry_after_ms=RETRY_ENGINE_DEAD_MS,
    )
