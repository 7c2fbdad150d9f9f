"""Reference clips for voice tests: valid ones and every malformed kind the server refuses."""

from __future__ import annotations

import io
import struct
import wave

import av
import numpy as np

from realtime_engine.engines.fake import FakeEngine

RATE = 24_000


def tone(seconds: float, rate: int = RATE, hz: float = 220.0, channels: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    mono = (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)
    return np.repeat(mono[:, None], channels, axis=1) if channels > 1 else mono


def wav_s16(pcm: np.ndarray, rate: int = RATE, channels: int = 1) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((np.clip(pcm, -1, 1) * 32767).astype("<i2").tobytes())
    return buffer.getvalue()


def wav_u8(pcm: np.ndarray, rate: int = RATE) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(1)
        out.setframerate(rate)
        out.writeframes((np.clip(pcm, -1, 1) * 127 + 128).astype(np.uint8).tobytes())
    return buffer.getvalue()


def wav_f32(pcm: np.ndarray, rate: int = RATE) -> bytes:
    """IEEE-float WAV (format 3), written by hand so any sample value survives."""
    data = pcm.astype("<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, rate, rate * 4, 4, 32)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    body += b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def flac_silence(seconds: float, rate: int = 16_000) -> bytes:
    """Long but small: FLAC compresses silence to almost nothing."""
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="flac") as out:
        stream = out.add_stream("flac", rate=rate, layout="mono")
        step = rate
        for start in range(0, int(seconds * rate), step):
            frame = av.AudioFrame.from_ndarray(
                np.zeros((1, step), dtype=np.int16), format="s16", layout="mono"
            )
            frame.sample_rate = rate
            frame.pts = start
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buffer.getvalue()


def nan_clip() -> bytes:
    pcm = tone(1.5)
    pcm[1000:1100] = np.nan
    return wav_f32(pcm)


# (name, clip bytes, what the error message says)
MALFORMED: list[tuple[str, bytes, str]] = [
    ("corrupt", b"RIFF\x10\x00\x00\x00WAVEjunk" + bytes(range(256)) * 8, "could not be decoded"),
    ("ten_minutes", flac_silence(600.0), "longer than the 30 s"),
    ("nan_float_wav", nan_clip(), "NaN"),
    ("eight_bit", wav_u8(tone(1.5)), "8-bit"),
    ("192khz", wav_s16(tone(1.5, 192_000), 192_000), "192000 Hz"),
    ("too_short", wav_s16(tone(0.4)), "at least 1 s"),
]
STEREO = wav_s16(tone(1.5, channels=2).reshape(-1), channels=2)


class CloningFakeEngine(FakeEngine):
    """The fake engine plus cloning: codes that depend on the clip, encodes counted."""

    supports_voice_cloning = True

    def __init__(self) -> None:
        super().__init__()
        self.encoded = 0

    async def encode_reference(self, pcm: np.ndarray, sample_rate: int) -> np.ndarray:
        self.encoded += 1
        level = int(abs(float(pcm.mean())) * 1e6) % 1024
        return np.full((-(-pcm.size // 960), 8), level, dtype=np.int64)


def clip(hz: float) -> bytes:
    """A one-second tone at ``hz`` as a WAV file (a distinct voice per pitch)."""
    return wav_s16(tone(1.0, hz=hz))
