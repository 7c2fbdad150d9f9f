"""The voice library: built-in voices plus voices cloned from reference clips.

Shared by HTTP ``/v1/voices``, the ``ref_audio`` of ``/v1/audio/speech`` and
the WebSocket ``voice.create`` / ``session.update {voice}``: all of them lead
to the same cached codec codes.

- A clip is encoded once. Codes are cached by content hash (API key, clip
  bytes, transcript) in memory, least recently used first out past
  ``max_cached``; with a directory or a shared store (gateway/voice_backends.py)
  they are also written there and read back on a miss, so eviction, restarts
  and other replicas cost no re-encoding.
- Voices are per API key: a voice created on one socket is usable on every
  socket and HTTP call of the same key, and no other key can see, use or
  delete it. The cache is keyed by key too, so not even a cache hit reveals
  that another key sent the same clip.
- A named voice whose codes were evicted (and are in no store) is gone: using
  it is refused like an unknown voice.
- With a directory or a shared store every use reads the voice's name there: a
  voice deleted through one worker process or replica is refused by all the
  others from then on.

Engines that can clone say so with ``supports_voice_cloning`` and implement
``VoiceCloningEngine``. Clips are decoded and checked before that capability
is consulted, so a client learns about a broken clip first.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from gateway.auth import ANONYMOUS
from gateway.state import CreatedVoice
from gateway.voice_backends import AddOutcome, LocalVoiceBackend, VoiceBackend, check_voice_store
from gateway.voice_backends import VoiceStoreError as VoiceStoreError
from gateway.voice_clips import (
    CLIP_SAMPLE_RATE as CLIP_SAMPLE_RATE,
)
from gateway.voice_clips import (
    CODEC_FRAME_SAMPLES as CODEC_FRAME_SAMPLES,
)
from gateway.voice_clips import (
    MAX_TRANSCRIPT_CHARS,
    MIN_REFERENCE_SECONDS,
    ReferenceAudioError,
    ReferenceClip,
    VoiceError,
    decode_clip,
)
from gateway.voice_clips import reference_bytes as reference_bytes
from gateway.voice_store import StoredName
from gateway.voice_store import VoiceStore as VoiceStore
from realtime_engine.engines.base import SpeechEngine, UnsupportedVoiceError, VoiceReference

_VOICE_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")

__all__ = [
    "ReferenceAudioError",
    "ReferenceClip",
    "VoiceConflictError",
    "VoiceError",
    "VoiceLibrary",
    "VoiceNotFoundError",
    "decode_clip",
    "reference_bytes",
]


class VoiceNotFoundError(VoiceError):
    """No voice has this id (for this API key)."""


class VoiceConflictError(VoiceError):
    """The id is taken (a built-in voice, or another clip) or the library is full."""


@runtime_checkable
class VoiceCloningEngine(Protocol):
    """What an engine offers when ``supports_voice_cloning`` is true."""

    supports_voice_cloning: bool

    async def encode_reference(self, pcm: np.ndarray, sample_rate: int) -> np.ndarray:
        """Codec codes ``[frames, 8]`` of a mono float32 clip; ``ValueError`` for a bad clip."""
        ...


def can_clone(engine: SpeechEngine) -> bool:
    return isinstance(engine, VoiceCloningEngine) and bool(engine.supports_voice_cloning)


def cloning_unsupported(engine: SpeechEngine) -> UnsupportedVoiceError:
    return UnsupportedVoiceError(
        f"the {engine.name} engine cannot clone voices from reference audio; "
        "use a built-in voice (GET /v1/voices)"
    )


@dataclass(frozen=True)
class VoiceEntry:
    voice_id: str
    description: str = ""
    builtin: bool = True
    duration_s: float | None = None
    frames: int | None = None
    text: str | None = None
    created_at: int | None = None  # unix seconds
    digest: str = ""  # content hash of the clip (cloned voices)

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


@dataclass(frozen=True)
class VoiceStats:
    encodes: int  # clips run through the engine's encoder
    hits: int  # clips answered from the cache (memory or disk)
    evictions: int
    cached: int  # entries in memory now


class VoiceLibrary:
    """Built-in voices of the engine plus cloned ones; satisfies ``state.VoiceRegistry``.

    Names live in the ``VoiceBackend`` (this process, or a store shared by
    replicas); codes are cached here, least recently used out first.
    """

    def __init__(
        self,
        engine: SpeechEngine,
        max_reference_seconds: float = 30.0,
        max_voices: int = 256,
        max_cached: int = 1024,
        store: VoiceStore | None = None,
        backend: VoiceBackend | None = None,
    ) -> None:
        if store is not None and backend is not None:
            raise ValueError("pass a directory store or a backend, not both")
        self._engine = engine
        self.max_reference_seconds = max_reference_seconds
        self._max_voices = max_voices  # named voices per API key
        self._max_cached = max_cached
        self._backend: VoiceBackend = backend or LocalVoiceBackend(store)
        self._codes: OrderedDict[str, VoiceReference] = OrderedDict()  # digest -> codes (LRU)
        self._encoding: dict[str, asyncio.Future[VoiceReference]] = {}  # encodes under way
        self._encodes = self._hits = self._evictions = 0

    @property
    def engine(self) -> SpeechEngine:
        return self._engine

    @property
    def backend(self) -> VoiceBackend:
        return self._backend

    def stats(self) -> VoiceStats:
        return VoiceStats(self._encodes, self._hits, self._evictions, len(self._codes))

    def _builtin(self) -> dict[str, VoiceEntry]:
        entries = {v.voice_id: VoiceEntry(v.voice_id, v.description) for v in self._engine.voices()}
        entries.setdefault("default", VoiceEntry("default", "the engine's default voice"))
        return entries

    def has(self, voice_id: str, key_id: str = ANONYMOUS) -> bool:
        """Without I/O: a shared store's answer as of the last ``refresh``."""
        return voice_id in self._builtin() or self._backend.known(key_id, voice_id)

    async def refresh(self, voice_id: str, key_id: str = ANONYMOUS) -> None:
        """Ask the store about ``voice_id`` so that ``has`` answers for it now."""
        if voice_id not in self._builtin():
            await self._backend.get_name(key_id, voice_id)

    async def list(self, key_id: str = ANONYMOUS) -> list[VoiceEntry]:
        named = await self._backend.list_names(key_id)
        return [*self._builtin().values(), *(_entry_of(n) for n in named)]

    async def get(self, voice_id: str, key_id: str = ANONYMOUS) -> VoiceEntry:
        builtin = self._builtin().get(voice_id)
        if builtin is not None:
            return builtin
        name = await self._backend.get_name(key_id, voice_id)
        if name is None:
            raise VoiceNotFoundError(f"no voice named {voice_id!r}", "voice_id")
        return _entry_of(name)

    async def load_clip(self, audio: bytes, param: str = "audio") -> ReferenceClip:
        return await asyncio.to_thread(
            decode_clip, audio, self.max_reference_seconds, param, MIN_REFERENCE_SECONDS
        )

    async def create(
        self, audio: bytes, text: str | None, voice_id: str | None, key_id: str = ANONYMOUS
    ) -> CreatedVoice:
        """Decode, check, encode (once per clip) and name a reference clip."""
        if voice_id is not None and not _VOICE_ID.match(voice_id):
            raise VoiceError(
                "'voice_id' must be 1-64 characters of A-Z a-z 0-9 _ . : -", "voice_id"
            )
        if text is not None and len(text) > MAX_TRANSCRIPT_CHARS:
            raise VoiceError(f"'text' is longer than {MAX_TRANSCRIPT_CHARS} characters", "text")
        digest = hashlib.sha256(
            b"%s\0%s\0%s" % (key_id.encode(), hashlib.sha256(audio).digest(), (text or "").encode())
        ).hexdigest()
        clip = await self.load_clip(audio)
        if not can_clone(self._engine):
            raise cloning_unsupported(self._engine)
        if voice_id in self._builtin():
            raise VoiceConflictError(f"{voice_id!r} is a built-in voice", "voice_id")
        named = {n.voice_id: n for n in await self._backend.list_names(key_id)}
        if voice_id is None:
            # The same clip again: the voice it already made, under any id.
            known = next((v for v, n in named.items() if n.digest == digest), None)
            voice_id = known or f"voice_{digest[:16]}"
        existing = named.get(voice_id)
        if existing is not None and existing.digest != digest:
            raise _taken(voice_id)
        if existing is None and len(named) >= self._max_voices:
            raise self._full()  # fail before the encoder; add_name checks again atomically
        reference, cached = await self._codes_for(key_id, digest, clip, text)
        name = StoredName(
            key_id=key_id,
            voice_id=voice_id,
            digest=digest,
            duration_s=round(clip.duration_s, 3),
            frames=reference.frames,
            text=text,
            created_at=int(time.time()),
        )
        added = await self._backend.add_name(name, reference.codes, text, self._max_voices)
        if added.outcome is AddOutcome.FULL:
            raise self._full()
        if added.outcome is AddOutcome.EXISTS and (
            added.name is None or added.name.digest != digest
        ):
            raise _taken(voice_id)  # another request named another clip meanwhile
        return CreatedVoice(voice_id, clip.duration_s, reference.frames, cached=cached)

    def _full(self) -> VoiceConflictError:
        return VoiceConflictError(
            f"this key holds its maximum of {self._max_voices} voices", "voice_id"
        )

    async def _codes_for(
        self, key_id: str, digest: str, clip: ReferenceClip, text: str | None
    ) -> tuple[VoiceReference, bool]:
        """The clip's codes and whether they came from the cache; concurrent
        requests for one clip share a single encode."""
        reference = await self._cached(key_id, digest)
        if reference is not None:
            return reference, True
        pending = self._encoding.get(digest)
        if pending is not None:
            self._hits += 1
            return await asyncio.shield(pending), True
        future: asyncio.Future[VoiceReference] = asyncio.get_running_loop().create_future()
        self._encoding[digest] = future
        try:
            reference = await self._encode(digest, clip, text)
        except BaseException as e:
            future.set_exception(e)
            future.exception()  # retrieved here: waiters, if any, get it too
            raise
        finally:
            del self._encoding[digest]
        future.set_result(reference)
        return reference, False

    async def _encode(self, digest: str, clip: ReferenceClip, text: str | None) -> VoiceReference:
        assert isinstance(self._engine, VoiceCloningEngine)
        self._encodes += 1
        try:
            codes = await self._engine.encode_reference(clip.pcm, clip.sample_rate)
        except ValueError as e:
            raise ReferenceAudioError(f"'audio' cannot be encoded: {e}", "audio") from e
        reference = VoiceReference(np.asarray(codes, dtype=np.int64), text)
        self._remember(digest, reference)
        return reference

    async def _cached(self, key_id: str, digest: str) -> VoiceReference | None:
        """Codes never change under a digest, so the memory copy needs no invalidation."""
        reference = self._codes.get(digest)
        if reference is not None:
            self._codes.move_to_end(digest)
            self._hits += 1
            return reference
        loaded = await self._backend.load_codes(key_id, digest)
        if loaded is None:
            return None
        self._hits += 1
        reference = VoiceReference(*loaded)
        self._remember(digest, reference)
        return reference

    def _remember(self, digest: str, reference: VoiceReference) -> None:
        self._codes[digest] = reference
        self._codes.move_to_end(digest)
        while len(self._codes) > self._max_cached:
            self._codes.popitem(last=False)
            self._evictions += 1

    async def reference(self, voice_id: str, key_id: str = ANONYMOUS) -> VoiceReference | None:
        """The codes of ``voice_id`` for this key; None for built-in voices.

        The name is read from the backend on every use, so a voice deleted
        through another worker or replica is refused here at once.
        """
        if voice_id in self._builtin():
            return None
        name = await self._backend.get_name(key_id, voice_id)
        if name is None:
            raise VoiceNotFoundError(f"no voice named {voice_id!r}", "voice")
        reference = await self._cached(key_id, name.digest)
        if reference is None:
            # The voice was deleted (its codes with it) since its name was read, and
            # perhaps made again from another clip: only a name still pointing at
            # missing codes is dropped.
            now = await self._backend.get_name(key_id, voice_id)
            if now is None:
                raise VoiceNotFoundError(f"no voice named {voice_id!r}", "voice")
            if now.digest != name.digest:
                reference = await self._cached(key_id, now.digest)
            if reference is None:
                await self._backend.delete_name(key_id, voice_id)
                raise VoiceNotFoundError(
                    f"voice {voice_id!r} has expired from the voice cache; create it again",
                    "voice",
                )
        return reference

    async def delete(self, voice_id: str, key_id: str = ANONYMOUS) -> None:
        if voice_id in self._builtin():
            raise VoiceConflictError(f"{voice_id!r} is a built-in voice", "voice_id")
        if not await self._backend.delete_name(key_id, voice_id):
            raise VoiceNotFoundError(f"no voice named {voice_id!r}", "voice_id")

    async def close(self) -> None:
        await self._backend.close()


def open_voice_backend(store_url: str, voice_dir: str) -> VoiceBackend:
    """The backend the settings name: a shared store URL, a directory, or memory."""
    check_voice_store(store_url, voice_dir)
    if store_url:
        from gateway.voice_redis import RedisVoiceBackend

        return RedisVoiceBackend.from_url(store_url)
    return LocalVoiceBackend(VoiceStore(voice_dir) if voice_dir else None)


def _taken(voice_id: str) -> VoiceConflictError:
    return VoiceConflictError(
        f"voice {voice_id!r} already exists with another clip; delete it first", "voice_id"
    )


def _entry_of(name: StoredName) -> VoiceEntry:
    return VoiceEntry(
        name.voice_id,
        description="cloned from a reference clip",
        builtin=False,
        duration_s=name.duration_s,
        frames=name.frames,
        text=name.text,
        created_at=name.created_at,
        digest=name.digest,
    )
