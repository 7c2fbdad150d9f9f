"""Voice library: inline reference audio only, clip checks, cloning registry, HTTP API."""

from __future__ import annotations

import base64
import io
import wave
from collections.abc import AsyncIterator

import av
import httpx
import numpy as np
import pytest
import pytest_asyncio
from hypothesis import given
from hypothesis import strategies as st
from live_server import live_server
from starlette.applications import Starlette

from gateway.http_voices import voice_routes as routes
from gateway.settings import GatewaySettings
from gateway.state import GatewayState
from gateway.voices import (
    ReferenceAudioError,
    ReferenceClip,
    VoiceConflictError,
    VoiceLibrary,
    VoiceNotFoundError,
    decode_clip,
    reference_bytes,
)
from realtime_engine.engines.base import SegmentRequest, UnsupportedVoiceError
from realtime_engine.engines.fake import FakeEngine


def tone(seconds: float, rate: int, hz: float = 220.0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def wav_bytes(pcm: np.ndarray, rate: int) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((np.clip(pcm, -1, 1) * 32767).astype("<i2").tobytes())
    return buffer.getvalue()


def container_bytes(pcm: np.ndarray, rate: int, container: str, codec: str) -> bytes:
    """Encode with PyAV, independently of the gateway's own encoders."""
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate, layout="mono")
        assert isinstance(stream, av.AudioStream)
        formats = stream.codec_context.codec.audio_formats
        assert formats
        fmt = formats[0].name
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="flt", layout="mono")
        frame.sample_rate = rate
        resampler = av.AudioResampler(format=fmt, layout="mono", rate=rate)
        for converted in resampler.resample(frame):
            for packet in stream.encode(converted):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buffer.getvalue()


CLIP = wav_bytes(tone(1.0, 16_000), 16_000)


class CloningFakeEngine(FakeEngine):
    """The fake engine plus the cloning capability, recording what it was given."""

    supports_voice_cloning = True

    def __init__(self) -> None:
        super().__init__()
        self.added: dict[str, tuple[ReferenceClip, str | None]] = {}
        self.removed: list[str] = []

    async def clone_voice(self, voice_id: str, clip: ReferenceClip, text: str | None) -> None:
        self.added[voice_id] = (clip, text)
        self.config.voices = (*self.config.voices, voice_id)

    async def remove_cloned_voice(self, voice_id: str) -> None:
        self.removed.append(voice_id)
        self.config.voices = tuple(v for v in self.config.voices if v != voice_id)


# -- inline reference audio ------------------------------------------------------


@given(st.binary(min_size=800, max_size=3000))
def test_plain_base64_round_trips(data: bytes) -> None:
    assert reference_bytes(base64.b64encode(data).decode()) == data
    assert reference_bytes(base64.urlsafe_b64encode(data).decode().rstrip("=")) == data


@given(st.binary(min_size=1, max_size=400), st.sampled_from(["audio/wav", "audio/mpeg", ""]))
def test_data_uri_round_trips(data: bytes, mime: str) -> None:
    uri = f"data:{mime};base64,{base64.b64encode(data).decode()}"
    assert reference_bytes(uri) == data


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("https://example.com/other.wav", "URLs are not fetched"),
        ("http://169.254.169.254/latest", "URLs are not fetched"),
        ("file:///etc/passwd", "URLs are not fetched"),
        ("s3://bucket/clip.wav", "URLs are not fetched"),
        ("/etc/passwd", "paths are not read"),
        ("/tmp/clip", "paths are not read"),
        ("./clip.wav", "paths are not read"),
        ("../secrets/key", "paths are not read"),
        ("~/clip.wav", "paths are not read"),
        ("clip.wav", "paths are not read"),
        ("C:\\voices\\clip.wav", "paths are not read"),
        ("data:audio/wav,RIFF....", "base64"),
        ("not base64 at all!", "not valid base64"),
        ("   ", "empty"),
        ("data:audio/wav;base64,", "no audio data"),
    ],
)
def test_paths_urls_and_junk_are_refused(value: str, message: str) -> None:
    with pytest.raises(ReferenceAudioError, match=message) as caught:
        reference_bytes(value, "ref_audio")
    assert caught.value.param == "ref_audio"


