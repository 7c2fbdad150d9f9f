"""The voice library: built-in voices plus voices cloned from reference clips.

Shared by HTTP ``/v1/voices``, the ``ref_audio`` of ``/v1/audio/speech`` and the
WebSocket ``voice.create``. Reference audio is only ever taken from the
request's own bytes (base64 or a ``data:`` URI): anything that looks like a
path or a URL is refused, so a request can never make the server read its
own files or reach the network.

Cloning needs an engine with a codec encoder; engines say so with
``supports_voice_cloning`` and implement ``VoiceCloningEngine``. Clips are
decoded and checked before that capability is consulted, so a client learns
about a broken clip first.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import math
import re
import time
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import av
import numpy as np

from gateway.protocol import decode_audio_payload
from gateway.state import CreatedVoice
from realtime_engine.engines.base import SpeechEngine, UnsupportedVoiceError
from realtime_engine.format import FRAME_SAMPLES as CODEC_FRAME_SAMPLES
from realtime_engine.format import SAMPLE_RATE as CLIP_SAMPLE_RATE

MAX_TRANSCRIPT_CHARS = 2_000
_VOICE_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


class VoiceError(ValueError):
    """A voice request cannot be served; ``param`` names the offending field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ReferenceAudioError(VoiceError):
    """Reference audio is not inline data, cannot be decoded, or is too long."""


class VoiceNotFoundError(VoiceError):
    """No voice has this id."""


class VoiceConflictError(VoiceError):
    """The id is taken (a built-in voice, or another clip) or the library is full."""


@dataclass(frozen=True)
class ReferenceClip:
    """Decoded reference audio: mono float32 at ``CLIP_SAMPLE_RATE``."""

    pcm: np.ndarray
    sample_rate: int = CLIP_SAMPLE_RATE

    @property
    def duration_s(self) -> float:
        return self.pcm.size / self.sample_rate

    @property
    def frames(self) -> int:
        return math.ceil(self.pcm.size * CLIP_SAMPLE_RATE / self.sample_rate / CODEC_FRAME_SAMPLES)


@runtime_checkable
class VoiceCloningEngine(Protocol):
    """What an engine offers when ``supports_voice_cloning`` is true."""

    supports_voice_cloning: bool

    async def clone_voice(self, voice_id: str, clip: ReferenceClip, text: str | None) -> None:
        """Encode ``clip`` (once) so that ``voice_id`` can be used in requests."""
        ...

    async def remove_cloned_voice(self, voice_id: str) -> None: ...


def can_clone(engine: SpeechEngine) -> bool:
    return isinstance(engine, VoiceCloningEngine) and bool(engine.supports_voice_cloning)


def cloning_unsupported(engine: SpeechEngine) -> UnsupportedVoiceError:
    return UnsupportedVoiceError(
        f"the {engine.name} engine cannot clone voices from reference audio; "
        "use a built-in voice (GET /v1/voices)"
    )


def reference_bytes(value: str, param: str = "audio") -> bytes:
    """The bytes of inline reference audio (``gateway.protocol.decode_audio_payload``).

    Paths and URLs are refused outright; nothing is ever read from disk or
    fetched.
    """
    try:
        return decode_audio_payload(value, param)
    except ValueError as e:
        raise ReferenceAudioError(str(e), param) from e


def decode_clip(data: bytes, max_seconds: float, param: str = "audio") -> ReferenceClip:
    """Decode wav/flac/ogg/mp3 bytes to mono float32 at 24 kHz (blocking: run off the loop)."""
    max_samples = int(max_seconds * CLIP_SAMPLE_RATE)
    pieces: list[np.ndarray] = []
    total = 0
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.audio:
                raise ReferenceAudioError(f"'{param}' has no audio stream", param)
            stream = container.streams.audio[0]
            resampler = av.AudioResampler(format="flt", layout="mono", rate=CLIP_SAMPLE_RATE)
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    pieces.append(out.to_ndarray().reshape(-1))
                    total += pieces[-1].size
                if total > max_samples:
                    raise ReferenceAudioError(
                        f"'{param}' is longer than the {max_seconds:g} s allowed for a reference",
                        param,
                    )
            for out in resampler.resample(None):
                pieces.append(out.to_ndarray().reshape(-1))
    except av.FFmpegError as e:
        raise ReferenceAudioError(f"'{param}' could not be decoded as audio: {e}", param) from e
    pcm = np.concatenate(pieces).astype(np.float32) if pieces else np.zeros(0, np.float32)
    if pcm.size == 0:
        raise ReferenceAudioError(f"'{param}' decodes to no audio", param)
    if pcm.size > max_samples:
        raise ReferenceAudioError(
            f"'{param}' is longer than the {max_seconds:g} s allowed for a reference", param
        )
    return ReferenceClip(pcm)


