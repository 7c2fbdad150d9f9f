"""Process-wide gateway state shared by the WebSocket and HTTP routes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from gateway.auth import ANONYMOUS, Authenticator
from gateway.encode_pool import EncodePool
from gateway.metrics import GatewayMetrics
from gateway.protocol import ErrorDetail
from gateway.settings import GatewaySettings
from gateway.shared_admission import SharedAdmission
from realtime_engine.engines.base import SpeechEngine, UnsupportedVoiceError, VoiceReference


@dataclass(frozen=True)
class CreatedVoice:
    voice_id: str
    duration_s: float
    frames: int
    cached: bool


class VoiceRegistry(Protocol):
    """Where voice ids resolve, per API key; HTTP ``/v1/voices`` and WS
    ``voice.create`` share it."""

    def has(self, voice_id: str, key_id: str = ANONYMOUS) -> bool:
        """Without I/O; for a voice that may live in a shared store, ``refresh`` it first."""
        ...

    async def refresh(self, voice_id: str, key_id: str = ANONYMOUS) -> None:
        """Look ``voice_id`` up where voices are kept, so that ``has`` answers for it."""
        ...

    async def create(
        self, audio: bytes, text: str | None, voice_id: str | None, key_id: str = ANONYMOUS
    ) -> CreatedVoice:
        """Encode a reference clip; raise ``ValueError`` (bad clip) or
        ``UnsupportedVoiceError`` (the engine cannot clone)."""
        ...

    async def reference(self, voice_id: str, key_id: str = ANONYMOUS) -> VoiceReference | None:
        """The cloned voice's codes; None for a built-in voice; ``ValueError`` if unknown."""
        ...


class EngineVoices:
    """The engine's built-in voices; cloning is refused (engines without an encoder)."""

    def __init__(self, engine: SpeechEngine) -> None:
        self._engine = engine

    def has(self, voice_id: str, key_id: str = ANONYMOUS) -> bool:
        return voice_id == "default" or any(v.voice_id == voice_id for v in self._engine.voices())

    async def refresh(self, voice_id: str, key_id: str = ANONYMOUS) -> None:
        return None  # built-in voices only: nothing to look up

    async def create(
        self, audio: bytes, text: str | None, voice_id: str | None, key_id: str = ANONYMOUS
    ) -> CreatedVoice:
        raise UnsupportedVoiceError(f"the {self._engine.name} engine cannot create voices")

    async def reference(self, voice_id: str, key_id: str = ANONYMOUS) -> VoiceReference | None:
        if not self.has(voice_id):
            raise ValueError(f"no voice named {voice_id!r}")
        return None


class LiveSession(Protocol):
    """What process-wide events (engine death, drain) need from an open session."""

    @property
    def open_context_count(self) -> int: ...

    async def fail_contexts(self, detail: ErrorDetail) -> None:
        """Fail every open context with ``detail`` (the engine died)."""
        ...

    async def shut_down(self, detail: ErrorDetail, code: int) -> None:
        """Cancel open contexts with ``detail``, then close the socket with ``code``."""
        ...


@dataclass
class Admission:
    """Concurrency accounting: total sessions, sessions and contexts per key."""

    max_sessions: int
    max_sessions_per_key: int
    max_contexts_per_key: int
    sessions: int = 0
    sessions_by_key: dict[str, int] = field(default_factory=dict)
    contexts_by_key: dict[str, int] = field(default_factory=dict)

    def session_refusal(self, key_id: str) -> str | None:
        """Why a new session of ``key_id`` would be refused, or None."""
        if self.sessions >= self.max_sessions:
            return "server"
        if key_id == ANONYMOUS:
            return None  # an open server has no keys to limit
        if self.sessions_by_key.get(key_id, 0) >= self.max_sessions_per_key:
            return "key"
        return None

    def try_open_session(self, key_id: str) -> str | None:
        """Open a session unless a limit refuses it; why it was refused, or None."""
        refusal = self.session_refusal(key_id)
        if refusal is None:
            self.open_session(key_id)
        return refusal

    def open_session(self, key_id: str) -> None:
        self.sessions += 1
        self.sessions_by_key[key_id] = self.sessions_by_key.get(key_id, 0) + 1

    def close_session(self, key_id: str) -> None:
        self.sessions -= 1
        left = self.sessions_by_key.get(key_id, 1) - 1
        if left:
            self.sessions_by_key[key_id] = left
        else:
            self.sessions_by_key.pop(key_id, None)

    def try_open_context(self, key_id: str) -> bool:
        count = self.contexts_by_key.get(key_id, 0)
        if key_id != ANONYMOUS and count >= self.max_contexts_per_key:
            return False
        self.contexts_by_key[key_id] = count + 1
        return True

    def close_context(self, key_id: str) -> None:
        left = self.contexts_by_key.get(key_id, 1) - 1
        if left:
            self.contexts_by_key[key_id] = left
        else:
            self.contexts_by_key.pop(key_id, None)


@dataclass
class GatewayState:
    settings: GatewaySettings
    engine: SpeechEngine
    metrics: GatewayMetrics
    auth: Authenticator
    voices: VoiceRegistry
    # This process's counters, or (serve --workers N) the server's, shared by the workers
    admission: Admission | SharedAdmission
    ready: bool = False  # engine loaded and warmed
    engine_error: str | None = None  # why the engine failed to start, or died
    draining: bool = False  # shutting down: refuse new sessions with 1013
    sessions: set[LiveSession] = field(default_factory=set)  # open WebSocket sessions
    # Encodes every session's long chunks, most urgent first (threads start on
    # first use). None: they are encoded on the event loop.
    encode_pool: EncodePool | None = None

    @classmethod
    def create(
        cls,
        settings: GatewaySettings,
        engine: SpeechEngine,
        voices: VoiceRegistry | None = None,
        metrics: GatewayMetrics | None = None,
    ) -> GatewayState:
        return cls(
            settings=settings,
            engine=engine,
            metrics=metrics or GatewayMetrics(),
            auth=Authenticator(settings.api_keys, settings.token_secret),
            voices=voices or EngineVoices(engine),
            admission=_admission(settings),
            encode_pool=EncodePool(settings.encode_threads),
        )

    @property
    def model_name(self) -> str:
        return self.settings.model_name or self.engine.model_id


def _admission(settings: GatewaySettings) -> Admission | SharedAdmission:
    if settings.admission_file:
        return SharedAdmission(
            settings.admission_file,
            max_sessions=settings.limits.max_sessions,
            max_sessions_per_key=settings.max_sessions_per_key,
            max_contexts_per_key=settings.max_contexts_per_key,
        )
    return Admission(
        max_sessions=settings.limits.max_sessions,
        max_sessions_per_key=settings.max_sessions_per_key,
        max_contexts_per_key=settings.max_contexts_per_key,
    )
