"""Faults on demand in the fake engine, and its bounded request log."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from realtime_engine.engines.base import EngineDeadError, EngineError, SegmentRequest
from realtime_engine.engines.fake import FakeEngine, RecentList


async def drain(engine: FakeEngine, request_id: str, text: str = "hello there") -> int:
    chunks = 0
    async for _ in engine.synthesize(SegmentRequest(request_id, text)):
        chunks += 1
    return chunks


async def test_fail_after_segments() -> None:
    engine = FakeEngine(fail_after_segments=2)
    assert await drain(engine, "a") and await drain(engine, "b")
    with pytest.raises(EngineError, match="injected"):
        await drain(engine, "c")
    assert engine.failure() is None  # a failed segment is not a dead engine


async def test_hang_after_segments_yields_nothing_until_aborted() -> None:
    engine = FakeEngine(hang_after_segments=0)
    stream = engine.synthesize(SegmentRequest("h", "hello"))
    pending = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    assert engine.running == ["h"] and not pending.done()
    await engine.abort("h")
    with pytest.raises(StopAsyncIteration):
        await pending
    assert engine.log.stopped == ["h"]


async def test_die_fails_running_and_later_segments() -> None:
    engine = FakeEngine(realtime_factor=1.0, chunk_samples=960)
    stream = engine.synthesize(SegmentRequest("r", "a long enough sentence to stream"))
    assert isinstance(await anext(stream), np.ndarray)
    pending = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    engine.die("core process exited")
    with pytest.raises(EngineDeadError, match="core process exited"):
        await pending
    assert engine.failure() == "core process exited"
    with pytest.raises(EngineDeadError):
        await drain(engine, "later")


async def test_die_after_segments() -> None:
    engine = FakeEngine(die_after_segments=1)
    await drain(engine, "first")
    with pytest.raises(EngineDeadError):
        await drain(engine, "second")
    assert engine.failure() is not None


async def test_log_is_bounded() -> None:
    engine = FakeEngine(log_limit=10)
    for i in range(100):
        await drain(engine, f"r{i}", "hi")
    assert 10 <= len(engine.log.requests) < 20
    assert engine.log.finished[-1] == "r99"


def test_recent_list_keeps_the_newest() -> None:
    recent: RecentList[int] = RecentList(3)
    for i in range(1000):
        recent.append(i)
        assert len(recent) < 6 and recent[-1] == i
    assert recent[-3:] == [997, 998, 999]


def test_fake_options_from_the_command_line() -> None:
    from gateway.cli import build_engine, build_parser

    args = build_parser().parse_args(
        ["serve", "--engine", "fake", "--fake-options", '{"hang_after_segments": 3}']
    )
    engine = build_engine("fake", None, None, fake_options=args.fake_options)
    assert isinstance(engine, FakeEngine) and engine.config.hang_after_segments == 3
    with pytest.raises(EngineError, match="nope"):
        build_engine("fake", None, None, fake_options={"nope": 1})
    with pytest.raises(EngineError, match="fake only"):
        build_engine("cpu-voice", None, None, fake_options={"realtime_factor": 1.0})