@dataclass(frozen=True)
class VoiceEntry:
    voice_id: str
    description: str = ""
    builtin: bool = True
    duration_s: float | None = None
    frames: int | None = None
    text: str | None = None
    created_at: int | None = None  # unix seconds

    def as_json(self) -> dict[str, object]:
        body: dict[str, object] = {
            "voice_id": self.voice_id,
            "object": "voice",
            "builtin": self.builtin,
            "description": self.description,
        }
        if not self.builtin:
            body.update(
                duration_s=self.duration_s,
                frames=self.frames,
                text=self.text,
                created_at=self.created_at,
            )
        return body


class VoiceLibrary:
    """Built-in voices of the engine plus cloned ones; satisfies ``state.VoiceRegistry``."""

    def __init__(
        self, engine: SpeechEngine, max_reference_seconds: float = 30.0, max_voices: int = 256
    ) -> None:
        self._engine = engine
        self.max_reference_seconds = max_reference_seconds
        self._max_voices = max_voices
        self._created: dict[str, VoiceEntry] = {}
        self._hash_of: dict[str, str] = {}  # voice id -> content hash
        self._lock = asyncio.Lock()

    @property
    def engine(self) -> SpeechEngine:
        return self._engine

    def _builtin(self) -> dict[str, VoiceEntry]:
        # An engine may list the voices cloned into it too; those are not built-in.
        entries = {
            v.voice_id: VoiceEntry(v.voice_id, v.description)
            for v in self._engine.voices()
            if v.builtin and v.voice_id not in self._created
        }
        entries.setdefault("default", VoiceEntry("default", "the engine's default voice"))
        return entries

    def has(self, voice_id: str) -> bool:
        return voice_id in self._created or voice_id in self._builtin()

    def list(self) -> list[VoiceEntry]:
        return [*self._builtin().values(), *self._created.values()]

    def get(self, voice_id: str) -> VoiceEntry:
        entry = self._created.get(voice_id) or self._builtin().get(voice_id)
        if entry is None:
            raise VoiceNotFoundError(f"no voice named {voice_id!r}", "voice_id")
        return entry

    async def load_clip(self, audio: bytes, param: str = "audio") -> ReferenceClip:
        return await asyncio.to_thread(decode_clip, audio, self.max_reference_seconds, param)

    async def create(self, audio: bytes, text: str | None, voice_id: str | None) -> CreatedVoice:
        """Decode, check and register a reference clip; the same clip is encoded once."""
        if voice_id is not None and not _VOICE_ID.match(voice_id):
            raise VoiceError(
                "'voice_id' must be 1-64 characters of A-Z a-z 0-9 _ . : -", "voice_id"
            )
        if text is not None and len(text) > MAX_TRANSCRIPT_CHARS:
            raise VoiceError(f"'text' is longer than {MAX_TRANSCRIPT_CHARS} characters", "text")
        clip = await self.load_clip(audio)
        if not can_clone(self._engine):
            raise cloning_unsupported(self._engine)
        content = hashlib.sha256(audio + b"\0" + (text or "").encode()).hexdigest()
        async with self._lock:
            if voice_id is None:
                # The same clip again: the voice it already made, under any id.
                known = next((v for v, h in self._hash_of.items() if h == content), None)
                voice_id = known or f"voice_{content[:16]}"
            if voice_id in self._builtin():
                raise VoiceConflictError(f"{voice_id!r} is a built-in voice", "voice_id")
            existing = self._created.get(voice_id)
            if existing is not None:
                if self._hash_of[voice_id] != content:
                    raise VoiceConflictError(
                        f"voice {voice_id!r} already exists with another clip; delete it first",
                        "voice_id",
                    )
                return CreatedVoice(voice_id, clip.duration_s, clip.frames, cached=True)
            if len(self._created) >= self._max_voices:
                raise VoiceConflictError(
                    f"the server holds its maximum of {self._max_voices} voices", "voice_id"
                )
            cloner = self._engine
            assert isinstance(cloner, VoiceCloningEngine)
            await cloner.clone_voice(voice_id, clip, text)
            self._created[voice_id] = VoiceEntry(
                voice_id,
                description="cloned from a reference clip",
                builtin=False,
                duration_s=round(clip.duration_s, 3),
                frames=clip.frames,
                text=text,
                created_at=int(time.time()),
            )
            self._hash_of[voice_id] = content
        return CreatedVoice(voice_id, clip.duration_s, clip.frames, cached=False)

    async def delete(self, voice_id: str) -> None:
        async with self._lock:
            if voice_id in self._builtin():
                raise VoiceConflictError(f"{voice_id!r} is a built-in voice", "voice_id")
            if voice_id not in self._created:
                raise VoiceNotFoundError(f"no voice named {voice_id!r}", "voice_id")
            cloner = self._engine
            if isinstance(cloner, VoiceCloningEngine):
                await cloner.remove_cloned_voice(voice_id)
            del self._created[voice_id]
            del self._hash_of[voice_id]
