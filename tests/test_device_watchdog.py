"""The device watchdog: a wait on a device event past its limit ends the engine
core process (so vLLM's client fails every request) instead of hanging them."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest
from clock_support import FakeClock

from realtime_engine.talker.device_watchdog import DEVICE_STALL_EXIT, DeviceWatchdog


def test_only_a_wait_past_the_limit_is_overdue_and_the_oldest_is_named() -> None:
    clock = FakeClock()
    stalls: list[tuple[str, float]] = []
    dog = DeviceWatchdog(5.0, lambda what, s: stalls.append((what, s)), clock=clock)
    assert dog.overdue() is None
    with dog.waiting("a batch of chunks"):
        clock.now += 3.0
        with dog.waiting("a request's rows"):
            clock.now += 1.9
            assert dog.overdue() is None  # 4.9 s: a slow device, not a stopped one
            clock.now += 0.2
            assert dog.overdue() == ("a batch of chunks", pytest.approx(5.1))
    assert dog.overdue() is None  # the waits ended: nothing is overdue however late
    clock.now += 60.0
    assert dog.overdue() is None
    assert stalls == []  # the check alone never acts


def test_the_watch_thread_acts_once_on_a_wait_that_never_ends() -> None:
    stalled = threading.Event()
    calls: list[str] = []

    def on_stall(what: str, waited: float) -> None:
        calls.append(what)
        stalled.set()

    dog = DeviceWatchdog(0.05, on_stall)
    never = threading.Event()
    waiting = threading.Event()

    def stuck_sender() -> None:
        with dog.waiting("a batch of chunks"):
            waiting.set()
            never.wait()

    threading.Thread(target=stuck_sender, daemon=True).start()
    assert waiting.wait(5)
    dog.start(interval_s=0.01)
    assert stalled.wait(5), "the watchdog never noticed the stuck wait"
    never.set()
    dog.stop()
    assert calls == ["a batch of chunks"]


def test_by_default_a_stalled_device_ends_the_process_with_its_own_status() -> None:
    code = textwrap.dedent(
        """
        import threading
        from realtime_engine.talker.device_watchdog import DeviceWatchdog
        dog = DeviceWatchdog(0.05)
        dog.start(interval_s=0.01)
        with dog.waiting("a batch of chunks"):
            threading.Event().wait(30)
        print("still running")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == DEVICE_STALL_EXIT, done.stderr
    assert "still running" not in done.stdout
    assert "the device stopped: a batch of chunks has waited" in done.stderr


def test_a_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        DeviceWatchdog(0)


def test_an_engine_core_has_one_watch_thread_for_all_its_senders() -> None:
    from realtime_engine.talker.device_watchdog import process_watchdog

    first = process_watchdog()
    assert process_watchdog() is first
    assert first.overdue() is None
