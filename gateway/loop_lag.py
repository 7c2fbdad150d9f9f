"""How late the gateway's event loop runs what is due: one number for every session's I/O.

Every socket write, engine chunk and timer of every session waits for the one
event loop, so its lateness is added to each of them. ``LoopLagProbe`` is the
arithmetic (no asyncio): the loop is asked to wake after ``interval_s``, and
whatever it takes beyond that is lag. ``watch_loop_lag`` is the thin task that
feeds it from the running loop into ``speech_event_loop_lag_seconds``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

DEFAULT_INTERVAL_S = 0.05


class LoopLagProbe:
    """Measures one wake-up at a time: ``start`` when the timer is set, ``woke`` when it ran."""

    def __init__(
        self, interval_s: float = DEFAULT_INTERVAL_S, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.interval_s = interval_s
        self._clock = clock
        self._set_at: float | None = None

    def start(self) -> float:
        """Note when the timer was set; returns the interval to sleep."""
        self._set_at = self._clock()
        return self.interval_s

    def woke(self) -> float:
        """Seconds the wake-up came late (never negative: timers may fire a hair early)."""
        if self._set_at is None:
            raise RuntimeError("woke() before start()")
        late = self._clock() - self._set_at - self.interval_s
        self._set_at = None
        return max(0.0, late)


async def watch_loop_lag(
    observe: Callable[[float], None], probe: LoopLagProbe | None = None
) -> None:
    """Observe the loop's lag forever (cancel to stop)."""
    probe = probe or LoopLagProbe()
    while True:
        await asyncio.sleep(probe.start())
        observe(probe.woke())
