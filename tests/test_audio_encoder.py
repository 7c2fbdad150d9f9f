"""AudioEncoder: Opus/PCM/mu-law frames, sample counts, pts, resampling, validation."""

from __future__ import annotations

import math

import numpy as np
import opuslib_next
import pytest
import soxr
from hypothesis import given, settings
from hypothesis import strategies as st

from realtime_engine.audio.encoder import OPUS_DEFAULT_BITRATE, AudioEncoder, EncodedFrame
from realtime_engine.audio.errors import AudioEncodeError, AudioFormatError
from realtime_engine.audio.framer import SampleFramer

RATE = 24000


def speech_like(sr: int = RATE, seconds: float = 2.0) -> np.ndarray:
    """Voiced harmonics under three formant bumps, 4 Hz syllables, a pause each second."""
    n = int(sr * seconds)
    t = np.arange(n) / sr
    f0 = 120 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / sr
    formants = [(700.0, 130.0), (1220.0, 70.0), (2600.0, 160.0)]
    sig = np.zeros(n)
    for k in range(1, int(sr / 2 / 200)):
        fk = k * f0
        amp = sum(np.exp(-0.5 * ((fk - f) / b) ** 2) for f, b in formants) + 0.05 / k
        sig += amp * np.sin(k * phase) * (fk < 0.45 * sr)
    envelope = 0.5 * (1 - np.cos(2 * np.pi * 4 * t))
    envelope[(t % 1.0) > 0.75] = 0.0
    sig *= envelope
    return (0.3 * sig / np.max(np.abs(sig))).astype(np.float32)


def split_random(x: np.ndarray, rng: np.random.Generator, max_chunk: int = 3000) -> list:
    cuts, pos = [], 0
    while pos < x.size:
        step = int(rng.integers(0, max_chunk))
        cuts.append(x[pos : pos + step])
        pos += step
    return cuts


def encode(enc: AudioEncoder, chunks: list) -> list[EncodedFrame]:
    frames: list[EncodedFrame] = []
    for chunk in chunks:
        frames += enc.feed(chunk)
    return frames + enc.finish()


def decode_opus(frames: list[EncodedFrame], sr: int, frame_samples: int) -> np.ndarray:
    dec = opuslib_next.Decoder(sr, 1)
    out = [np.frombuffer(dec.decode_float(f.payload, frame_samples), np.float32) for f in frames]
    return np.concatenate(out)


def snr_db(ref: np.ndarray, test: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(ref**2) / np.sum((ref - test) ** 2)))


def test_opus_round_trip_snr_at_default_bitrate() -> None:
    x = speech_like()
    enc = AudioEncoder("opus", RATE)
    frames = encode(enc, split_random(x, np.random.default_rng(1)))
    y = decode_opus(frames, RATE, enc.frame_samples)
    skip = enc.pre_skip_samples
    assert skip == opuslib_next.Encoder(RATE, 1, "audio").lookahead == 156
    aligned = y[skip : skip + x.size]
    assert aligned.size == x.size  # the lookahead flush lets the decoder reach the end
    assert snr_db(x, aligned) >= 20.0


def test_opus_sample_counts_and_packet_framing() -> None:
    n = 12345
    enc = AudioEncoder("opus", RATE)
    frames = encode(enc, [np.zeros(n, np.float32)])
    assert enc.frame_samples == 480
    assert len(frames) == math.ceil((n + enc.pre_skip_samples) / 480)
    assert all(f.samples == 480 and f.duration_ms == 20.0 for f in frames)
    for f in frames:
        toc = f.payload[0]
        assert toc & 0x03 == 0  # one frame per packet
        # Every packet decodes on its own (what WebCodecs AudioDecoder is given).
        pcm = opuslib_next.Decoder(RATE, 1).decode_float(f.payload, 480)
        assert len(pcm) == 480 * 4


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 2500), min_size=1, max_size=12),
    fmt_rate=st.sampled_from(
        [
            ("opus", 24000),
            ("pcm16", 24000),
            ("pcm_f32", 48000),
            ("mulaw", 8000),
            ("opus", 16000),
            ("pcm16", 16000),
        ]
    ),
)
def test_pts_continuous_and_independent_of_chunking(sizes: list[int], fmt_rate: tuple) -> None:
    fmt, sr = fmt_rate
    x = speech_like(RATE, 0.5)
    x = np.resize(x, sum(sizes))
    chunks, pos = [], 0
    for s in sizes:
        chunks.append(x[pos : pos + s])
        pos += s
    chunked = encode(AudioEncoder(fmt, sr), chunks)
    whole = encode(AudioEncoder(fmt, sr), [x])
    elapsed = 0
    for frame in chunked:
        assert frame.pts_ms == elapsed * 1000 // sr
        elapsed += frame.samples
    assert [f.pts_ms for f in chunked] == [f.pts_ms for f in whole]
    assert [f.payload for f in chunked] == [f.payload for f in whole]


