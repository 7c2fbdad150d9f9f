"""Sample conversions: G.711 mu-law (exhaustive over s16) and float <-> s16."""

from __future__ import annotations

import av
import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from realtime_engine.audio.pcm import (
    float_to_s16,
    mulaw_to_s16,
    s16_to_float,
    s16_to_mulaw,
)

ALL_S16 = np.arange(-32768, 32768, dtype=np.int32).astype(np.int16)


def ffmpeg_mulaw(codec_dir: str, data: np.ndarray) -> np.ndarray:
    if codec_dir == "w":
        ctx = av.CodecContext.create("pcm_mulaw", "w")
        ctx.sample_rate, ctx.layout, ctx.format = 8000, "mono", "s16"
        ctx.open()
        frame = av.AudioFrame.from_ndarray(data.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = 8000
        return np.frombuffer(b"".join(bytes(p) for p in ctx.encode(frame)), np.uint8)
    dec = av.CodecContext.create("pcm_mulaw", "r")
    dec.sample_rate, dec.layout = 8000, "mono"
    return np.concatenate([f.to_ndarray().ravel() for f in dec.decode(av.Packet(data.tobytes()))])


def test_mulaw_decoder_matches_ffmpeg_for_every_code() -> None:
    codes = np.arange(256, dtype=np.uint8)
    np.testing.assert_array_equal(mulaw_to_s16(codes), ffmpeg_mulaw("r", codes))


def test_mulaw_round_trip_error_within_half_a_step_everywhere() -> None:
    codes = s16_to_mulaw(ALL_S16)
    decoded = mulaw_to_s16(codes).astype(np.int32)
    x = ALL_S16.astype(np.int32)
    err = np.abs(decoded - x)
    # Step size doubles per segment: 8 (in 16-bit units) near zero up to 1024 at the top;
    # the decoder returns mid-step values and the coder drops 2 LSBs first (hence +3).
    # The top code saturates at 32124.
    segment = ((~codes.astype(np.int32)) & 0x70) >> 4
    step = 8 * 2**segment
    clipped = np.abs(x) > 32124
    assert np.all(err[~clipped] <= step[~clipped] / 2 + 3)
    assert np.all(np.abs(decoded[clipped]) == 32124)
    # Relative error is what mu-law buys: under 7 % (about 24 dB) above the lowest segment.
    big = np.abs(x) > 256
    assert np.max(err[big] / np.abs(x[big])) < 0.07


def test_mulaw_encoder_agrees_with_ffmpeg_except_at_segment_edges() -> None:
    ours = s16_to_mulaw(ALL_S16)
    theirs = ffmpeg_mulaw("w", ALL_S16)
    differ = ours != theirs
    assert differ.mean() < 0.01
    # Where they differ both codes decode within one step of the input.
    x = ALL_S16[differ].astype(np.int32)
    for codes in (ours[differ], theirs[differ]):
        assert np.all(np.abs(mulaw_to_s16(codes).astype(np.int32) - x) <= 1024)


def test_mulaw_is_monotonic_and_sign_symmetric() -> None:
    decoded = mulaw_to_s16(s16_to_mulaw(ALL_S16)).astype(np.int32)
    assert np.all(np.diff(decoded) >= 0)
    assert mulaw_to_s16(s16_to_mulaw(np.array([0], np.int16)))[0] == 0


def test_float_s16_round_trip() -> None:
    np.testing.assert_array_equal(float_to_s16(s16_to_float(ALL_S16)), ALL_S16)
    edge = np.array([np.nan, np.inf, -np.inf, 1.5, -1.5], np.float32)
    assert float_to_s16(edge).tolist() == [0, 32767, -32768, 32767, -32768]


def _float_to_s16_reference(pcm: np.ndarray) -> np.ndarray:
    """The textbook formula the fast in-place conversion must match bit for bit."""
    with np.errstate(over="ignore"):  # huge inputs overflow to inf, then clip
        scaled = np.rint(np.nan_to_num(pcm, nan=0.0) * 32768.0)
    return np.clip(scaled, -32768, 32767).astype(np.int16)


@given(
    hnp.arrays(
        np.float32,
        hnp.array_shapes(max_dims=1, max_side=300),
        elements=st.floats(width=32, allow_nan=True, allow_infinity=True),
    )
)
def test_float_to_s16_matches_the_reference_formula(pcm: np.ndarray) -> None:
    np.testing.assert_array_equal(float_to_s16(pcm), _float_to_s16_reference(pcm))


def test_float_to_s16_matches_the_reference_on_every_half_step() -> None:
    # Every value k/65536 in [-1.5, 1.5]: all rounding ties and both clip edges.
    halves = (np.arange(-3 * 32768, 3 * 32768 + 1, dtype=np.float64) / 65536).astype(np.float32)
    np.testing.assert_array_equal(float_to_s16(halves), _float_to_s16_reference(halves))
