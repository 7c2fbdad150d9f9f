"""Per-stream audio encoder for WebSocket output: Opus packets, PCM or mu-law frames.

``AudioEncoder`` takes float32 mono PCM at the model rate (24 kHz) in chunks of
any size, resamples when the output rate differs, cuts fixed frames
(``frame_ms``, 20 ms by default) and encodes each one. Every frame carries its
``pts_ms`` on the stream's timeline: the total duration of the frames before
it, so the timeline has no gaps and does not depend on how input was chunked.

Opus specifics (measured choices, see docs/audio.md):

* ``application=audio``: on a harmonic speech-like signal it keeps 3-6 dB more
  waveform SNR than ``voip`` at equal bitrate; ``voip`` high-passes and
  enhances, which suits microphones, not a clean synthetic voice.
* Default bitrate 64 kb/s at 24/48 kHz (CELT mode: about 25 dB SNR and about
  50 kb/s actually spent with VBR), 48 kb/s at 16 kHz, 32 kb/s at 8 kHz (both
  about 24 dB); complexity 5, under 0.1 ms per 20 ms packet at 24 kHz with
  no SNR loss against 10 (at 16 kHz and 32 kb/s it would lose 9 dB, hence
  the higher wideband default).
* Encoder delay: a decoder's output lags the input by ``pre_skip_samples``
  (``OPUS_GET_LOOKAHEAD``: 156 samples = 6.5 ms at 24 kHz). Packets keep
  their plain timeline (packet n starts at ``n * frame_ms``); ``finish`` feeds
  ``pre_skip_samples`` of silence before padding the last packet, so the
  decoded stream holds all of the input; a client wanting sample alignment
  drops the first ``pre_skip_samples`` decoded samples (what Ogg's pre-skip
  does). Each packet is a plain Opus packet that WebCodecs ``AudioDecoder``
  (codec "opus", no description) decodes on its own.

PCM specifics: ``pcm16`` is s16le, ``pcm_f32`` is f32le, ``mulaw`` is G.711
at 8 kHz only. PCM frames are not padded: the last frame may be shorter, so
the output has exactly ``round(n * sample_rate / 24000)`` samples.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import opuslib_next
import opuslib_next.api.encoder

from realtime_engine.audio.errors import AudioEncodeError, AudioFormatError, UnsupportedFormatError
from realtime_engine.audio.framer import SampleFramer
from realtime_engine.audio.pcm import FloatArray, as_mono_float32, float_to_mulaw, float_to_s16
from realtime_engine.audio.resample import StreamingResampler
from realtime_engine.format import SAMPLE_RATE as MODEL_SAMPLE_RATE

OUTPUT_FORMATS = ("opus", "pcm16", "pcm_f32", "mulaw")
OUTPUT_SAMPLE_RATES = (8000, 16000, 24000, 48000)
MULAW_SAMPLE_RATE = 8000
DEFAULT_FRAME_MS = 20
OPUS_FRAME_MS = (10, 20, 40, 60)
PCM_MAX_FRAME_MS = 1000
OPUS_DEFAULT_BITRATE = {8000: 32000, 16000: 48000, 24000: 64000, 48000: 64000}
OPUS_MIN_BITRATE, OPUS_MAX_BITRATE = 6000, 510000
OPUS_COMPLEXITY = 5

_opus_encode_float: Any = opuslib_next.api.encoder.libopus_encode_float
_FLOAT_POINTER = ctypes.POINTER(ctypes.c_float)


@dataclass(frozen=True)
class EncodedFrame:
    payload: bytes
    pts_ms: int
    duration_ms: float
    samples: int


class _FrameCodec(Protocol):
    pre_skip_samples: int
    pad_last_frame: bool

    def encode(self, frame: FloatArray) -> bytes: ...

    def encode_frames(self, frames: list[FloatArray]) -> list[bytes]: ...


class _OpusCodec:
    pad_last_frame = True

    def __init__(self, sample_rate: int, frame_samples: int, bitrate: int) -> None:
        try:
            self._encoder = opuslib_next.Encoder(sample_rate, 1, "audio")
            self._encoder.bitrate = bitrate
            self._encoder.complexity = OPUS_COMPLEXITY
            self.pre_skip_samples = int(self._encoder.lookahead)
        except opuslib_next.OpusError as e:
            raise AudioEncodeError(f"cannot create an Opus encoder: {e}") from e
        self._frame_samples = frame_samples
        # libopus is called directly with the frame's own memory and one reused
        # output buffer: the wrapper's per-call copies and allocations hold the
        # GIL the event loop needs. The packet budget is the wrapper's (the
        # input's size in bytes), so packets are the same.
        self._max_bytes = frame_samples * 4
        self._packet = (ctypes.c_char * self._max_bytes)()

    def encode(self, frame: FloatArray) -> bytes:
        pcm = np.ascontiguousarray(frame, dtype=np.float32)
        if pcm.size != self._frame_samples:
            raise AudioEncodeError(f"an Opus frame holds {self._frame_samples} samples")
        size = int(
            _opus_encode_float(
                self._encoder.encoder_state,
                pcm.ctypes.data_as(_FLOAT_POINTER),
                self._frame_samples,
                self._packet,
                self._max_bytes,
            )
        )
        if size < 0:
            raise AudioEncodeError(f"Opus encoding failed: {opuslib_next.OpusError(size)}")
        return ctypes.string_at(self._packet, size)

    def encode_frames(self, frames: list[FloatArray]) -> list[bytes]:
        return [self.encode(frame) for frame in frames]


class _PcmCodec:
    pad_last_frame = False
    pre_skip_samples = 0

    def __init__(self, fmt: str) -> None:
        self._fmt = fmt
        self._bytes_per_sample = {"pcm16": 2, "pcm_f32": 4}.get(fmt, 1)

    def encode(self, frame: FloatArray) -> bytes:
        out: npt.NDArray[np.generic]
        if self._fmt == "pcm16":
            out = float_to_s16(frame).astype("<i2", copy=False)
        elif self._fmt == "pcm_f32":
            out = frame.astype("<f4")
        else:
            out = float_to_mulaw(frame)
        return out.tobytes()

    def encode_frames(self, frames: list[FloatArray]) -> list[bytes]:
        """Every frame's bytes from one conversion of the frames joined.

        The conversion is per sample, so this is exactly the frame-by-frame
        result; it saves a handful of array operations per frame.
        """
        if len(frames) < 2:
            return [self.encode(frame) for frame in frames]
        raw = self.encode(np.concatenate(frames))
        payloads, start = [], 0
        for frame in frames:
            end = start + frame.size * self._bytes_per_sample
            payloads.append(raw[start:end])
            start = end
        return payloads


def validate_output(fmt: str, sample_rate: int, frame_ms: int = DEFAULT_FRAME_MS) -> None:
    """Raise ``AudioFormatError`` (with ``param``) unless the combination is producible."""
    if fmt not in OUTPUT_FORMATS:
        raise UnsupportedFormatError(
            f"unknown output format {fmt!r}; supported: {', '.join(OUTPUT_FORMATS)}",
            param="format",
        )
    if sample_rate not in OUTPUT_SAMPLE_RATES:
        raise AudioFormatError(
            f"sample_rate {sample_rate} not supported; use one of {OUTPUT_SAMPLE_RATES}",
            param="sample_rate",
        )
    if fmt == "mulaw" and sample_rate != MULAW_SAMPLE_RATE:
        raise AudioFormatError("mulaw is G.711 and only exists at 8000 Hz", param="sample_rate")
    if isinstance(frame_ms, bool) or not isinstance(frame_ms, int):
        raise AudioFormatError("frame_ms must be an integer", param="frame_ms")
    if fmt == "opus" and frame_ms not in OPUS_FRAME_MS:
        raise AudioFormatError(
            f"Opus frame_ms must be one of {OPUS_FRAME_MS}, got {frame_ms}", param="frame_ms"
        )
    if not 1 <= frame_ms <= PCM_MAX_FRAME_MS:
        raise AudioFormatError(
            f"frame_ms must be within 1..{PCM_MAX_FRAME_MS}, got {frame_ms}", param="frame_ms"
        )


class AudioEncoder:
    """One stream's encoder: ``feed`` PCM chunks, then ``finish`` once."""

    def __init__(
        self,
        fmt: str,
        sample_rate: int = MODEL_SAMPLE_RATE,
        *,
        frame_ms: int = DEFAULT_FRAME_MS,
        input_rate: int = MODEL_SAMPLE_RATE,
        bitrate: int | None = None,
    ) -> None:
        validate_output(fmt, sample_rate, frame_ms)
        self.format = fmt
        self.sample_rate = sample_rate
        self.frame_ms = frame_ms
        self.frame_samples = sample_rate * frame_ms // 1000
        self._resampler = StreamingResampler(input_rate, sample_rate)
        self._framer = SampleFramer(self.frame_samples)
        self._codec: _FrameCodec
        if fmt == "opus":
            rate = OPUS_DEFAULT_BITRATE[sample_rate] if bitrate is None else bitrate
            if not OPUS_MIN_BITRATE <= rate <= OPUS_MAX_BITRATE:
                raise AudioFormatError(
                    f"Opus bitrate must be within {OPUS_MIN_BITRATE}..{OPUS_MAX_BITRATE}",
                    param="bitrate",
                )
            self._codec = _OpusCodec(sample_rate, self.frame_samples, rate)
        else:
            self._codec = _PcmCodec(fmt)
        self._samples_out = 0
        self._fed_samples = 0
        self._finished = False

    @property
    def worth_offloading(self) -> bool:
        """Whether encoding a long chunk costs more than handing it to a worker thread.

        Opus and resampling spend real time in C (with the GIL released); PCM
        framing at the input rate is a few array operations, cheaper than the
        event loop's share of a thread hop (submit, wake-up, result callback).
        """
        return self.format == "opus" or not self._resampler.passthrough

    @property
    def pre_skip_samples(self) -> int:
        """Decoded samples at the start of the stream that are codec delay, not input."""
        return self._codec.pre_skip_samples

    @property
    def pre_skip_ms(self) -> float:
        return self._codec.pre_skip_samples * 1000.0 / self.sample_rate

    @property
    def next_pts_ms(self) -> int:
        """pts of the next frame; after ``finish``, the stream's total duration (floored)."""
        return self._samples_out * 1000 // self.sample_rate

    @property
    def finished(self) -> bool:
        return self._finished

    def feed(self, pcm: npt.ArrayLike) -> list[EncodedFrame]:
        if self._finished:
            raise AudioEncodeError("feed() after finish()")
        pcm = as_mono_float32(pcm)
        self._fed_samples += pcm.size
        samples = self._resampler.feed(pcm)
        return self._encode_all(self._framer.push(samples))

    def finish(self) -> list[EncodedFrame]:
        """Encode what is buffered (the last frame padded for Opus); the stream ends.

        A stream that was never fed any samples ends with no frames at all.
        """
        if self._finished:
            raise AudioEncodeError("finish() called twice")
        self._finished = True
        frames = self._framer.push(self._resampler.finish())
        if self._codec.pre_skip_samples and self._fed_samples:
            # Push the encoder's lookahead out so the decoder sees the last input samples.
            tail = np.zeros(self._codec.pre_skip_samples, dtype=np.float32)
            frames += self._framer.push(tail)
        frames += self._framer.drain(pad_to_frame=self._codec.pad_last_frame)
        return self._encode_all(frames)

    def _encode_all(self, frames: list[FloatArray]) -> list[EncodedFrame]:
        out = []
        for frame, payload in zip(frames, self._codec.encode_frames(frames), strict=True):
            pts_ms = self.next_pts_ms
            out.append(
                EncodedFrame(
                    payload=payload,
                    pts_ms=pts_ms,
                    duration_ms=frame.size * 1000.0 / self.sample_rate,
                    samples=int(frame.size),
                )
            )
            self._samples_out += frame.size
        return out
