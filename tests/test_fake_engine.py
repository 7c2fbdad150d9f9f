"""The test engine itself: deterministic audio, timing, failures, abort records."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from realtime_engine.engines.base import EngineError, SegmentRequest, UnsupportedVoiceError
from realtime_engine.engines.fake import FakeEngine, segment_pitch_hz


async def collect(engine: FakeEngine, request: SegmentRequest) -> list[np.ndarray]:
    return [chunk async for chunk in engine.synthesize(request)]


async def test_stream_concatenates_to_render_and_is_deterministic() -> None:
    engine = FakeEngine(chunk_samples=1000)
    request = SegmentRequest("r1", "Hello there, world.")
    chunks = await collect(engine, request)
    assert all(c.dtype == np.float32 and len(c) <= 1000 for c in chunks)
    whole = np.concatenate(chunks)
    np.testing.assert_array_equal(whole, engine.render(request))
    np.testing.assert_array_equal(whole, FakeEngine().render(SegmentRequest("x", request.text)))
    assert len(whole) == int(len(request.text) * 0.05 * 24000)
    assert engine.log.finished == ["r1"]


async def test_pitch_identifies_the_segment_text() -> None:
    engine = FakeEngine()
    audio = engine.render(SegmentRequest("r", "a distinctive sentence"))
    spectrum = np.abs(np.fft.rfft(audio))
    peak_hz = np.argmax(spectrum) * 24000 / len(audio)
    assert abs(peak_hz - segment_pitch_hz("a distinctive sentence")) < 3


async def test_fixed_rows_and_speed_set_duration() -> None:
    engine = FakeEngine()
    assert len(engine.render(SegmentRequest("r", "abc", fixed_rows=10))) == 9600
    normal = len(engine.render(SegmentRequest("r", "x" * 40)))
    fast = len(engine.render(SegmentRequest("r", "x" * 40, speed=2.0)))
    assert fast == normal // 2


async def test_first_chunk_delay_and_realtime_factor() -> None:
    engine = FakeEngine(first_chunk_delay_s=0.05, realtime_factor=0.5, chunk_samples=2400)
    start = time.perf_counter()
    stream = engine.synthesize(SegmentRequest("r", "x" * 4))  # 0.2 s of audio, 2 chunks
    first = await anext(stream)
    first_at = time.perf_counter() - start
    rest = [c async for c in stream]
    total = time.perf_counter() - start
    assert len(first) + sum(len(c) for c in rest) == 4800
    assert 0.045 <= first_at < 0.5
    assert total >= 0.05 + 0.05 * 0.99  # second chunk: 0.1 s of audio at RTF 0.5


async def test_injected_failure_after_chunks() -> None:
    engine = FakeEngine(fail_on="boom", fail_after_chunks=2, chunk_samples=960)
    got: list[np.ndarray] = []
    with pytest.raises(EngineError):
        async for chunk in engine.synthesize(SegmentRequest("r", "this goes boom")):
            got.append(chunk)
    assert len(got) == 2
    assert engine.log.failed == ["r"]
    assert await collect(engine, SegmentRequest("ok", "fine")) != []


async def test_unknown_voice_is_refused() -> None:
    engine = FakeEngine()
    with pytest.raises(UnsupportedVoiceError):
        await collect(engine, SegmentRequest("r", "hi", voice="nobody"))
    assert {v.voice_id for v in engine.voices()} == {"default", "fake-bright"}


async def test_abort_stops_a_running_request_promptly() -> None:
    engine = FakeEngine(realtime_factor=1.0, chunk_samples=2400)
    got: list[np.ndarray] = []

    async def consume() -> None:
        async for chunk in engine.synthesize(SegmentRequest("r", "x" * 200)):
            got.append(chunk)

    task = asyncio.create_task(consume())
    while not got:
        await asyncio.sleep(0.005)
    assert engine.running == ["r"]
    await engine.abort("r")
    await asyncio.wait_for(task, 0.5)
    assert engine.log.aborted == ["r"] and engine.log.stopped == ["r"]
    assert len(got) < 5
    assert engine.running == []
    await engine.abort("r")  # finished: no-op, not recorded twice
    assert engine.log.aborted == ["r"]


async def test_start_and_close() -> None:
    engine = FakeEngine(start_delay_s=0.01)
    await engine.start()
    await engine.start()
    assert engine.started
    await engine.close()
    assert engine.closed
    with pytest.raises(TypeError):
        FakeEngine(no_such_option=1)


@settings(max_examples=30, deadline=None)
@given(text=st.text(min_size=1, max_size=60), sample_rate=st.sampled_from([16000, 22050, 24000]))
def test_render_is_the_segment_tone_sample_for_sample(text: str, sample_rate: int) -> None:
    engine = FakeEngine(sample_rate=sample_rate)
    audio = engine.render(SegmentRequest("r", text))
    t = np.arange(audio.size, dtype=np.float64) / sample_rate
    expected = 0.3 * np.sin(2 * np.pi * segment_pitch_hz(text) * t)
    assert audio.dtype == np.float32
    np.testing.assert_allclose(audio, expected, rtol=0, atol=1e-6)
