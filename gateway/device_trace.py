"""``SIGUSR2`` toggles a trace of the engine's device work.

A torch-profiler trace of the served engine core, taken while it serves,
is what sets the served step timeline beside the engine alone
(``bench.gpu.load_trace``): ``kill -USR2 <gateway pid>`` starts it, a second
signal stops it and the engine writes it out. Only engines that can record
one (:class:`~realtime_engine.engines.base.DeviceTracing`) get the handler;
one that cannot right now (no profiler configured) logs why and serves on.
A signal, not an endpoint: only the process's owner can send it, so no
client can make the server profile itself.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from realtime_engine.engines.base import DeviceTracing

TRACE_SIGNAL = signal.SIGUSR2

log = logging.getLogger("gateway.device_trace")


class DeviceTraceSignal:
    """The handler of :data:`TRACE_SIGNAL` on one event loop, for one engine."""

    def __init__(self, engine: object) -> None:
        self._engine = engine if isinstance(engine, DeviceTracing) else None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: set[asyncio.Task[str | None]] = set()

    def install(self) -> bool:
        """Handle the signal on the running loop; False where that is not possible
        (an engine without traces, a loop off the main thread, no such signal)."""
        if self._engine is None:
            return False
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(TRACE_SIGNAL, self._on_signal)
        except (NotImplementedError, RuntimeError, ValueError) as e:
            log.debug("no device-trace signal: %s", e)
            return False
        self._loop = loop
        return True

    def uninstall(self) -> None:
        if self._loop is not None:
            self._loop.remove_signal_handler(TRACE_SIGNAL)
            self._loop = None

    def _on_signal(self) -> None:
        task = asyncio.ensure_future(self.toggle())
        self._pending.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._pending.discard)

    async def toggle(self) -> str | None:
        """What the signal does: the engine's answer, or None when it failed (logged)."""
        if self._engine is None:
            return None
        try:
            result = await self._engine.toggle_device_trace()
        except Exception as e:  # the server serves on whatever the profiler does
            log.warning("device trace: %s", e)
            return None
        log.info("device trace %s", result)
        return result