@pytest.mark.parametrize("sr", [8000, 16000, 24000, 48000])
@pytest.mark.parametrize("fmt", ["pcm16", "pcm_f32"])
def test_pcm_exact_sample_count_and_no_padding(fmt: str, sr: int) -> None:
    n = 24000 + 7
    enc = AudioEncoder(fmt, sr)
    x = np.resize(speech_like(RATE, 1.0), n)
    frames = encode(enc, split_random(x, np.random.default_rng(2)))
    width = 2 if fmt == "pcm16" else 4
    total = sum(len(f.payload) for f in frames) // width
    assert total == sum(f.samples for f in frames) == round(n * sr / RATE)
    assert all(f.samples == sr // 50 for f in frames[:-1])
    assert frames[-1].samples <= sr // 50


def test_pcm_f32_is_lossless_at_model_rate() -> None:
    x = speech_like(RATE, 0.3)
    frames = encode(AudioEncoder("pcm_f32", RATE), split_random(x, np.random.default_rng(3)))
    y = np.frombuffer(b"".join(f.payload for f in frames), "<f4")
    np.testing.assert_array_equal(y, x)


def test_pcm16_matches_rounded_scaled_input() -> None:
    x = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -2.0, 1 / 65536], np.float32)
    frames = encode(AudioEncoder("pcm16", RATE), [x])
    y = np.frombuffer(b"".join(f.payload for f in frames), "<i2")
    assert y.tolist() == [0, 16384, -16384, 32767, -32768, 32767, -32768, 0]


@pytest.mark.parametrize("sr", [8000, 16000, 48000])
def test_resampled_pcm_matches_offline_resampling(sr: int) -> None:
    x = speech_like(RATE, 1.0)
    frames = encode(AudioEncoder("pcm_f32", sr), split_random(x, np.random.default_rng(sr)))
    y = np.frombuffer(b"".join(f.payload for f in frames), "<f4")
    ref = soxr.resample(x, RATE, sr, quality="HQ")
    assert y.size == ref.size
    np.testing.assert_allclose(y, ref, atol=1e-6)
    assert all(f.samples == sr // 50 for f in frames[:-1])


@pytest.mark.parametrize("sr", [8000, 16000, 48000])
def test_opus_at_resampled_rates(sr: int) -> None:
    x = speech_like(RATE, 2.0)
    enc = AudioEncoder("opus", sr)
    frames = encode(enc, split_random(x, np.random.default_rng(sr)))
    assert enc.frame_samples == sr // 50
    assert all(f.samples == sr // 50 and f.pts_ms == 20 * i for i, f in enumerate(frames))
    y = decode_opus(frames, sr, enc.frame_samples)
    ref = soxr.resample(x, RATE, sr, quality="HQ")
    skip = enc.pre_skip_samples
    # SILK and hybrid modes decode up to two samples earlier than the lookahead.
    best = max(snr_db(ref, y[lag : lag + ref.size]) for lag in range(skip - 2, skip + 1))
    assert best >= 20.0


def test_mulaw_payload_is_one_byte_per_sample_at_8k() -> None:
    x = speech_like(RATE, 0.5)
    frames = encode(AudioEncoder("mulaw", 8000), [x])
    assert [len(f.payload) for f in frames] == [160] * 25
    assert [f.pts_ms for f in frames] == list(range(0, 500, 20))


def test_custom_frame_ms_and_bitrate() -> None:
    enc = AudioEncoder("opus", 48000, frame_ms=60, bitrate=24000)
    frames = encode(enc, [speech_like(RATE, 0.5)])
    assert all(f.samples == 2880 and f.duration_ms == 60.0 for f in frames)
    assert [f.pts_ms for f in frames] == [60 * i for i in range(len(frames))]
    pcm = encode(AudioEncoder("pcm16", 16000, frame_ms=10), [np.zeros(2400, np.float32)])
    assert [f.samples for f in pcm] == [160] * 10


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"fmt": "mp3"}, "format"),
        ({"fmt": "pcm16", "sample_rate": 22050}, "sample_rate"),
        ({"fmt": "mulaw", "sample_rate": 24000}, "sample_rate"),
        ({"fmt": "opus", "frame_ms": 30}, "frame_ms"),
        ({"fmt": "pcm16", "frame_ms": 0}, "frame_ms"),
        ({"fmt": "opus", "bitrate": 1000}, "bitrate"),
    ],
)
def test_invalid_settings_name_the_param(kwargs: dict, param: str) -> None:
    with pytest.raises(AudioFormatError) as err:
        AudioEncoder(**kwargs)
    assert err.value.param == param


