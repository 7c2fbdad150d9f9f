"""The next engine chunk under a stall limit: in time, ended, stalled, cancelled.

No test waits on the wall clock: streams move when the test opens their
gate, and the stall timer is the test's own (it fires at once, or never).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest

from gateway.realtime.engine_wait import EngineStalledError, next_chunk_or_stall
from realtime_engine.engines.base import EngineError


class StallTimer:
    """Stands in for the loop's ``call_later``: the stall fires at once, or never."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fires: bool) -> None:
        self._loop = loop
        self.fires = fires
        self.handles: list[asyncio.Handle] = []

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> asyncio.Handle:
        handle = self._loop.call_soon(callback, *args)
        if not self.fires:
            handle.cancel()  # armed, never due
            handle = _Armed()
        self.handles.append(handle)
        return handle


class _Armed(asyncio.Handle):
    def __init__(self) -> None:
        self.dropped = False

    def cancel(self) -> None:
        self.dropped = True


@pytest.fixture
def stall_timer(monkeypatch: pytest.MonkeyPatch) -> Callable[[bool], StallTimer]:
    def install(fires: bool) -> StallTimer:
        loop = asyncio.get_running_loop()
        timer = StallTimer(loop, fires)
        monkeypatch.setattr(loop, "call_later", timer.call_later)
        return timer

    return install


class Stream:
    """An engine stream whose chunks come when the test opens their gates."""

    def __init__(self, chunks: int = 1, *, open_gates: bool = False, end_only: bool = False):
        self.gates = [asyncio.Event() for _ in range(chunks)]
        if open_gates:
            for gate in self.gates:
                gate.set()
        self.end_only = end_only  # the stream ends at its gate, without a chunk
        self.waiting = asyncio.Event()  # waiting for a gate
        self.delivered = asyncio.Event()  # a chunk (or the end) left the stream
        self.events: list[str] = []

    async def chunks(self) -> AsyncIterator[np.ndarray]:
        try:
            for i, gate in enumerate(self.gates):
                self.waiting.set()
                await gate.wait()
                self.delivered.set()
                if self.end_only:
                    return
                yield np.full(4, i, np.float32)
        except asyncio.CancelledError:
            self.events.append("cancelled")
            raise

    async def abort(self) -> None:
        self.events.append("abort")


async def test_chunks_in_time_pass_through_without_an_abort(
    stall_timer: Callable[[bool], StallTimer],
) -> None:
    timer = stall_timer(False)
    stream = Stream(2, open_gates=True)
    it = stream.chunks()
    first = await next_chunk_or_stall(it, 0.5, stream.abort)
    second = await next_chunk_or_stall(it, 0.5, stream.abort)
    with pytest.raises(StopAsyncIteration):
        await next_chunk_or_stall(it, 0.5, stream.abort)
    assert (first[0], second[0]) == (0, 1)
    assert len(timer.handles) == 3
    assert all(isinstance(h, _Armed) and h.dropped for h in timer.handles)  # none left behind
    assert stream.events == []


async def test_a_stall_aborts_first_then_abandons_the_wait(
    stall_timer: Callable[[bool], StallTimer],
) -> None:
    stall_timer(True)
    stream = Stream()
    with pytest.raises(EngineStalledError, match=r"no audio from the engine for 0\.05 s"):
        await next_chunk_or_stall(stream.chunks(), 0.05, stream.abort)
    assert stream.events == ["abort", "cancelled"]
    assert issubclass(EngineStalledError, EngineError)
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 0  # the interrupt was taken back


async def test_a_chunk_arriving_during_the_stall_abort_still_fails_the_wait(
    stall_timer: Callable[[bool], StallTimer],
) -> None:
    stall_timer(True)
    stream = Stream()

    async def slow_abort() -> None:
        stream.events.append("abort")
        stream.gates[0].set()
        await stream.delivered.wait()  # the chunk lands meanwhile
        stream.events.append("aborted")

    with pytest.raises(EngineStalledError):
        await next_chunk_or_stall(stream.chunks(), 0.05, slow_abort)
    assert stream.events == ["abort", "aborted"]


async def test_the_end_arriving_during_the_stall_abort_still_fails_the_wait(
    stall_timer: Callable[[bool], StallTimer],
) -> None:
    stall_timer(True)
    stream = Stream(end_only=True)

    async def slow_abort() -> None:
        stream.events.append("abort")
        stream.gates[0].set()
        await stream.delivered.wait()  # the end arrives meanwhile

    with pytest.raises(EngineStalledError):
        await next_chunk_or_stall(stream.chunks(), 0.05, slow_abort)
    assert stream.events == ["abort"]


async def test_an_outside_cancel_is_a_cancel_not_a_stall(
    stall_timer: Callable[[bool], StallTimer],
) -> None:
    timer = stall_timer(False)
    stream = Stream()
    waiter = asyncio.create_task(next_chunk_or_stall(stream.chunks(), 0.2, stream.abort))
    await stream.waiting.wait()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    [handle] = timer.handles
    assert isinstance(handle, _Armed) and handle.dropped  # the stall timer went with the wait
    assert stream.events == ["cancelled"]


async def test_an_outside_cancel_during_the_stall_abort_stays_a_cancel(
    stall_timer: Callable[[bool], StallTimer],
) -> None:
    stall_timer(True)
    stream = Stream()
    aborting, release, aborted = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def slow_abort() -> None:
        stream.events.append("abort")
        aborting.set()
        await release.wait()
        aborted.set()

    waiter = asyncio.create_task(next_chunk_or_stall(stream.chunks(), 0.02, slow_abort))
    await aborting.wait()  # the stall fired; its abort is in flight
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    release.set()
    await aborted.wait()
    assert stream.events == ["abort", "cancelled"]


async def test_a_failing_abort_still_ends_the_wait_and_is_the_cause(
    stall_timer: Callable[[bool], StallTimer],
) -> None:
    stall_timer(True)
    stream = Stream()

    async def broken_abort() -> None:
        stream.events.append("abort")
        raise RuntimeError("engine unreachable")

    with pytest.raises(EngineStalledError) as caught:
        await next_chunk_or_stall(stream.chunks(), 0.05, broken_abort)
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert stream.events == ["abort", "cancelled"]