# -- decoding clips -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("container", "codec"),
    [("wav", "pcm_s16le"), ("flac", "flac"), ("ogg", "libopus"), ("mp3", "libmp3lame")],
)
def test_decode_clip_formats_to_24khz_mono(container: str, codec: str) -> None:
    rate = 48_000 if codec == "libopus" else 16_000
    data = container_bytes(tone(1.5, rate), rate, container, codec)
    clip = decode_clip(data, max_seconds=30)
    assert clip.sample_rate == 24_000 and clip.pcm.dtype == np.float32
    assert clip.duration_s == pytest.approx(1.5, abs=0.08)
    assert clip.frames == pytest.approx(1.5 * 25, abs=3)
    # The tone survives decoding: its spectrum peaks at 220 Hz.
    window = clip.pcm[2400:26400]
    spectrum = np.abs(np.fft.rfft(window))
    peak_hz = np.fft.rfftfreq(window.size, 1 / 24_000)[np.argmax(spectrum)]
    assert peak_hz == pytest.approx(220, abs=2)


def test_decode_clip_refuses_long_and_broken_clips() -> None:
    with pytest.raises(ReferenceAudioError, match="longer than the 2 s"):
        decode_clip(wav_bytes(tone(3.0, 16_000), 16_000), max_seconds=2)
    with pytest.raises(ReferenceAudioError, match="could not be decoded"):
        decode_clip(b"RIFF-not-really-a-wave-file" * 10, max_seconds=30)
    with pytest.raises(ReferenceAudioError, match="no audio"):
        decode_clip(wav_bytes(np.zeros(0, np.float32), 16_000), max_seconds=30)


# -- the library --------------------------------------------------------------------------


async def test_library_lists_builtin_voices_and_refuses_cloning_after_checks() -> None:
    library = VoiceLibrary(FakeEngine())
    assert [v.voice_id for v in library.list()] == ["default", "fake-bright"]
    assert library.has("fake-bright") and not library.has("nobody")
    with pytest.raises(ReferenceAudioError):  # the clip is checked first
        await library.create(b"garbage", None, None)
    with pytest.raises(UnsupportedVoiceError, match="fake engine cannot clone"):
        await library.create(CLIP, "hello", None)


async def test_library_clones_once_per_clip() -> None:
    engine = CloningFakeEngine()
    library = VoiceLibrary(engine)
    first = await library.create(CLIP, "a tone", None)
    again = await library.create(CLIP, "a tone", None)
    assert not first.cached and again.cached and again.voice_id == first.voice_id
    assert first.duration_s == pytest.approx(1.0, abs=0.01) and first.frames == 25
    assert list(engine.added) == [first.voice_id]
    other = VoiceLibrary(CloningFakeEngine())
    await other.create(CLIP, "a tone", "named")
    reused = await other.create(CLIP, "a tone", None)
    assert (reused.voice_id, reused.cached) == ("named", True)
    assert library.has(first.voice_id)
    entry = library.get(first.voice_id)
    assert not entry.builtin and entry.text == "a tone"
    # The engine can now speak with it.
    request = SegmentRequest(request_id="x", text="hi", voice=first.voice_id)
    assert [c async for c in engine.synthesize(request)]


async def test_library_names_conflicts_and_limits() -> None:
    library = VoiceLibrary(CloningFakeEngine(), max_voices=2)
    await library.create(CLIP, None, "mine")
    other = wav_bytes(tone(1.0, 16_000, hz=330), 16_000)
    with pytest.raises(VoiceConflictError, match="already exists"):
        await library.create(other, None, "mine")
    with pytest.raises(VoiceConflictError, match="built-in"):
        await library.create(CLIP, None, "default")
    with pytest.raises(ValueError, match="voice_id"):
        await library.create(CLIP, None, "no spaces allowed")
    await library.create(other, None, None)
    with pytest.raises(VoiceConflictError, match="maximum of 2"):
        await library.create(wav_bytes(tone(1.0, 16_000, hz=440), 16_000), None, None)


