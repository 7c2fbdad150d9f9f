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
from types import FrameType

import uvicorn

from gateway.availability import refusal
from gateway.protocol import CLOSE_GOING_AWAY
from gateway.state import GatewayState

log = logging.getLogger("gateway.drain")

POLL_S = 0.05
# The process exit status after --exit-on-engine-death.
ENGINE_DEAD_EXIT_STATUS = 3
# How ``serve --workers N``'s supervisor passes its stops on to the workers: a
# signal of its own, so that a worker whose process group was signalled (it
# gets the stop directly as well) never counts the forwarded copy as a second.
SUPERVISOR_STOP_SIGNAL = signal.SIGUSR1
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
    ) -> None:
        super().__init__(config)
        self.state = state
        self.drain_timeout_s = drain_timeout_s
        # Exit (status ENGINE_DEAD_EXIT_STATUS) once a started engine died, for
        # supervisors that restart processes but cannot probe /ready.
        self.exit_on_engine_death = exit_on_engine_death
        self.engine_died = False
        self._served = False
        self._signalled = False  # by SIGINT / SIGTERM
        self._supervisor_stopped = False  # by SUPERVISOR_STOP_SIGNAL
        self._drain_begun = False
        self._drain: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """SIGINT / SIGTERM: the first drains, a second exits now."""
        if self._signalled or not (self._drain_begun or self._may_drain()):
            self._exit_now(sig, frame)
            return
        self._signalled = True
        # uvicorn re-raises captured signals after shutdown: the exit status tells which.
        captured = getattr(self, "_captured_signals", None)
        if isinstance(captured, list):
            captured.append(sig)
        self._begin_drain(sig)

    def handle_supervisor_stop(self, sig: int, frame: FrameType | None) -> None:
        """The supervisor's forwarded stop (:data:`SUPERVISOR_STOP_SIGNAL`), counted
        apart from the signals this process gets itself: its first drains (if
        nothing has yet), its second exits now. The first of either kind, arriving
        once the other kind's drain has begun (or even ended: the forwarded copy
        of a stop can come late), is that same stop, not a second one."""
        if self._supervisor_stopped or not (self._drain_begun or self._may_drain()):
            self._exit_now(sig, frame)
            return
        self._supervisor_stopped = True
        self._begin_drain(sig)

    def _may_drain(self) -> bool:
        return not self.should_exit and self._loop is not None and self.started

    def _exit_now(self, sig: int, frame: FrameType | None) -> None:
        # A second stop (or one before serving began).
        log.warning("signal %s: exiting now", signal.Signals(sig).name)
        self.force_exit = True
        super().handle_exit(sig, frame)

    def _begin_drain(self, sig: int) -> None:
        if self._drain_begun:
            return  # the other kind of stop began it
        self._drain_begun = True
        log.info("signal %s: draining (a second signal exits now)", signal.Signals(sig).name)
        self.state.draining = True  # /ready is 503 from this instant
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._start_drain)

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
