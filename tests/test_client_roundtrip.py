"""The SDK against a real gateway (uvicorn on port 0) serving the fake engine."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import numpy as np
import pytest

from bench.server import gateway_app, serve
from gateway.client import (
    AudioChunk,
    ClientError,
    ConnectionClosedError,
    Context,
    HandshakeError,
    InvalidRequestError,
    PolicyViolationError,
    RateLimitError,
    ServerError,
    connect,
    read_wav,
    speak,
    to_wav,
)
from gateway.protocol import (
    ContextCancelled,
    ContextCreated,
    ContextDone,
    SegmentStarted,
    SessionCreated,
    TextFlushed,
)
from realtime_engine.engines.base import SegmentRequest
from realtime_engine.engines.fake import FakeEngine, segment_pitch_hz


@pytest.fixture
async def url() -> AsyncIterator[str]:
    async with serve(gateway_app(FakeEngine())) as base:
        yield base


def dominant_hz(pcm: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(pcm * np.hanning(len(pcm))))
    return float(np.argmax(spectrum) * rate / len(pcm))


async def test_session_created_and_update(url: str) -> None:
    async with connect(url) as conn:
        assert conn.session.config.id.startswith("sess_")
        assert conn.limits.max_contexts >= 1
        updated = await conn.session.update(output={"format": "pcm16"}, latency_preset="latency")
        assert updated.output.format == "pcm16" and updated.latency_preset == "latency"
        assert conn.session.config == updated
        with pytest.raises(InvalidRequestError) as err:
            await conn.session.update(output={"sample_rate": 12345})
        assert err.value.detail.param is not None and "sample_rate" in err.value.detail.param
        assert conn.session.config == updated  # unchanged by the refused update
        assert await conn.ping() > 0


async def test_pcm16_utterance_is_the_engine_audio(url: str) -> None:
    text = "Hello there."
    async with connect(url) as conn:
        await conn.session.update(output={"format": "pcm16", "sample_rate": 24000})
        ctx = conn.context("c1")
        await ctx.append(text)
        await ctx.end()
        chunks: list[AudioChunk] = []
        async for chunk in ctx.audio():
            chunks.append(chunk)
        done = ctx.result
    assert isinstance(done, ContextDone) and done.status == "completed"
    assert done.metrics.segments == 1 and done.metrics.ttfa_ms is not None
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    pts = list(itertools.accumulate((c.duration_ms for c in chunks), initial=0.0))
    assert [c.pts_ms for c in chunks] == [round(p) for p in pts[:-1]]
    pcm = np.concatenate([c.pcm for c in chunks if c.pcm is not None])
    assert len(pcm) == done.audio_ms * 24
    expected = FakeEngine().render(_segment(text))
    assert np.allclose(pcm[: len(expected)], expected, atol=2 / 32768)


def _segment(text: str) -> SegmentRequest:
    return SegmentRequest(request_id="x", text=text)


@pytest.mark.parametrize(
    ("fmt", "rate"), [("opus", 24000), ("opus", 48000), ("mulaw", 8000), ("pcm_f32", 16000)]
)
async def test_formats_decode_to_the_segment_tone(url: str, fmt: str, rate: int) -> None:
    text = "A tone to check."
    async with connect(url) as conn:
        await conn.session.update(output={"format": fmt, "sample_rate": rate})
        ctx = conn.context()
        await ctx.append(text)
        await ctx.end()
        utterance = await ctx.collect()
    assert utterance.sample_rate == rate
    assert abs(len(utterance.pcm) - utterance.done.audio_ms * rate / 1000) <= rate * 0.02
    assert abs(dominant_hz(utterance.pcm, rate) - segment_pitch_hz(text)) < 15.0


async def test_two_contexts_interleave_on_one_connection(url: str) -> None:
    texts = {"a": "First voice line here.", "b": "Second, rather different line."}

    async def first_segment(ctx: Context) -> tuple[str, np.ndarray, ContextDone]:
        segment, pcm = "", []
        async for item in ctx.events():
            if isinstance(item, SegmentStarted) and not segment:
                segment = item.text
            elif isinstance(item, AudioChunk):
                pcm.append(ctx.decode(item))
            elif isinstance(item, ContextDone):
                return segment, np.concatenate(pcm), item
        raise AssertionError("no context.done")

    async with connect(url) as conn:
        await conn.session.update(output={"format": "pcm16"})
        ctxs = {k: conn.context(k) for k in texts}
        for k, t in texts.items():
            await ctxs[k].append(t)
        for ctx in ctxs.values():
            await ctx.end()
        results = await asyncio.gather(*(first_segment(ctx) for ctx in ctxs.values()))
    for k, (segment, pcm, done) in zip(texts, results, strict=True):
        assert done.context_id == k and segment
        assert abs(dominant_hz(pcm[:2400], 24000) - segment_pitch_hz(segment)) < 25.0


async def test_connection_dispatch_sees_everything() -> None:
    async with serve(gateway_app(FakeEngine())) as base, connect(base) as conn:
        ctx = conn.context("c1", dispatch="connection")
        await ctx.append("Events on the connection.")
        await ctx.end()
        seen: list[str] = []
        async for event in conn:
            seen.append("audio" if isinstance(event, AudioChunk) else event.type)
            if isinstance(event, ContextDone):
                break
    assert seen[0] == "context.created"
    assert "segment.started" in seen and "audio" in seen
    assert seen[-1] == "context.done"
    with pytest.raises(ClientError):
        async for _ in ctx.events():
            pass


async def test_cancel_stops_audio() -> None:
    engine = FakeEngine(realtime_factor=1.0)
    async with serve(gateway_app(engine)) as base, connect(base) as conn:
        ctx = conn.context("long")
        await ctx.append("This is a long sentence that would take several seconds to say. " * 3)
        await ctx.end()
        items: list[object] = []
        ack = None
        async for item in ctx.events():
            items.append(item)
            if isinstance(item, AudioChunk) and ack is None:
                ack = await ctx.cancel(timeout=5.0)
        assert isinstance(ack, ContextCancelled)
        assert ack.audio_ms_sent > 0 and ack.text_unspoken
        # the ack is the last thing of the context: no audio frame after it
        assert items[-1] == ack
        assert ctx.result == ack
        await asyncio.sleep(0.2)
        assert engine.log.aborted or engine.log.stopped
        assert not engine.running


async def test_context_failure_is_a_typed_error_and_the_session_survives() -> None:
    engine = FakeEngine(fail_on="boom", fail_after_chunks=1)
    async with serve(gateway_app(engine)) as base, connect(base) as conn:
        bad = conn.context("bad")
        await bad.append("This will go boom.")
        await bad.end()
        with pytest.raises(ServerError) as err:
            async for _ in bad.audio():
                pass
        assert err.value.detail.context_id == "bad"
        good = conn.context("good")
        await good.append("Still alive.")
        await good.end()
        utterance = await good.collect()
        assert utterance.done.status == "completed" and len(utterance.pcm) > 0


async def test_refused_context_raises_at_once() -> None:
    engine = FakeEngine(realtime_factor=1.0)
    async with serve(gateway_app(engine)) as base, connect(base) as conn:
        with pytest.raises(ValueError):
            conn.context("x" * 65)  # longer than the protocol allows: refused locally
        open_ = [conn.context(f"c{i}") for i in range(conn.limits.max_contexts)]
        for ctx in open_:
            await ctx.append("Keep this context busy for a while.")
        extra = conn.context("one-too-many")
        await extra.append("Refused.")
        with pytest.raises(RateLimitError) as err:
            async for _ in extra.audio():
                pass
        assert err.value.code == "too_many_contexts"
        assert extra.stream is None


async def test_refused_text_keeps_the_context_open(url: str) -> None:
    async with connect(url) as conn:
        ctx = conn.context("too-much")
        await ctx.append("x" * (conn.limits.max_text_chars_per_context + 1))
        await ctx.append("This part is fine.")
        await ctx.end()
        utterance = await asyncio.wait_for(ctx.collect(), 10)
        assert [e.code for e in ctx.errors] == ["text_too_long"]
        assert utterance.done.status == "completed" and len(utterance.pcm) > 0


async def test_base64_transport(url: str) -> None:
    async with connect(url) as conn:
        await conn.session.update(audio_transport="base64", output={"format": "pcm16"})
        ctx = conn.context()
        await ctx.append("Base sixty four.")
        await ctx.end()
        utterance = await ctx.collect()
    assert len(utterance.pcm) == utterance.done.audio_ms * 24


async def test_api_keys() -> None:
    async with serve(gateway_app(FakeEngine(), api_keys=("sk-good",))) as base:
        with pytest.raises((HandshakeError, PolicyViolationError, ServerError)):
            async with connect(base, api_key="sk-bad"):
                pass
        with pytest.raises((HandshakeError, PolicyViolationError, ServerError)):
            async with connect(base):
                pass
        async with connect(base, api_key="sk-good") as conn:
            assert isinstance(conn.session.config.id, str)


async def test_voice_create_refuses_garbage(url: str) -> None:
    async with connect(url) as conn:
        with pytest.raises(InvalidRequestError):
            await conn.voices.create(b"definitely not audio", voice_id="mine")


async def test_closed_connection_raises_typed_errors(url: str) -> None:
    conn = await connect(url)
    await conn.close()
    with pytest.raises(ConnectionClosedError):
        await conn.context().append("too late")
    assert [e async for e in conn] == []  # iteration ends quietly after our own close
    with pytest.raises(ConnectionClosedError):
        await connect("ws://127.0.0.1:9/", open_timeout=2.0)


async def test_sync_speak_returns_a_wav(url: str) -> None:
    wav = await asyncio.to_thread(speak, "Hello from a script.", url=url, sample_rate=16000)
    pcm, rate = read_wav(wav)
    assert rate == 16000 and len(pcm) > 1600
    assert np.max(np.abs(pcm)) > 0.1
    with pytest.raises(ClientError):
        speak("inside a loop", url=url)


async def test_events_are_typed(url: str) -> None:
    async with connect(url) as conn:
        ctx = conn.context("t")
        await ctx.append("Typed events only.")
        await ctx.end()
        kinds = {type(item) async for item in ctx.events()}
    assert {ContextCreated, SegmentStarted, AudioChunk, ContextDone} <= kinds
    assert SessionCreated not in kinds


class CloningFakeEngine(FakeEngine):
    """The fake engine plus the voice-cloning capability the gateway looks for."""

    supports_voice_cloning = True

    async def encode_reference(self, pcm: np.ndarray, sample_rate: int) -> np.ndarray:
        return np.zeros((-(-pcm.size // 960), 8), dtype=np.int64)


def tone_wav(seconds: float, rate: int = 24000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    return to_wav((0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate)


async def test_voice_create_then_speak_with_it() -> None:
    async with serve(gateway_app(CloningFakeEngine())) as base, connect(base) as conn:
        created = await conn.voices.create(tone_wav(1.0), voice_id="my-voice", text="A tone.")
        assert created.voice_id == "my-voice" and not created.cached
        assert created.duration_s == pytest.approx(1.0, abs=0.05)
        again = await conn.voices.create(tone_wav(1.0), voice_id="my-voice", text="A tone.")
        assert again.cached
        assert (await conn.session.update(voice="my-voice")).voice == "my-voice"
        ctx = conn.context()
        await ctx.append("Spoken in my voice.")
        await ctx.end()
        assert (await ctx.collect()).done.status == "completed"


async def test_voice_create_on_an_engine_without_cloning(url: str) -> None:
    async with connect(url) as conn:
        with pytest.raises(ServerError) as err:
            await conn.voices.create(tone_wav(1.0), voice_id="nope")
    assert err.value.code == "voice_unsupported"


async def test_manual_buffering_speaks_on_flush(url: str) -> None:
    async with connect(url) as conn:
        await conn.session.update(text_buffering={"mode": "manual"}, output={"format": "pcm16"})
        ctx = conn.context("manual")
        await ctx.append("Nothing is spoken ")
        await ctx.append("until the flush.")
        flush_id = await ctx.flush("f1")
        assert flush_id == "f1"
        seen: list[str] = []
        async for item in ctx.events():
            seen.append("audio" if isinstance(item, AudioChunk) else item.type)
            if isinstance(item, TextFlushed):
                assert item.flush_id == "f1"
                await ctx.end()
        assert seen.index("text.flushed") > seen.index("audio")
        assert seen.count("segment.started") == 1 and seen[-1] == "context.done"