async def test_library_delete() -> None:
    engine = CloningFakeEngine()
    library = VoiceLibrary(engine)
    await library.create(CLIP, None, "temp")
    await library.delete("temp")
    assert not library.has("temp") and engine.removed == ["temp"]
    with pytest.raises(VoiceNotFoundError):
        await library.delete("temp")
    with pytest.raises(VoiceConflictError):
        await library.delete("default")


# -- HTTP ---------------------------------------------------------------------------------------


def make_state(engine: FakeEngine, **settings: object) -> GatewayState:
    return GatewayState.create(
        GatewaySettings.model_validate(settings), engine, voices=VoiceLibrary(engine)
    )


@pytest_asyncio.fixture
async def cloning_server() -> AsyncIterator[tuple[str, CloningFakeEngine]]:
    engine = CloningFakeEngine()
    app = Starlette(routes=routes(make_state(engine)))
    async with live_server(app) as url:
        yield url, engine


@pytest_asyncio.fixture
async def plain_server() -> AsyncIterator[str]:
    app = Starlette(routes=routes(make_state(FakeEngine())))
    async with live_server(app) as url:
        yield url


async def test_http_lists_builtin_voices(plain_server: str) -> None:
    async with httpx.AsyncClient(base_url=plain_server) as client:
        response = await client.get("/v1/voices")
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    assert {v["voice_id"] for v in body["data"]} == {"default", "fake-bright"}
    assert all(v["builtin"] for v in body["data"])


async def test_http_create_is_refused_by_engines_that_cannot_clone(plain_server: str) -> None:
    async with httpx.AsyncClient(base_url=plain_server) as client:
        refused = await client.post(
            "/v1/voices", files={"audio": ("clip.wav", CLIP, "audio/wav")}, data={"text": "hi"}
        )
        broken = await client.post(
            "/v1/voices", json={"audio": base64.b64encode(b"x" * 900).decode()}
        )
        path = await client.post("/v1/voices", json={"audio": "/etc/passwd"})
        missing = await client.post("/v1/voices", json={"text": "no audio"})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "voice_unsupported"
    assert "fake engine cannot clone" in error["message"]
    assert broken.status_code == 400 and broken.json()["error"]["code"] == "voice_invalid"
    assert path.status_code == 400 and "paths are not read" in path.json()["error"]["message"]
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "audio"


async def test_http_voice_lifecycle(cloning_server: tuple[str, CloningFakeEngine]) -> None:
    url, engine = cloning_server
    async with httpx.AsyncClient(base_url=url) as client:
        created = await client.post(
            "/v1/voices",
            files={"audio": ("clip.wav", CLIP, "audio/wav")},
            data={"text": "a tone", "voice_id": "tone"},
        )
        again = await client.post(
            "/v1/voices",
            json={"audio": "data:audio/wav;base64," + base64.b64encode(CLIP).decode(),
                  "text": "a tone", "voice_id": "tone"},
        )  # fmt: skip
        listed = (await client.get("/v1/voices")).json()["data"]
        deleted = await client.delete("/v1/voices/tone")
        gone = await client.delete("/v1/voices/tone")
        builtin = await client.delete("/v1/voices/default")
    assert created.status_code == 201
    assert created.json() == {
        "object": "voice", "voice_id": "tone", "duration_s": 1.0, "frames": 25, "cached": False,
    }  # fmt: skip
    assert again.status_code == 200 and again.json()["cached"] is True
    tone_entry = next(v for v in listed if v["voice_id"] == "tone")
    assert tone_entry["builtin"] is False and tone_entry["text"] == "a tone"
    assert deleted.status_code == 200 and deleted.json()["deleted"] is True
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "voice_not_found"
    assert builtin.status_code == 409
    assert engine.removed == ["tone"]


async def test_http_voices_need_a_key_when_keys_are_set() -> None:
    app = Starlette(routes=routes(make_state(FakeEngine(), api_keys=("sk-test",))))
    async with live_server(app) as url, httpx.AsyncClient(base_url=url) as client:
        denied = await client.get("/v1/voices")
        allowed = await client.get("/v1/voices", headers={"Authorization": "Bearer sk-test"})
    assert denied.status_code == 401
    assert denied.json()["error"]["type"] == "authentication_error"
    assert allowed.status_code == 200
