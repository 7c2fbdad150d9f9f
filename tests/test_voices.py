"""Voice library: inline reference audio only, clip checks, cloning registry, HTTP API."""

from __future__ import annotations

import asyncio
import base64
import io
import re
import wave
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import av
import httpx
import numpy as np
import pytest
import pytest_asyncio
from hypothesis import given
from hypothesis import strategies as st
from live_server import live_server
from starlette.applications import Starlette

from gateway.http.voices import voice_routes as routes
from gateway.settings import GatewaySettings
from gateway.state import GatewayState
from gateway.voice_backends import LocalVoiceBackend
from gateway.voice_store import key_digest
from gateway.voices import (
    ReferenceAudioError,
    VoiceConflictError,
    VoiceLibrary,
    VoiceNotFoundError,
    VoiceStore,
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
        self.encoded: list[np.ndarray] = []

    async def encode_reference(self, pcm: np.ndarray, sample_rate: int) -> np.ndarray:
        """Codes that depend on the clip (its mean level), one row per 960 samples."""
        self.encoded.append(pcm)
        frames = -(-pcm.size // 960)
        level = int(abs(float(pcm.mean())) * 1e6) % 1024
        return np.full((frames, 8), level, dtype=np.int64)


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
    assert [v.voice_id for v in await library.list()] == ["default", "fake-bright"]
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
    assert len(engine.encoded) == 1  # the hit skipped the encoder
    named = await library.create(CLIP, "a tone", "named")
    assert named.cached and len(engine.encoded) == 1
    assert library.stats().encodes == 1 and library.stats().hits == 2
    assert library.has(first.voice_id)
    entry = await library.get(first.voice_id)
    assert not entry.builtin and entry.text == "a tone"
    # every name of the clip leads to the same codes
    one, two = await library.reference(first.voice_id), await library.reference("named")
    assert one is two and one is not None and one.text == "a tone" and one.frames == 25
    assert await library.reference("default") is None
    # The engine can now speak with it.
    request = SegmentRequest(request_id="x", text="hi", voice=first.voice_id, reference=one)
    assert [c async for c in engine.synthesize(request)]


async def test_a_transcript_is_part_of_the_cache_key() -> None:
    engine = CloningFakeEngine()
    library = VoiceLibrary(engine)
    await library.create(CLIP, "a tone", None)
    other = await library.create(CLIP, "another transcript", None)
    assert not other.cached and len(engine.encoded) == 2


async def test_least_recently_used_codes_are_evicted() -> None:
    engine = CloningFakeEngine()
    library = VoiceLibrary(engine, max_cached=2)
    clips = [wav_bytes(tone(1.0, 16_000, hz=hz), 16_000) for hz in (200, 300, 400)]
    await library.create(clips[0], None, "a")
    await library.create(clips[1], None, "b")
    await library.reference("a")  # "a" is now the most recently used
    await library.create(clips[2], None, "c")  # evicts "b"
    assert library.stats().evictions == 1 and library.stats().cached == 2
    assert await library.reference("a") is not None
    with pytest.raises(VoiceNotFoundError, match="expired"):
        await library.reference("b")
    assert not library.has("b")
    again = await library.create(clips[1], None, "b")
    assert not again.cached and len(engine.encoded) == 4


async def test_keys_do_not_see_each_others_voices() -> None:
    engine = CloningFakeEngine()
    library = VoiceLibrary(engine)
    await library.create(CLIP, None, "mine", key_id="key_a")
    assert library.has("mine", "key_a") and not library.has("mine", "key_b")
    assert [v.voice_id for v in await library.list("key_b")] == ["default", "fake-bright"]
    with pytest.raises(VoiceNotFoundError):
        await library.reference("mine", "key_b")
    with pytest.raises(VoiceNotFoundError):
        await library.delete("mine", "key_b")
    # the same clip and id under another key: its own voice, its own encode
    theirs = await library.create(CLIP, None, "mine", key_id="key_b")
    assert not theirs.cached and len(engine.encoded) == 2
    await library.delete("mine", "key_b")
    assert library.has("mine", "key_a")


async def test_voices_persist_to_a_directory_and_come_back(tmp_path: Path) -> None:
    engine = CloningFakeEngine()
    library = VoiceLibrary(engine, store=VoiceStore(tmp_path))
    await library.create(CLIP, "a tone", "kept", key_id="key_a")
    await library.create(wav_bytes(tone(1.0, 16_000, hz=330), 16_000), None, "gone", "key_a")
    await library.delete("gone", "key_a")
    first = await library.reference("kept", "key_a")
    assert first is not None
    # names/<sha256(key id)>/<sha256(key id, voice id)>.json: digests only, no client text
    names = sorted(p.relative_to(tmp_path / "names") for p in (tmp_path / "names").rglob("*.json"))
    assert len(names) == 1 and all(
        re.fullmatch(r"[0-9a-f]{64}/[0-9a-f]{64}\.json", str(n)) for n in names
    )
    assert not list(tmp_path.rglob(".tmp-*"))  # no temporary file left behind
    # a new process: names come back, codes load from disk without the encoder
    fresh_engine = CloningFakeEngine()
    fresh = VoiceLibrary(fresh_engine, store=VoiceStore(tmp_path))
    assert fresh.has("kept", "key_a") and not fresh.has("gone", "key_a")
    assert not fresh.has("kept", "key_b")
    again = await fresh.reference("kept", "key_a")
    assert again is not None and np.array_equal(again.codes, first.codes)
    assert again.text == "a tone" and fresh_engine.encoded == []
    created = await fresh.create(CLIP, "a tone", None, key_id="key_a")
    assert created.cached and created.voice_id == "kept" and fresh_engine.encoded == []


def _key_codes(root: Path, key_id: str) -> list[Path]:
    return sorted((root / "names" / key_digest(key_id) / "codes").glob("*.npz"))


async def test_deleting_a_voice_deletes_its_codes_once_no_name_of_the_key_uses_them(
    tmp_path: Path,
) -> None:
    library = VoiceLibrary(CloningFakeEngine(), store=VoiceStore(tmp_path))
    other = wav_bytes(tone(1.0, 16_000, hz=330), 16_000)
    await library.create(CLIP, None, "first", key_id="key_a")
    await library.create(CLIP, None, "second", key_id="key_a")  # the same clip: one file
    await library.create(other, None, "other", key_id="key_a")
    await library.create(CLIP, None, "first", key_id="key_b")
    assert len(_key_codes(tmp_path, "key_a")) == 2
    await library.delete("first", "key_a")
    assert len(_key_codes(tmp_path, "key_a")) == 2, "'second' still uses the clip"
    await library.delete("second", "key_a")
    assert len(_key_codes(tmp_path, "key_a")) == 1
    # what is left loads in a new process (no memory copy): the key's other clip,
    # and the same clip under the other key
    fresh = VoiceLibrary(CloningFakeEngine(), store=VoiceStore(tmp_path))
    assert await fresh.reference("other", "key_a") is not None
    assert await fresh.reference("first", "key_b") is not None
    await fresh.delete("other", "key_a")
    await fresh.delete("first", "key_b")
    assert _key_codes(tmp_path, "key_a") == [] and _key_codes(tmp_path, "key_b") == []


async def test_codes_kept_before_they_were_per_key_still_load(tmp_path: Path) -> None:
    library = VoiceLibrary(CloningFakeEngine(), store=VoiceStore(tmp_path))
    await library.create(CLIP, "old", "kept", key_id="key_a")
    (code_file,) = _key_codes(tmp_path, "key_a")
    shared = tmp_path / "codes" / code_file.name  # where a directory kept them before
    code_file.rename(shared)
    fresh = VoiceLibrary(CloningFakeEngine(), store=VoiceStore(tmp_path))
    reference = await fresh.reference("kept", "key_a")
    assert reference is not None and reference.text == "old"
    await fresh.delete("kept", "key_a")
    assert shared.is_file(), "shared codes may serve another key: never deleted"


class _InterleavedBackend(LocalVoiceBackend):
    """A worker whose first codes read happens while another worker deletes the voice
    and makes it again from another clip."""

    def __init__(self, store: VoiceStore, meanwhile: Callable[[], Awaitable[None]]) -> None:
        super().__init__(store)
        self._meanwhile: Callable[[], Awaitable[None]] | None = meanwhile

    async def load_codes(self, key_id: str, digest: str) -> tuple[np.ndarray, str | None] | None:
        if self._meanwhile is not None:
            meanwhile, self._meanwhile = self._meanwhile, None
            await meanwhile()
        return await super().load_codes(key_id, digest)


async def test_a_voice_made_again_while_it_is_read_is_used_not_deleted(tmp_path: Path) -> None:
    other = wav_bytes(tone(1.0, 16_000, hz=330), 16_000)
    writer = VoiceLibrary(CloningFakeEngine(), store=VoiceStore(tmp_path))
    await writer.create(CLIP, None, "mine", key_id="k")

    async def remake() -> None:
        await writer.delete("mine", "k")
        await writer.create(other, "new", "mine", key_id="k")

    reader = VoiceLibrary(
        CloningFakeEngine(), backend=_InterleavedBackend(VoiceStore(tmp_path), remake)
    )
    reference = await reader.reference("mine", "k")
    assert reference is not None and reference.text == "new"
    assert await writer.reference("mine", "k") is not None, "the new voice survives"


def test_a_broken_store_file_is_skipped(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path)
    (tmp_path / "names" / "junk.json").write_text("{not json", encoding="utf-8")
    (tmp_path / "codes" / ("0" * 64 + ".npz")).write_bytes(b"not an npz")
    assert store.load_names() == []
    assert store.load_codes("k", "0" * 64) is None
    with pytest.raises(ValueError):
        store.load_codes("k", "../etc/passwd")


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
    assert not library.has("temp")
    with pytest.raises(VoiceNotFoundError):
        await library.delete("temp")
    with pytest.raises(VoiceNotFoundError):
        await library.reference("temp")
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
    assert len(engine.encoded) == 1  # the repeat was a cache hit


async def test_http_voices_need_a_key_when_keys_are_set() -> None:
    app = Starlette(routes=routes(make_state(FakeEngine(), api_keys=("sk-test",))))
    async with live_server(app) as url, httpx.AsyncClient(base_url=url) as client:
        denied = await client.get("/v1/voices")
        allowed = await client.get("/v1/voices", headers={"Authorization": "Bearer sk-test"})
    assert denied.status_code == 401
    assert denied.json()["error"]["type"] == "authentication_error"
    assert allowed.status_code == 200


class GatedCloningEngine(CloningFakeEngine):
    """Encoding blocks until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def encode_reference(self, pcm: np.ndarray, sample_rate: int) -> np.ndarray:
        codes = await super().encode_reference(pcm, sample_rate)
        await self.gate.wait()
        return codes


async def test_concurrent_creates_of_one_clip_share_one_encode() -> None:
    engine = GatedCloningEngine()
    library = VoiceLibrary(engine)
    tasks = [asyncio.create_task(library.create(CLIP, "a tone", f"v{i}")) for i in range(4)]
    async with asyncio.timeout(30):
        # wait (yielding, no timer) until every create is inside an encode or waiting on one
        while len(engine.encoded) + library.stats().hits < 4:
            await asyncio.sleep(0)
    engine.gate.set()
    results = await asyncio.gather(*tasks)
    assert len(engine.encoded) == 1
    assert sorted(r.cached for r in results) == [False, True, True, True]
    references = [await library.reference(f"v{i}") for i in range(4)]
    assert all(r is references[0] for r in references)
