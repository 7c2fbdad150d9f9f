"""Graceful drain on SIGTERM / SIGINT: finish what is open, refuse what is new.

On the first signal ``/ready`` turns 503 at once (a load balancer stops
sending traffic) while the listener stays open, so a client that connects
meanwhile is told why (``server_shutting_down``, close 1013 with a retry
hint) instead of being refused by TCP. Open contexts may finish for up to
``drain_timeout_s``; whatever is still open then is cancelled with a
``server_shutting_down`` error and every session closes with 1001. A second
signal exits at once.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from types import FrameType

import uvicorn

from gateway.availability import refusal
from gateway.protocol import CLOSE_GOING_AWAY
from gateway.state import GatewayState

log = logging.getLogger("gateway.drain")

POLL_S = 0.05
# The process exit status after --exit-on-engine-death.
ENGINE_DEAD_EXIT_STATUS = 3
# After the last close is queued: time for the sockets to flush and close.
CLOSE_GRACE_S = 5.0


def open_contexts(state: GatewayState) -> int:
    return sum(session.open_context_count for session in list(state.sessions))


async def drain(state: GatewayState, timeout_s: float) -> None:
    """Stop taking work, let open contexts finish, then close every session with 1001."""
    state.draining = True
    state.metrics.draining.set(1)
    loop = asyncio.get_running_loop()
    log.info(
        "draining: %d open contexts in %d sessions get up to %g s",
        open_contexts(state),
        len(state.sessions),
        timeout_s,
    )
    deadline = loop.time() + timeout_s
    while open_contexts(state) and loop.time() < deadline:
        await asyncio.sleep(POLL_S)
    left = open_contexts(state)
    if left:
        log.warning("drain timeout: cancelling %d open contexts", left)
    detail = refusal(state)
    assert detail is not None  # draining
    detail.message = "the server is shutting down"
    sessions = list(state.sessions)
    await asyncio.gather(
        *(s.shut_down(detail, CLOSE_GOING_AWAY) for s in sessions), return_exceptions=True
    )
    deadline = loop.time() + CLOSE_GRACE_S
    while state.sessions and loop.time() < deadline:
        await asyncio.sleep(POLL_S)


class DrainingServer(uvicorn.Server):
    """uvicorn, with a drain before its own shutdown (which would cut WebSockets with 1012)."""

    def __init__(
        self,
        config: uvicorn.Config,
        state: GatewayState,
        drain_timeout_s: float,
        exit_on_engine_death: bool = False,
        repeat_window_s: float = 0.0,
    ) -> None:
        """``repeat_window_s``: a signal this soon after the first is the same
        stop, not a second one (a worker of ``serve --workers`` gets each stop
        twice when its process group is signalled: directly and forwarded)."""
        super().__init__(config)
        self.state = state
        self.drain_timeout_s = drain_timeout_s
        # Exit (status ENGINE_DEAD_EXIT_STATUS) once a started engine died, for
        # supervisors that restart processes but cannot probe /ready.
        self.exit_on_engine_death = exit_on_engine_death
        self.engine_died = False
        self._served = False
        self._signalled = False
        self._signalled_at = 0.0
        self.repeat_window_s = repeat_window_s
        self._drain: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        loop = self._loop
        if self._signalled and time.monotonic() - self._signalled_at < self.repeat_window_s:
            return  # the same stop, delivered twice
        if self._signalled or self.should_exit or loop is None or not self.started:
            # A second signal (or one before serving began): exit now.
            log.warning("signal %s: exiting now", signal.Signals(sig).name)
            self.force_exit = True
            super().handle_exit(sig, frame)
            return
        log.info("signal %s: draining (a second signal exits now)", signal.Signals(sig).name)
        self._signalled = True
        self._signalled_at = time.monotonic()
        # uvicorn re-raises captured signals after shutdown: the exit status tells which.
        captured = getattr(self, "_captured_signals", None)
        if isinstance(captured, list):
            captured.append(sig)
        self.state.draining = True  # /ready is 503 from this instant
        loop.call_soon_threadsafe(self._start_drain)

    async def on_tick(self, counter: int) -> bool:
        state = self.state
        self._served |= state.ready
        # engine_error after the engine was ready: it died (not a failed start).
        if self.exit_on_engine_death and self._served and state.engine_error is not None:
            if not self.engine_died:
                log.error("the engine died: exiting (--exit-on-engine-death)")
            self.engine_died = True
            return True
        return await super().on_tick(counter)

    def _start_drain(self) -> None:
        self._drain = asyncio.create_task(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        try:
            await drain(self.state, self.drain_timeout_s)
        except Exception as e:
            log.error("the drain failed; shutting down", exc_info=e)
        finally:
            self.should_exit = True
