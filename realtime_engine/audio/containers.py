"""Whole-response audio containers for ``POST /v1/audio/speech``.

``ContainerEncoder(fmt, sample_rate, streaming)`` takes float32 mono PCM at the
model rate in chunks and returns bytes to send. Formats:

* ``wav``: 16-bit mono PCM in RIFF/WAVE, written here. Streamed, the header
  goes out first with 0xFFFFFFFF in both size fields (the length is not known
  yet; players read to the end). Not streamed, the file has its real sizes.
* ``pcm``: raw s16le, no header.
* ``opus`` (Ogg Opus), ``flac``, ``mp3``, ``aac`` (ADTS): muxed by PyAV (the
  FFmpeg libraries bundled with its wheel: libopus, the native FLAC encoder,
  libmp3lame, the native AAC encoder) into an in-memory sink that is drained
  after each chunk. Streamed, the sink is not seekable, so muxers never go back
  to patch headers (FLAC's STREAMINFO then says "length unknown"); Ogg pages
  are closed every 20 ms so audio leaves as soon as it is encoded. Not
  streamed, a seekable buffer lets the muxers write exact lengths.

With ``streaming=False`` ``feed`` returns nothing and ``finish`` the whole file.
"""

from __future__ import annotations

import io
import struct
from typing import Protocol

import av
import numpy.typing as npt

from realtime_engine.audio.encoder import MODEL_SAMPLE_RATE, OUTPUT_SAMPLE_RATES
from realtime_engine.audio.errors import AudioEncodeError, AudioFormatError, UnsupportedFormatError
from realtime_engine.audio.pcm import FloatArray, as_mono_float32, float_to_s16
from realtime_engine.audio.resample import StreamingResampler

CONTAINER_FORMATS = ("wav", "pcm", "opus", "flac", "mp3", "aac")
CONTENT_TYPES = {
    "wav": "audio/wav",
    "pcm": "audio/pcm",
    "opus": "audio/ogg; codecs=opus",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "aac": "audio/aac",
}
# (muxer, encoder, default bit rate in b/s or None for lossless)
_PYAV_FORMATS: dict[str, tuple[str, str, int | None]] = {
    "opus": ("ogg", "libopus", 64000),
    "flac": ("flac", "flac", None),
    "mp3": ("mp3", "libmp3lame", 64000),
    "aac": ("adts", "aac", 64000),
}
_OGG_PAGE_US = 20000
_UNKNOWN_SIZE = 0xFFFFFFFF


def _pyav_encoder_available(codec: str) -> bool:
    try:
        av.codec.Codec(codec, "w")
    except (av.error.FFmpegError, ValueError):
        # PyAV reports an unknown codec as a ValueError subclass (UnknownCodecError).
        return False
    return True


def supported_container_formats() -> tuple[str, ...]:
    """The formats this installation can produce (PyAV builds may lack an encoder)."""
    return tuple(
        fmt
        for fmt in CONTAINER_FORMATS
        if fmt not in _PYAV_FORMATS or _pyav_encoder_available(_PYAV_FORMATS[fmt][1])
    )


