"""What the session state machine emits (actions) and the interfaces it consumes.

Re-exported by ``gateway.realtime.session``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel

from gateway.protocol import SessionConfig


class Segmenter(Protocol):
    """Cuts incremental text into speakable segments (times in seconds)."""

    def feed(self, text: str, now: float) -> list[str]: ...

    def poll(self, now: float) -> list[str]: ...

    def flush(self) -> list[str]: ...

    def next_deadline(self) -> float | None: ...


SegmenterFactory = Callable[[SessionConfig], Segmenter]


class ContextQuota(Protocol):
    """Per-key context accounting shared across sessions."""

    def acquire(self) -> bool: ...

    def release(self) -> None: ...


class Unlimited:
    def acquire(self) -> bool:
        return True

    def release(self) -> None:
        return None


# --------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class Send:
    event: BaseModel


@dataclass(frozen=True)
class OpenContext:
    key: int  # unique per session; context ids are the client's names
    context_id: str
    stream: int
    config: SessionConfig


@dataclass(frozen=True)
class Speak:
    key: int
    index: int
    text: str
    ready_at: float  # when the segment became speakable (TTFA starts here)


@dataclass(frozen=True)
class Flush:
    key: int
    flush_id: str
    reply_to: str | None


@dataclass(frozen=True)
class EndContext:
    key: int
    reply_to: str | None


@dataclass(frozen=True)
class CancelContext:
    key: int
    reply_to: str | None
    unspoken_tail: str  # text still buffered, never sent to the engine


@dataclass(frozen=True)
class CreateVoice:
    audio: bytes
    text: str | None
    voice_id: str | None
    reply_to: str | None


@dataclass(frozen=True)
class Close:
    code: int
    reason: str


Action = Send | OpenContext | Speak | Flush | EndContext | CancelContext | CreateVoice | Close