@pytest.mark.parametrize("fmt", ["opus", "pcm16", "mulaw"])
def test_a_stream_without_samples_has_no_frames(fmt: str) -> None:
    enc = AudioEncoder(fmt, 8000)
    assert enc.feed(np.zeros(0, np.float32)) == []
    assert enc.finish() == []
    assert enc.next_pts_ms == 0


def test_misuse_after_finish_and_bad_input() -> None:
    enc = AudioEncoder("pcm16")
    with pytest.raises(ValueError):
        enc.feed(np.zeros((2, 10), np.float32))
    with pytest.raises(ValueError):
        enc.feed(np.zeros(10, np.int16))
    enc.finish()
    with pytest.raises(AudioEncodeError):
        enc.feed(np.zeros(10, np.float32))
    with pytest.raises(AudioEncodeError):
        enc.finish()


def test_default_bitrates_are_within_opus_range() -> None:
    assert set(OPUS_DEFAULT_BITRATE) == {8000, 16000, 24000, 48000}


def test_framer_leftover_survives_the_caller_reusing_its_buffer() -> None:
    framer = SampleFramer(4)
    buffer = np.arange(6, dtype=np.float32)
    first = [f.copy() for f in framer.push(buffer)]
    buffer[:] = -1.0  # an engine refilling the array it yielded
    second = framer.push(np.arange(6, 8, dtype=np.float32))
    assert [f.tolist() for f in first + second] == [[0, 1, 2, 3], [4, 5, 6, 7]]


@pytest.mark.parametrize(
    ("fmt", "sr", "expected"),
    [
        ("opus", 24000, True),
        ("pcm16", 16000, True),
        ("pcm16", 24000, False),
        ("pcm_f32", 24000, False),
        ("mulaw", 8000, True),
    ],
)
def test_only_codec_or_resampling_work_is_worth_a_thread(fmt: str, sr: int, expected: bool) -> None:
    assert AudioEncoder(fmt, sr).worth_offloading is expected


@settings(max_examples=40, deadline=None)
@given(
    samples=st.lists(
        st.floats(-2.0, 2.0, width=32) | st.just(float("nan")), min_size=1, max_size=4000
    ),
    fmt_rate=st.sampled_from([("pcm16", 24000), ("pcm_f32", 24000), ("mulaw", 8000)]),
)
def test_pcm_frames_converted_together_equal_frames_converted_one_by_one(
    samples: list[float], fmt_rate: tuple[str, int]
) -> None:
    fmt, sr = fmt_rate
    x = np.array(samples, np.float32)
    whole = AudioEncoder(fmt, sr)
    together = whole.feed(x) + whole.finish()
    single = AudioEncoder(fmt, sr)
    step = single.frame_samples * RATE // sr  # one output frame of input per feed
    one_by_one = [f for i in range(0, x.size, step) for f in single.feed(x[i : i + step])]
    one_by_one += single.finish()
    assert [f.payload for f in together] == [f.payload for f in one_by_one]
    assert [f.samples for f in together] == [f.samples for f in one_by_one]


@pytest.mark.parametrize("frame_ms", [20, 60])
def test_opus_packets_equal_the_reference_wrapper_packets(frame_ms: int) -> None:
    x = speech_like(RATE, 0.7)
    enc = AudioEncoder("opus", RATE, frame_ms=frame_ms)
    ours = [f.payload for f in enc.feed(x) + enc.finish()]
    reference = opuslib_next.Encoder(RATE, 1, "audio")
    reference.bitrate = OPUS_DEFAULT_BITRATE[RATE]
    reference.complexity = 5
    n = enc.frame_samples
    padded = np.concatenate([x, np.zeros(enc.pre_skip_samples, np.float32)])
    padded = np.concatenate([padded, np.zeros(-padded.size % n, np.float32)])
    theirs = [
        bytes(reference.encode_float(padded[i : i + n].tobytes(), n))
        for i in range(0, padded.size, n)
    ]
    assert ours == theirs
