"""Reference clips for voice cloning: inline bytes only, decoded and checked.

Reference audio is only ever taken from the request's own bytes (base64 or a
``data:`` URI): anything that looks like a path or a URL is refused, so a
request can never make the server read its own files or reach the network.
Clips are decoded with PyAV to mono float32 at 24 kHz; the limits (length,
sample rate, sample format, finite samples) fail with a ``ReferenceAudioError``
that names the field.
"""

from __future__ import annotations

import io
import math

import av
import numpy as np

from gateway.protocol import decode_audio_payload
from realtime_engine.format import FRAME_SAMPLES as CODEC_FRAME_SAMPLES
from realtime_engine.format import SAMPLE_RATE as CLIP_SAMPLE_RATE

MAX_TRANSCRIPT_CHARS = 2_000
MIN_REFERENCE_SECONDS = 1.0  # the codec encoder needs at least 1 s
# Sources above this rate cost more to decode than they can add to a 24 kHz voice.
MAX_SOURCE_RATE = 48_000
# 8-bit PCM is too coarse for a voice reference (48 dB of dynamic range).
REFUSED_SAMPLE_FORMATS = frozenset({"u8", "u8p"})


class VoiceError(ValueError):
    """A voice request cannot be served; ``param`` names the offending field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ReferenceAudioError(VoiceError):
    """Reference audio is not inline data, cannot be decoded, or breaks a limit."""


class ReferenceClip:
    """Decoded reference audio: mono float32 at ``CLIP_SAMPLE_RATE``."""

    def __init__(self, pcm: np.ndarray, sample_rate: int = CLIP_SAMPLE_RATE) -> None:
        self.pcm = pcm
        self.sample_rate = sample_rate

    @property
    def duration_s(self) -> float:
        return self.pcm.size / self.sample_rate

    @property
    def frames(self) -> int:
        return math.ceil(self.pcm.size * CLIP_SAMPLE_RATE / self.sample_rate / CODEC_FRAME_SAMPLES)


def reference_bytes(value: str, param: str = "audio") -> bytes:
    """The bytes of inline reference audio (``gateway.protocol.decode_audio_payload``).

    Paths and URLs are refused outright; nothing is ever read from disk or
    fetched.
    """
    try:
        return decode_audio_payload(value, param)
    except ValueError as e:
        raise ReferenceAudioError(str(e), param) from e


def _check_stream(stream: av.audio.stream.AudioStream, param: str) -> None:
    ctx = stream.codec_context
    rate = ctx.sample_rate or stream.rate or 0
    if rate > MAX_SOURCE_RATE:
        raise ReferenceAudioError(
            f"'{param}' is sampled at {rate} Hz; references may be at most {MAX_SOURCE_RATE} Hz",
            param,
        )
    fmt = ctx.format.name if ctx.format is not None else ""
    if fmt in REFUSED_SAMPLE_FORMATS:
        raise ReferenceAudioError(
            f"'{param}' is 8-bit audio, too coarse for a voice reference; "
            "send 16-bit PCM or better",
            param,
        )


def decode_clip(
    data: bytes,
    max_seconds: float,
    param: str = "audio",
    min_seconds: float = 0.0,
) -> ReferenceClip:
    """Decode wav/flac/ogg/mp3 bytes to mono float32 at 24 kHz (blocking: run off the loop).

    Stereo is mixed down; decoding stops as soon as the clip passes
    ``max_seconds``, so a very long upload costs no more than the limit.
    """
    max_samples = int(max_seconds * CLIP_SAMPLE_RATE)
    pieces: list[np.ndarray] = []
    total = 0
    too_long = ReferenceAudioError(
        f"'{param}' is longer than the {max_seconds:g} s allowed for a reference", param
    )
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.audio:
                raise ReferenceAudioError(f"'{param}' has no audio stream", param)
            stream = container.streams.audio[0]
            _check_stream(stream, param)
            resampler = av.AudioResampler(format="flt", layout="mono", rate=CLIP_SAMPLE_RATE)
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    pieces.append(out.to_ndarray().reshape(-1))
                    total += pieces[-1].size
                if total > max_samples:
                    raise too_long
            for out in resampler.resample(None):
                pieces.append(out.to_ndarray().reshape(-1))
    except av.FFmpegError as e:
        raise ReferenceAudioError(f"'{param}' could not be decoded as audio: {e}", param) from e
    pcm = np.concatenate(pieces).astype(np.float32) if pieces else np.zeros(0, np.float32)
    if pcm.size == 0:
        raise ReferenceAudioError(f"'{param}' decodes to no audio", param)
    if pcm.size > max_samples:
        raise too_long
    if not np.isfinite(pcm).all():
        raise ReferenceAudioError(f"'{param}' has NaN or infinite samples", param)
    if pcm.size < min_seconds * CLIP_SAMPLE_RATE:
        raise ReferenceAudioError(
            f"'{param}' is {pcm.size / CLIP_SAMPLE_RATE:.2f} s long; "
            f"a reference needs at least {min_seconds:g} s",
            param,
        )
    return ReferenceClip(pcm)
