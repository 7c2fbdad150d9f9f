"""Noticing a device that stopped: a wait on a device event that never ends.

A kernel that never finishes (a GEMM spinning on corrupted counters, say)
cannot be cancelled, and the CUDA context is lost with it. Left alone, every
stream waits until its own timeout and every later request joins them, while
the server still reports itself ready. :class:`DeviceWatchdog` times the
host's waits on device events; one that lasts past its limit ends the engine
core process, which vLLM's client notices: every request fails at once with
the engine's death, and ``/ready`` reports the engine failed, so a supervisor
restarts it (see docs/reliability.md).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

logger = logging.getLogger("vllm.plugins.higgs_talker.watchdog")

# Longer than any wait of a working device under load (a chunk's event waits
# under 0.3 s at 256 streams on an H200), shorter than the gateway's per-stream
# stall limit, so the engine's death is what clients hear.
DEVICE_STALL_S = 30.0

# The exit status of an engine core that ended because its device stopped.
DEVICE_STALL_EXIT = 70


def exit_process(what: str, seconds: float) -> None:
    """The default action: the process cannot recover its device, so it ends."""
    logger.critical(
        "the device stopped: %s has waited %.1f s; ending the engine core process", what, seconds
    )
    logging.shutdown()
    os._exit(DEVICE_STALL_EXIT)


class DeviceWatchdog:
    """Times the waits on device events; calls ``on_stall`` once for the first
    wait that lasts past ``limit_s`` (checked every ``interval_s`` by a daemon
    thread, started with :meth:`start`; :meth:`overdue` is the check itself)."""

    def __init__(
        self,
        limit_s: float = DEVICE_STALL_S,
        on_stall: Callable[[str, float], None] = exit_process,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if limit_s <= 0:
            raise ValueError(f"limit_s must be positive; got {limit_s}")
        self.limit_s = limit_s
        self._on_stall = on_stall
        self._clock = clock
        self._lock = threading.Lock()
        self._waits: dict[int, tuple[str, float]] = {}
        self._ids = itertools.count()
        self._stopped = threading.Event()

    @contextmanager
    def waiting(self, what: str) -> Iterator[None]:
        """Wrap a wait on the device (``event.synchronize()``) named ``what``."""
        key = next(self._ids)
        with self._lock:
            self._waits[key] = (what, self._clock())
        try:
            yield
        finally:
            with self._lock:
                del self._waits[key]

    def synchronize(self, event: Any, what: str) -> None:
        """``event.synchronize()``, timed as a wait named ``what``."""
        with self.waiting(what):
            event.synchronize()

    def overdue(self) -> tuple[str, float] | None:
        """The longest wait past the limit, with how long it has waited; else None."""
        now = self._clock()
        with self._lock:
            waits = list(self._waits.values())
        if not waits:
            return None
        what, since = min(waits, key=lambda wait: wait[1])
        waited = now - since
        return (what, waited) if waited > self.limit_s else None

    def start(self, interval_s: float = 1.0) -> None:
        threading.Thread(
            target=self._watch, args=(interval_s,), name="device-watchdog", daemon=True
        ).start()

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self, interval_s: float) -> None:
        while not self._stopped.wait(interval_s):
            stall = self.overdue()
            if stall is not None:
                self._stopped.set()
                self._on_stall(*stall)


_process_watchdog: DeviceWatchdog | None = None
_process_lock = threading.Lock()


def process_watchdog() -> DeviceWatchdog:
    """The process's watchdog, started on first use: one watch thread for every
    sender of an engine core."""
    global _process_watchdog
    with _process_lock:
        if _process_watchdog is None:
            _process_watchdog = DeviceWatchdog()
            _process_watchdog.start()
        return _process_watchdog
