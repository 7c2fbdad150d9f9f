"""Decoding helpers for the audio the gateway sends: Opus, PCM16, float32, μ-law.

Every decoder turns one frame payload into float32 mono samples in [-1, 1].
Also: the exact duration of an Opus packet from its TOC byte (no decoding
needed) and a WAV writer for whole utterances.
"""

from __future__ import annotations

import io
import wave
from typing import Any, Protocol

import numpy as np

from gateway.client.errors import ClientError, ProtocolViolationError


class FrameDecoder(Protocol):
    sample_rate: int

    def decode(self, payload: bytes) -> np.ndarray:
        """Float32 mono samples of one frame payload."""
        ...


def pcm16_to_float(payload: bytes) -> np.ndarray:
    if len(payload) % 2:
        raise ProtocolViolationError(f"pcm16 payload of odd length {len(payload)}")
    return np.frombuffer(payload, dtype="<i2").astype(np.float32) / 32768.0


def f32_to_float(payload: bytes) -> np.ndarray:
    if len(payload) % 4:
        raise ProtocolViolationError(f"pcm_f32 payload of length {len(payload)}, not 4k")
    return np.frombuffer(payload, dtype="<f4").astype(np.float32)


def _mulaw_table() -> np.ndarray:
    # G.711 μ-law expansion: the byte is stored inverted; 3-bit exponent,
    # 4-bit mantissa, bias 0x84 (132); output in 16-bit linear units.
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    exponent = (u >> 4) & 0x07
    mantissa = u & 0x0F
    magnitude = (((mantissa << 3) + 0x84) << exponent) - 0x84
    linear = np.where(u & 0x80, -magnitude, magnitude)
    return linear.astype(np.int16)


MULAW_TO_PCM16: np.ndarray = _mulaw_table()


def mulaw_to_float(payload: bytes) -> np.ndarray:
    codes = np.frombuffer(payload, dtype=np.uint8)
    return MULAW_TO_PCM16[codes].astype(np.float32) / 32768.0


class PcmDecoder:
    def __init__(self, fmt: str, sample_rate: int) -> None:
        self.sample_rate = sample_rate
        self._convert = {"pcm16": pcm16_to_float, "pcm_f32": f32_to_float, "mulaw": mulaw_to_float}[
            fmt
        ]

    def decode(self, payload: bytes) -> np.ndarray:
        return self._convert(payload)


def _opuslib() -> Any:
    """opuslib_next, imported on first use: it loads the system libopus, which
    PCM and mu-law streams never need."""
    try:
        import opuslib_next
    except Exception as e:  # no libopus: opuslib raises a bare Exception
        raise ClientError(
            f"decoding Opus needs libopus (apt install libopus0), or ask for pcm16: {e}"
        ) from e
    return opuslib_next


class OpusDecoder:
    """One libopus decoder per stream (Opus packets depend on their predecessors)."""

    def __init__(self, sample_rate: int) -> None:
        self.sample_rate = sample_rate
        self._decoder = _opuslib().Decoder(sample_rate, 1)
        self._max_samples = sample_rate * 120 // 1000  # the longest Opus packet: 120 ms

    def decode(self, payload: bytes) -> np.ndarray:
        try:
            raw = self._decoder.decode_float(payload, self._max_samples)
        except _opuslib().OpusError as e:
            raise ProtocolViolationError(f"undecodable Opus packet: {e}") from e
        return np.frombuffer(raw, dtype=np.float32).copy()


def make_decoder(fmt: str, sample_rate: int) -> FrameDecoder:
    if fmt == "opus":
        return OpusDecoder(sample_rate)
    if fmt in ("pcm16", "pcm_f32", "mulaw"):
        return PcmDecoder(fmt, sample_rate)
    raise ValueError(f"unknown audio format {fmt!r}")


# Frame length in ms of each of the 32 TOC configurations (RFC 6716, 3.1).
_OPUS_FRAME_MS = (
    [10.0, 20.0, 40.0, 60.0] * 3  # SILK NB / MB / WB
    + [10.0, 20.0] * 2  # hybrid SWB / FB
    + [2.5, 5.0, 10.0, 20.0] * 4  # CELT NB / WB / SWB / FB
)


def opus_packet_duration_ms(packet: bytes) -> float:
    """Audio duration of one Opus packet, read from its TOC byte (RFC 6716, 3.1)."""
    if not packet:
        raise ProtocolViolationError("empty Opus packet")
    toc = packet[0]
    code = toc & 0x03
    if code == 0:
        frames = 1
    elif code in (1, 2):
        frames = 2
    else:
        if len(packet) < 2:
            raise ProtocolViolationError("Opus code-3 packet without a frame count")
        frames = packet[1] & 0x3F
    return frames * _OPUS_FRAME_MS[toc >> 3]


def payload_duration_ms(fmt: str, sample_rate: int, payload: bytes) -> float:
    """Audio duration carried by one frame payload of ``fmt``."""
    if fmt == "opus":
        return opus_packet_duration_ms(payload)
    width = {"pcm16": 2, "pcm_f32": 4, "mulaw": 1}[fmt]
    return len(payload) / width * 1000.0 / sample_rate


def to_wav(pcm: np.ndarray, sample_rate: int) -> bytes:
    """16-bit mono WAV of float samples (clipped to [-1, 1])."""
    ints = (np.clip(np.asarray(pcm, dtype=np.float32), -1.0, 1.0) * 32767.0).round()
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(ints.astype("<i2").tobytes())
    return buf.getvalue()


def read_wav(data: bytes) -> tuple[np.ndarray, int]:
    """Float32 mono samples and sample rate of a 16-bit PCM WAV."""
    with wave.open(io.BytesIO(data), "rb") as w:
        if w.getsampwidth() != 2:
            raise ValueError(f"expected 16-bit WAV, got {8 * w.getsampwidth()}-bit")
        frames = w.readframes(w.getnframes())
        channels = w.getnchannels()
        rate = w.getframerate()
    pcm = np.frombuffer(frames, dtype="<i2").astype(np.float32) / 32768.0
    if channels > 1:
        pcm = pcm.reshape(-1, channels).mean(axis=1)
    return pcm, rate
