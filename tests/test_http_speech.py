"""``POST /v1/audio/speech`` and ``GET /v1/models`` against a real server and client."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import struct
import time
from collections.abc import AsyncIterator

import av
import httpx
import numpy as np
import pytest
import pytest_asyncio
from live_server import live_server
from starlette.applications import Starlette

from gateway.http.speech import routes
from gateway.settings import GatewaySettings
from gateway.state import GatewayState
from gateway.voices import VoiceLibrary
from realtime_engine.engines.base import SegmentRequest
from realtime_engine.engines.fake import FakeEngine

TEXT = "Twenty characters!!!"  # 20 chars: 1.0 s of fake audio at 0.05 s per char
FAKE_SECONDS = 1.0


@pytest_asyncio.fixture
async def served() -> AsyncIterator[tuple[httpx.AsyncClient, FakeEngine]]:
    async with serve(FakeEngine()) as pair:
        yield pair


def serve(engine: FakeEngine, **settings: object) -> _Served:
    return _Served(engine, settings)


class _Served:
    def __init__(self, engine: FakeEngine, settings: dict[str, object]) -> None:
        state = GatewayState.create(
            GatewaySettings.model_validate(settings), engine, voices=VoiceLibrary(engine)
        )
        self._app = Starlette(routes=routes(state))
        self._engine = engine
        self._stack: list[object] = []

    async def __aenter__(self) -> tuple[httpx.AsyncClient, FakeEngine]:
        self._server = live_server(self._app)
        url = await self._server.__aenter__()
        self._client = httpx.AsyncClient(base_url=url, timeout=30)
        return self._client, self._engine

    async def __aexit__(self, *exc: object) -> None:
        await self._client.aclose()
        await self._server.__aexit__(None, None, None)


def decode(data: bytes) -> tuple[np.ndarray, int]:
    """Mono float PCM and sample rate of an encoded file, by PyAV."""
    with av.open(io.BytesIO(data), mode="r") as container:
        stream = container.streams.audio[0]
        rate = stream.codec_context.sample_rate
        frames = [f.to_ndarray().astype(np.float32).reshape(-1) for f in container.decode(stream)]
    pcm = np.concatenate(frames)
    if np.abs(pcm).max() > 2.0:  # integer sample formats
        pcm = pcm / 32768.0
    return pcm, rate


def dominant_hz(pcm: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(pcm))
    return float(np.fft.rfftfreq(pcm.size, 1 / rate)[np.argmax(spectrum)])


@pytest.mark.parametrize("fmt", ["wav", "opus", "flac", "mp3", "aac"])
@pytest.mark.parametrize("stream", [True, False])
async def test_every_container_format_decodes_at_24khz(
    served: tuple[httpx.AsyncClient, FakeEngine], fmt: str, stream: bool
) -> None:
    client, engine = served
    response = await client.post(
        "/v1/audio/speech", json={"input": TEXT, "response_format": fmt, "stream": stream}
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("audio/")
    pcm, rate = decode(response.content)
    if fmt == "opus":
        # Opus always decodes at 48 kHz; the stream records the rate it was made from.
        assert rate == 48_000 and opus_input_rate(response.content) == 24_000
    else:
        assert rate == 24_000
    assert pcm.size / rate == pytest.approx(FAKE_SECONDS, abs=0.08)
    expected = engine.render(SegmentRequest("x", TEXT))
    assert dominant_hz(pcm, rate) == pytest.approx(dominant_hz(expected, 24_000), abs=3)


def opus_input_rate(ogg: bytes) -> int:
    """``input_sample_rate`` of the OpusHead packet (RFC 7845, section 5.1)."""
    head = ogg.index(b"OpusHead")
    return int(struct.unpack_from("<I", ogg, head + 12)[0])


async def test_pcm_is_raw_16_bit_at_24khz(served: tuple[httpx.AsyncClient, FakeEngine]) -> None:
    client, engine = served
    response = await client.post("/v1/audio/speech", json={"input": TEXT, "response_format": "pcm"})
    assert response.status_code == 200
    samples = np.frombuffer(response.content, dtype="<i2").astype(np.float32) / 32768
    expected = engine.render(SegmentRequest("x", TEXT))
    assert samples.size == expected.size
    assert np.max(np.abs(samples - expected)) < 2e-4


async def test_streamed_wav_has_unknown_sizes_and_whole_wav_has_real_ones(
    served: tuple[httpx.AsyncClient, FakeEngine],
) -> None:
    client, _ = served
    streamed = await client.post("/v1/audio/speech", json={"input": TEXT, "response_format": "wav"})
    whole = await client.post(
        "/v1/audio/speech", json={"input": TEXT, "response_format": "wav", "stream": False}
    )
    assert streamed.content[:4] == b"RIFF" and streamed.content[8:12] == b"WAVE"
    assert struct.unpack("<I", streamed.content[4:8])[0] == 0xFFFFFFFF
    assert struct.unpack("<I", streamed.content[40:44])[0] == 0xFFFFFFFF
    data_bytes = struct.unpack("<I", whole.content[40:44])[0]
    assert data_bytes == len(whole.content) - 44 == 24_000 * 2 * FAKE_SECONDS
    assert int(whole.headers["content-length"]) == len(whole.content)


async def test_default_format_is_mp3(served: tuple[httpx.AsyncClient, FakeEngine]) -> None:
    client, _ = served
    response = await client.post("/v1/audio/speech", json={"input": TEXT, "voice": "alloy"})
    assert response.headers["content-type"] == "audio/mpeg"
    with av.open(io.BytesIO(response.content)) as container:
        assert container.format.name == "mp3"


async def test_sse_events_carry_the_audio(served: tuple[httpx.AsyncClient, FakeEngine]) -> None:
    client, engine = served
    response = await client.post(
        "/v1/audio/speech",
        json={"input": TEXT, "response_format": "pcm", "stream_format": "sse"},
    )
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [
        json.loads(block.removeprefix("data: "))
        for block in response.text.split("\n\n")
        if block.strip()
    ]
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    assert events[-1]["type"] == "speech.audio.done"
    audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    samples = np.frombuffer(audio, dtype="<i2")
    assert samples.size == engine.render(SegmentRequest("x", TEXT)).size
    assert events[-1]["usage"]["output_audio_samples"] == samples.size


async def test_request_fields_reach_the_engine(
    served: tuple[httpx.AsyncClient, FakeEngine],
) -> None:
    client, engine = served
    body = {
        "input": TEXT,
        "voice": {"id": "fake-bright"},
        "response_format": "pcm",
        "speed": 2.0,
        "max_new_tokens": 321,
        "seed": 9,
        "temperature": 0.5,
        "top_k": 7,
        "top_p": 0.8,
        "instructions": "Brightly.",
    }
    response = await client.post("/v1/audio/speech", json=body)
    assert response.status_code == 200
    request = engine.log.requests[-1]
    assert request.voice == "fake-bright" and request.speed == 2.0
    assert request.max_new_tokens == 321
    assert (request.sampling.seed, request.sampling.temperature) == (9, 0.5)
    assert (request.sampling.top_k, request.sampling.top_p) == (7, 0.8)
    assert len(response.content) == 2 * int(FAKE_SECONDS / 2 * 24_000)


async def test_body_starts_before_generation_ends() -> None:
    # 2 s of audio produced at real time: about 2 s of generation.
    engine = FakeEngine(realtime_factor=1.0, chunk_samples=2400)
    async with serve(engine) as (client, _):
        started = time.monotonic()
        first_byte = None
        request = {"input": "x" * 40, "response_format": "pcm"}
        async with client.stream("POST", "/v1/audio/speech", json=request) as response:
            async for _ in response.aiter_raw():
                first_byte = first_byte or time.monotonic() - started
        total = time.monotonic() - started
    assert first_byte is not None and total > 1.8
    assert first_byte < total / 2


async def test_client_disconnect_aborts_the_engine() -> None:
    engine = FakeEngine(realtime_factor=1.0, chunk_samples=2400)
    async with serve(engine) as (client, _):
        request = {"input": "x" * 200, "response_format": "pcm"}  # 10 s of audio
        async with client.stream("POST", "/v1/audio/speech", json=request) as response:
            async for _ in response.aiter_raw():
                break
        for _ in range(100):
            if engine.log.stopped:
                break
            await asyncio.sleep(0.02)
    assert len(engine.log.stopped) == 1 and not engine.log.finished
    assert engine.running == []


async def test_engine_failures() -> None:
    engine = FakeEngine(fail_on="explode", fail_after_chunks=0, chunk_samples=2400)
    async with serve(engine) as (client, _):
        at_once = await client.post("/v1/audio/speech", json={"input": "explode now"})
        engine.config.fail_after_chunks = 2
        sse = await client.post(
            "/v1/audio/speech",
            json={
                "input": "explode later please",
                "stream_format": "sse",
                "response_format": "pcm",
            },
        )
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post(
                "/v1/audio/speech", json={"input": "explode later please", "response_format": "pcm"}
            )
    assert at_once.status_code == 500
    assert at_once.json()["error"]["type"] == "server_error"
    assert at_once.json()["error"]["retryable"] is True
    events = [json.loads(b.removeprefix("data: ")) for b in sse.text.split("\n\n") if b.strip()]
    assert [e["type"] for e in events] == ["speech.audio.delta", "speech.audio.delta", "error"]
    assert events[-1]["error"]["type"] == "server_error"


async def test_models_lists_the_engine_model() -> None:
    async with serve(FakeEngine(), model_name="house-voice") as (client, _):
        response = await client.get("/v1/models")
        accepted = await client.post(
            "/v1/audio/speech",
            json={"input": TEXT, "model": "house-voice", "response_format": "pcm"},
        )
    body = response.json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["house-voice", "fake-tone"]
    assert all(m["object"] == "model" for m in body["data"])
    assert accepted.status_code == 200


async def test_speech_needs_a_key_when_keys_are_set() -> None:
    async with serve(FakeEngine(), api_keys=("sk-a",)) as (client, _):
        denied = await client.post("/v1/audio/speech", json={"input": TEXT})
        wrong = await client.post(
            "/v1/audio/speech", json={"input": TEXT}, headers={"Authorization": "Bearer sk-b"}
        )
        allowed = await client.post(
            "/v1/audio/speech",
            json={"input": TEXT, "response_format": "pcm"},
            headers={"Authorization": "Bearer sk-a"},
        )
        models = await client.get("/v1/models")
    assert denied.status_code == wrong.status_code == models.status_code == 401
    assert denied.json()["error"]["type"] == "authentication_error"
    assert allowed.status_code == 200


async def test_long_input_is_spoken_segment_by_segment(
    served: tuple[httpx.AsyncClient, FakeEngine],
) -> None:
    client, engine = served
    text = " ".join(
        f"This is sentence number {n}, which is long enough to stand alone." for n in range(8)
    )
    response = await client.post("/v1/audio/speech", json={"input": text, "response_format": "pcm"})
    assert response.status_code == 200
    requests = engine.log.requests
    assert len(requests) > 2
    assert " ".join(r.text for r in requests).split() == text.split()
    assert len({r.request_id for r in requests}) == len(requests)
    expected = sum(engine.render(r).size for r in requests)
    assert len(response.content) == 2 * expected
