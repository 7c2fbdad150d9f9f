"""Engine liveness while serving: a dead talker fails everything at once.

Engines that can die (their vLLM engine core process, their reference runner
thread) say why from ``failure() -> str | None``. The watch polls it; on
death it logs the cause once, flips ``/ready`` to 503 and the
``speech_engine_up`` metric to 0, fails every open context with a
retryable ``engine_unavailable`` error, and from then on new sessions get
1013 and new contexts the same error (``gateway.availability``). The process
stays up so its logs, metrics and ``/ready`` can be read; restarting it is
the supervisor's job (docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import logging

from gateway.availability import engine_unavailable
from gateway.state import GatewayState
from realtime_engine.engines.base import SpeechEngine

log = logging.getLogger("gateway.engine_health")

# Death shows in /ready and reaches every open context within about this long.
POLL_INTERVAL_S = 0.2


def engine_failure(engine: SpeechEngine) -> str | None:
    """Why ``engine`` is dead, or None (also for engines that cannot tell)."""
    failure = getattr(engine, "failure", None)
    if not callable(failure):
        return None
    reason = failure()
    return None if reason is None else str(reason)


async def watch_engine(state: GatewayState, interval_s: float = POLL_INTERVAL_S) -> None:
    """Poll the started engine until it dies, then report the death (once)."""
    state.metrics.engine_up.set(1)
    while (reason := engine_failure(state.engine)) is None:
        await asyncio.sleep(interval_s)
    await engine_died(state, reason)


async def engine_died(state: GatewayState, reason: str) -> None:
    if state.engine_error is not None:
        return
    log.error("the %s engine died: %s", state.engine.name, reason)
    state.engine_error = f"died: {reason}"
    state.ready = False
    state.metrics.engine_up.set(0)
    state.metrics.engine_deaths.inc()
    detail = engine_unavailable(state)
    # Concurrently: a session whose client reads slowly must not delay the others.
    sessions = list(state.sessions)
    results = await asyncio.gather(
        *(s.fail_contexts(detail) for s in sessions), return_exceptions=True
    )
    for error in results:
        if isinstance(error, Exception):
            log.error("failing a session's contexts failed", exc_info=error)
