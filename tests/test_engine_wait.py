"""The next engine chunk under a stall limit: in time, ended, stalled, cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest

from gateway.engine_wait import EngineStalledError, next_chunk_or_stall
from realtime_engine.engines.base import EngineError


class Stream:
    """An engine stream that yields after ``delays`` and records what happened to it."""

    def __init__(self, *delays: float) -> None:
        self.delays = delays
        self.events: list[str] = []

    async def chunks(self) -> AsyncIterator[np.ndarray]:
        try:
            for i, delay in enumerate(self.delays):
                await asyncio.sleep(delay)
                yield np.full(4, i, np.float32)
        except asyncio.CancelledError:
            self.events.append("cancelled")
            raise

    async def abort(self) -> None:
        self.events.append("abort")


async def test_chunks_in_time_pass_through_without_an_abort() -> None:
    stream = Stream(0.0, 0.01)
    it = stream.chunks()
    first = await next_chunk_or_stall(it, 0.5, stream.abort)
    second = await next_chunk_or_stall(it, 0.5, stream.abort)
    with pytest.raises(StopAsyncIteration):
        await next_chunk_or_stall(it, 0.5, stream.abort)
    assert (first[0], second[0]) == (0, 1)
    await asyncio.sleep(0.6)  # past every stall limit: no timer left behind
    assert stream.events == []


async def test_a_stall_aborts_first_then_abandons_the_wait() -> None:
    stream = Stream(5.0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(EngineStalledError, match=r"no audio from the engine for 0\.05 s"):
        await next_chunk_or_stall(stream.chunks(), 0.05, stream.abort)
    assert loop.time() - started < 1.0
    assert stream.events == ["abort", "cancelled"]
    assert issubclass(EngineStalledError, EngineError)
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 0  # the interrupt was taken back


async def test_a_chunk_arriving_during_the_stall_abort_still_fails_the_wait() -> None:
    stream = Stream(0.08)

    async def slow_abort() -> None:
        stream.events.append("abort")
        await asyncio.sleep(0.1)  # the chunk lands meanwhile
        stream.events.append("aborted")

    with pytest.raises(EngineStalledError):
        await next_chunk_or_stall(stream.chunks(), 0.05, slow_abort)
    assert stream.events == ["abort", "aborted"]


async def test_the_end_arriving_during_the_stall_abort_still_fails_the_wait() -> None:
    events: list[str] = []

    async def late_end() -> AsyncIterator[np.ndarray]:
        await asyncio.sleep(0.08)
        return
        yield np.zeros(1, np.float32)  # an async generator that yields nothing

    async def slow_abort() -> None:
        events.append("abort")
        await asyncio.sleep(0.1)

    with pytest.raises(EngineStalledError):
        await next_chunk_or_stall(late_end(), 0.05, slow_abort)
    assert events == ["abort"]


async def test_an_outside_cancel_is_a_cancel_not_a_stall() -> None:
    stream = Stream(5.0)
    waiter = asyncio.create_task(next_chunk_or_stall(stream.chunks(), 0.2, stream.abort))
    await asyncio.sleep(0.02)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await asyncio.sleep(0.3)  # the stall timer was dropped with the wait
    assert stream.events == ["cancelled"]


async def test_an_outside_cancel_during_the_stall_abort_stays_a_cancel() -> None:
    stream = Stream(5.0)

    async def slow_abort() -> None:
        stream.events.append("abort")
        await asyncio.sleep(0.05)

    waiter = asyncio.create_task(next_chunk_or_stall(stream.chunks(), 0.02, slow_abort))
    await asyncio.sleep(0.04)  # the stall fired; its abort is in flight
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert stream.events == ["abort", "cancelled"]


async def test_a_failing_abort_still_ends_the_wait_and_is_the_cause() -> None:
    stream = Stream(5.0)

    async def broken_abort() -> None:
        stream.events.append("abort")
        raise RuntimeError("engine unreachable")

    with pytest.raises(EngineStalledError) as caught:
        await next_chunk_or_stall(stream.chunks(), 0.05, broken_abort)
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert stream.events == ["abort", "cancelled"]
