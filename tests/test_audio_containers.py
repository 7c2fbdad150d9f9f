"""HTTP containers: each format decodes back (PyAV) to the right rate and duration."""

from __future__ import annotations

import io
import struct
import wave

import av
import numpy as np
import pytest

from realtime_engine.audio import containers
from realtime_engine.audio.containers import (
    CONTAINER_FORMATS,
    ContainerEncoder,
    supported_container_formats,
    wav_header,
)
from realtime_engine.audio.errors import AudioEncodeError, AudioFormatError, UnsupportedFormatError

RATE = 24000
SECONDS = 1.0


def tone(seconds: float = SECONDS) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    return (0.3 * np.sin(2 * np.pi * 220 * t) * np.sin(2 * np.pi * 3 * t)).astype(np.float32)


def encode_chunked(enc: ContainerEncoder, x: np.ndarray, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    parts, pos = [], 0
    while pos < x.size:
        step = int(rng.integers(1, 3000))
        parts.append(enc.feed(x[pos : pos + step]))
        pos += step
    parts.append(enc.finish())
    return parts


def decode(data: bytes) -> tuple[np.ndarray, int]:
    with av.open(io.BytesIO(data), "r") as container:
        stream = container.streams.audio[0]
        frames = [f.to_ndarray().reshape(-1) for f in container.decode(stream)]
        rate = stream.codec_context.sample_rate
    return np.concatenate(frames), rate


# Encoders with priming or block padding decode a little long when no header says how much
# to trim (a streamed MP3 has no LAME tag; ADTS never says): priming plus the last
# frame's padding, at most this many samples (frames are 1152 and 1024 samples).
PADDING_SAMPLES = {"mp3": 3 * 1152, "aac": 3 * 1024}


@pytest.mark.parametrize("streaming", [True, False])
@pytest.mark.parametrize("fmt", ["wav", "opus", "flac", "mp3", "aac"])
def test_container_decodes_to_input_duration(fmt: str, streaming: bool) -> None:
    enc = ContainerEncoder(fmt, RATE, streaming)
    parts = encode_chunked(enc, tone())
    if not streaming:
        assert all(p == b"" for p in parts[:-1])
    else:
        assert sum(1 for p in parts[:-1] if p) > len(parts) // 3  # bytes flow while feeding
    pcm, rate = decode(b"".join(parts))
    # FFmpeg always decodes Opus at 48 kHz; the Ogg header keeps the input rate (checked below).
    assert rate == (48000 if fmt == "opus" else RATE)
    padding = PADDING_SAMPLES.get(fmt, 0) if streaming or fmt == "aac" else 0
    assert rate * SECONDS <= pcm.size <= rate * SECONDS + padding


@pytest.mark.parametrize("fmt", ["wav", "flac", "pcm"])
def test_lossless_formats_keep_the_s16_samples(fmt: str) -> None:
    x = tone()
    data = b"".join(encode_chunked(ContainerEncoder(fmt, RATE, True), x))
    expected = np.clip(np.rint(x * 32768), -32768, 32767).astype(np.int16)
    if fmt == "pcm":
        got = np.frombuffer(data, "<i2")
    else:
        pcm, _ = decode(data)
        got = np.rint(pcm * 32768).astype(np.int16) if pcm.dtype.kind == "f" else pcm
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("sr", [8000, 16000, 48000])
@pytest.mark.parametrize("fmt", ["wav", "mp3", "aac", "flac"])
def test_resampled_containers_report_the_requested_rate(fmt: str, sr: int) -> None:
    data = b"".join(encode_chunked(ContainerEncoder(fmt, sr, False), tone()))
    pcm, rate = decode(data)
    assert rate == sr
    assert sr * SECONDS <= pcm.size <= sr * SECONDS + PADDING_SAMPLES.get(fmt, 0)


def test_ogg_opus_header_carries_input_rate_and_pre_skip() -> None:
    data = b"".join(encode_chunked(ContainerEncoder("opus", 16000, True), tone()))
    at = data.index(b"OpusHead")
    _version, channels, pre_skip, input_rate = struct.unpack_from("<BBHI", data, at + 8)
    assert (channels, input_rate) == (1, 16000)
    assert pre_skip > 0


def test_streamed_wav_header_has_unknown_sizes_and_plain_wav_has_real_ones() -> None:
    x = tone(0.25)
    streamed = b"".join(encode_chunked(ContainerEncoder("wav", RATE, True), x))
    riff_size, data_size = (
        struct.unpack_from("<I", streamed, 4)[0],
        struct.unpack_from("<I", streamed, 40)[0],
    )
    assert riff_size == data_size == 0xFFFFFFFF
    plain = b"".join(encode_chunked(ContainerEncoder("wav", RATE, False), x))
    assert plain[44:] == streamed[44:]
    with wave.open(io.BytesIO(plain)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, RATE)
        assert w.getnframes() == x.size
    assert struct.unpack_from("<I", plain, 4)[0] == len(plain) - 8


def test_empty_response_is_still_a_valid_file() -> None:
    assert ContainerEncoder("wav", RATE, True).finish() == wav_header(RATE, None)
    assert ContainerEncoder("wav", RATE, False).finish() == wav_header(RATE, 0)
    assert ContainerEncoder("pcm", RATE, True).finish() == b""
    for fmt in ("opus", "flac", "mp3", "aac"):
        assert isinstance(ContainerEncoder(fmt, RATE, True).finish(), bytes)


def test_content_types() -> None:
    types = {fmt: ContainerEncoder(fmt).content_type for fmt in CONTAINER_FORMATS}
    assert types["mp3"] == "audio/mpeg"
    assert types["opus"].startswith("audio/ogg")
    assert types["wav"] == "audio/wav"
    assert all(t.startswith("audio/") for t in types.values())


def test_unknown_format_names_the_supported_ones() -> None:
    with pytest.raises(UnsupportedFormatError) as err:
        ContainerEncoder("vorbis")
    assert err.value.param == "response_format"
    for fmt in CONTAINER_FORMATS:
        assert fmt in str(err.value)


def test_missing_encoder_in_the_media_library_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(containers._PYAV_FORMATS, "mp3", ("mp3", "no_such_encoder", 64000))
    assert "mp3" not in supported_container_formats()
    with pytest.raises(UnsupportedFormatError) as err:
        ContainerEncoder("mp3")
    assert "mp3" not in str(err.value).split("supported:")[1]


def test_bad_rate_and_misuse() -> None:
    with pytest.raises(AudioFormatError):
        ContainerEncoder("wav", 22050)
    enc = ContainerEncoder("pcm")
    enc.finish()
    with pytest.raises(AudioEncodeError):
        enc.feed(np.zeros(4, np.float32))
    with pytest.raises(AudioEncodeError):
        enc.finish()