def wav_header(sample_rate: int, data_bytes: int | None) -> bytes:
    """44-byte header of 16-bit mono PCM; ``data_bytes=None`` marks a stream of unknown length."""
    if data_bytes is None:
        riff_size = data_size = _UNKNOWN_SIZE
    else:
        riff_size, data_size = 36 + data_bytes, data_bytes
    return (
        struct.pack("<4sI4s", b"RIFF", riff_size, b"WAVE")
        + struct.pack("<4sIHHIIHH", b"fmt ", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
        + struct.pack("<4sI", b"data", data_size)
    )


class _Writer(Protocol):
    def write(self, pcm: FloatArray) -> bytes: ...

    def close(self) -> bytes: ...


class _WavWriter:
    def __init__(self, sample_rate: int, streaming: bool) -> None:
        self._sample_rate = sample_rate
        self._streaming = streaming
        self._header_sent = False
        self._held: list[bytes] = []

    def write(self, pcm: FloatArray) -> bytes:
        data = float_to_s16(pcm).astype("<i2").tobytes()
        if not self._streaming:
            self._held.append(data)
            return b""
        if self._header_sent:
            return data
        self._header_sent = True
        return wav_header(self._sample_rate, None) + data

    def close(self) -> bytes:
        if self._streaming:
            return b"" if self._header_sent else wav_header(self._sample_rate, None)
        data = b"".join(self._held)
        return wav_header(self._sample_rate, len(data)) + data


class _RawPcmWriter:
    def write(self, pcm: FloatArray) -> bytes:
        return float_to_s16(pcm).astype("<i2").tobytes()

    def close(self) -> bytes:
        return b""


class _DrainableSink:
    """Write-only file object: PyAV sees it as not seekable, so muxers stream."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def write(self, data: bytes) -> int:
        self._buf += data
        return len(data)

    def take(self) -> bytes:
        out = bytes(self._buf)
        self._buf.clear()
        return out


class _PyAVWriter:
    def __init__(self, fmt: str, sample_rate: int, streaming: bool, bitrate: int | None) -> None:
        muxer, codec, default_bitrate = _PYAV_FORMATS[fmt]
        self._sample_rate = sample_rate
        self._sink: _DrainableSink | io.BytesIO = _DrainableSink() if streaming else io.BytesIO()
        options = {"page_duration": str(_OGG_PAGE_US)} if muxer == "ogg" else {}
        try:
            self._container = av.open(self._sink, "w", format=muxer, options=options)
            stream = self._container.add_stream(codec, rate=sample_rate, layout="mono")
            if not isinstance(stream, av.audio.stream.AudioStream):
                raise AudioEncodeError(f"{codec} is not an audio encoder")
            self._stream = stream
            rate = bitrate if bitrate is not None else default_bitrate
            if rate is not None:
                self._stream.codec_context.bit_rate = rate
        except av.error.FFmpegError as e:
            raise AudioEncodeError(f"cannot set up the {fmt} encoder: {e}") from e
        self._pts = 0

    def _drain(self) -> bytes:
        return self._sink.take() if isinstance(self._sink, _DrainableSink) else b""

    def write(self, pcm: FloatArray) -> bytes:
        if pcm.size == 0:
            return b""
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="flt", layout="mono")
        frame.sample_rate = self._sample_rate
        frame.pts = self._pts
        self._pts += pcm.size
        try:
            for packet in self._stream.encode(frame):
                self._container.mux(packet)
        except av.error.FFmpegError as e:
            raise AudioEncodeError(f"encoding failed: {e}") from e
        return self._drain()

    def close(self) -> bytes:
        try:
            for packet in self._stream.encode(None):
                self._container.mux(packet)
            self._container.close()
        except av.error.FFmpegError as e:
            raise AudioEncodeError(f"finishing the stream failed: {e}") from e
        if isinstance(self._sink, io.BytesIO):
            return self._sink.getvalue()
        return self._drain()


class ContainerEncoder:
    """One HTTP response body: ``feed`` PCM chunks, then ``finish`` once."""

    def __init__(
        self,
        fmt: str,
        sample_rate: int = MODEL_SAMPLE_RATE,
        streaming: bool = True,
        *,
        input_rate: int = MODEL_SAMPLE_RATE,
        bitrate: int | None = None,
    ) -> None:
        supported = supported_container_formats()
        if fmt not in supported:
            raise UnsupportedFormatError(
                f"response_format {fmt!r} is not supported; supported: {', '.join(supported)}",
                param="response_format",
            )
        if sample_rate not in OUTPUT_SAMPLE_RATES:
            raise AudioFormatError(
                f"sample_rate {sample_rate} not supported; use one of {OUTPUT_SAMPLE_RATES}",
                param="sample_rate",
            )
        self.format = fmt
        self.sample_rate = sample_rate
        self.streaming = streaming
        self.content_type = CONTENT_TYPES[fmt]
        self._resampler = StreamingResampler(input_rate, sample_rate)
        self._writer: _Writer
        if fmt == "wav":
            self._writer = _WavWriter(sample_rate, streaming)
        elif fmt == "pcm":
            self._writer = _RawPcmWriter()
        else:
            self._writer = _PyAVWriter(fmt, sample_rate, streaming, bitrate)
        self._finished = False

    def feed(self, pcm: npt.ArrayLike) -> bytes:
        if self._finished:
            raise AudioEncodeError("feed() after finish()")
        return self._writer.write(self._resampler.feed(as_mono_float32(pcm)))

    def finish(self) -> bytes:
        if self._finished:
            raise AudioEncodeError("finish() called twice")
        self._finished = True
        return self._writer.write(self._resampler.finish()) + self._writer.close()
