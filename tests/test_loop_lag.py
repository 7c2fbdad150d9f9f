"""The event loop's lag: the probe's arithmetic on a fake clock, the task on a real loop."""

from __future__ import annotations

import asyncio

import pytest
from clock_support import FakeClock
from gateway_support import fake_app
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from gateway.loop_lag import LoopLagProbe, watch_loop_lag


def test_lag_is_the_wake_up_beyond_the_interval() -> None:
    clock = FakeClock()
    probe = LoopLagProbe(0.05, clock)
    assert probe.start() == 0.05
    clock.now += 0.05 + 0.3  # the loop was busy for 300 ms past the timer
    assert probe.woke() == pytest.approx(0.3)
    probe.start()
    clock.now += 0.049  # a timer may fire a hair early: that is no lag
    assert probe.woke() == 0.0


def test_probe_refuses_misuse() -> None:
    with pytest.raises(ValueError):
        LoopLagProbe(0)
    with pytest.raises(RuntimeError):
        LoopLagProbe(0.05, FakeClock()).woke()


async def test_the_task_observes_every_wake_up() -> None:
    clock = FakeClock()

    class SteppingProbe(LoopLagProbe):
        def start(self) -> float:
            interval = super().start()
            clock.now += interval + 0.2  # each wake-up comes 200 ms late on this clock
            return 0.0  # and the real sleep is only a yield

    seen: list[float] = []
    three = asyncio.Event()

    def observe(lag: float) -> None:
        seen.append(lag)
        if len(seen) == 3:
            three.set()

    task = asyncio.create_task(watch_loop_lag(observe, SteppingProbe(0.05, clock)))
    await asyncio.wait_for(three.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen[:3] == pytest.approx([0.2, 0.2, 0.2])


def test_served_metrics_include_the_loop_lag() -> None:
    with TestClient(fake_app()) as client:
        text = client.get("/metrics").text
    names = {family.name for family in text_string_to_metric_families(text)}
    assert "speech_event_loop_lag_seconds" in names
