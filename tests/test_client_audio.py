"""SDK audio helpers: μ-law against the standard library, Opus TOC durations
against real libopus packets, WAV round trips, URL building."""

from __future__ import annotations

import warnings

import numpy as np
import opuslib_next as opuslib
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.client import (
    MULAW_TO_PCM16,
    ProtocolViolationError,
    make_decoder,
    opus_packet_duration_ms,
    payload_duration_ms,
    read_wav,
    realtime_url,
    to_wav,
)

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop


def test_mulaw_table_matches_stdlib_for_every_byte() -> None:
    every_byte = bytes(range(256))
    expected = np.frombuffer(audioop.ulaw2lin(every_byte, 2), dtype="<i2")
    assert np.array_equal(MULAW_TO_PCM16, expected)


def test_mulaw_known_points() -> None:
    assert MULAW_TO_PCM16[0xFF] == 0 and MULAW_TO_PCM16[0x7F] == 0
    assert MULAW_TO_PCM16[0x80] == 32124 and MULAW_TO_PCM16[0x00] == -32124


@given(st.lists(st.integers(-32768, 32767), max_size=200))
def test_pcm16_decoder_is_exact(samples: list[int]) -> None:
    payload = np.asarray(samples, dtype="<i2").tobytes()
    out = make_decoder("pcm16", 24000).decode(payload)
    assert out.dtype == np.float32
    assert np.array_equal(out * 32768.0, np.asarray(samples, dtype=np.float32))
    assert payload_duration_ms("pcm16", 24000, payload) == len(samples) / 24.0


@given(st.lists(st.floats(-1, 1, width=32), max_size=200))
def test_f32_decoder_is_exact(samples: list[float]) -> None:
    payload = np.asarray(samples, dtype="<f4").tobytes()
    assert np.array_equal(
        make_decoder("pcm_f32", 16000).decode(payload), np.asarray(samples, dtype=np.float32)
    )


def test_odd_pcm_payload_is_a_protocol_violation() -> None:
    with pytest.raises(ProtocolViolationError):
        make_decoder("pcm16", 24000).decode(b"\x00\x01\x02")
    with pytest.raises(ProtocolViolationError):
        make_decoder("pcm_f32", 24000).decode(b"\x00\x01\x02")
    with pytest.raises(ValueError):
        make_decoder("flac", 24000)


@pytest.mark.parametrize("rate", [8000, 16000, 24000, 48000])
@pytest.mark.parametrize("frame_ms", [10, 20, 40, 60])
def test_opus_duration_and_decode_of_real_packets(rate: int, frame_ms: int) -> None:
    encoder = opuslib.Encoder(rate, 1, opuslib.APPLICATION_AUDIO)
    n = rate * frame_ms // 1000
    tone = (0.3 * np.sin(2 * np.pi * 440 * np.arange(n) / rate) * 32767).astype("<i2")
    packet = encoder.encode(tone.tobytes(), n)
    assert opus_packet_duration_ms(packet) == frame_ms
    decoded = make_decoder("opus", rate).decode(packet)
    assert decoded.dtype == np.float32 and len(decoded) == n


@pytest.mark.parametrize(
    ("packet", "ms"),
    [
        (bytes([(31 << 3) | 0]), 20.0),  # CELT FB 20 ms, one frame
        (bytes([(28 << 3) | 1]), 5.0),  # CELT FB 2.5 ms, two frames
        (bytes([(3 << 3) | 2]), 120.0),  # SILK NB 60 ms, two frames
        (bytes([(13 << 3) | 3, 3]), 60.0),  # hybrid SWB 20 ms, three frames
        (bytes([(0 << 3) | 0]), 10.0),  # SILK NB 10 ms
    ],
)
def test_opus_toc_table(packet: bytes, ms: float) -> None:
    assert opus_packet_duration_ms(packet) == ms


def test_corrupt_opus_is_a_protocol_violation() -> None:
    with pytest.raises(ProtocolViolationError):
        opus_packet_duration_ms(b"")
    with pytest.raises(ProtocolViolationError):
        make_decoder("opus", 24000).decode(b"\xff\xff\xff")


@given(st.lists(st.integers(-32767, 32767), max_size=500), st.sampled_from([8000, 24000, 48000]))
def test_wav_round_trip(samples: list[int], rate: int) -> None:
    pcm = np.asarray(samples, dtype=np.float32) / 32767.0
    back, back_rate = read_wav(to_wav(pcm, rate))
    assert back_rate == rate
    assert np.array_equal(np.round(back * 32768.0), np.asarray(samples, dtype=np.float32))


@pytest.mark.parametrize(
    ("url", "kwargs", "expected"),
    [
        ("http://h:8000", {}, "ws://h:8000/v1/realtime"),
        ("https://h", {}, "wss://h/v1/realtime"),
        ("ws://h:1/", {"model": "m"}, "ws://h:1/v1/realtime?model=m"),
        ("ws://h:1/v1/realtime?x=1", {"token": "t k"}, "ws://h:1/v1/realtime?x=1&token=t+k"),
    ],
)
def test_realtime_url(url: str, kwargs: dict[str, str], expected: str) -> None:
    assert realtime_url(url, **kwargs) == expected


def test_realtime_url_rejects_other_schemes() -> None:
    with pytest.raises(ValueError):
        realtime_url("ftp://h")
