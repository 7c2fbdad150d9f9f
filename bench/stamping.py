"""An engine wrapper that stamps when each PCM chunk left the engine.

The gateway-overhead run compares these stamps with the arrival of the audio
frames carrying those samples at the client: the difference is what the
gateway (framing, encoding, queueing, the socket) adds on top of the engine.
Stamps are keyed by segment text, which the client also sees in
``segment.started`` events, so no server internals are needed to match them.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import numpy as np

from realtime_engine.engines.base import SegmentRequest, SpeechEngine, VoiceInfo

_NOT_LETTER = re.compile(r"[^a-z]+")


def text_key(text: str) -> str:
    """Text as matched between engine requests and ``segment.started`` events."""
    return _NOT_LETTER.sub(" ", text.lower()).strip()


@dataclass
class ChunkStamp:
    sample_offset: int  # first sample of the chunk within its segment
    samples: int
    emitted_at: float  # time.perf_counter() when the engine yielded it


@dataclass
class StampLog:
    by_text: dict[str, list[ChunkStamp]] = field(default_factory=dict)


class StampingEngine:
    def __init__(self, inner: SpeechEngine) -> None:
        self._inner = inner
        self.name = inner.name
        self.model_id = inner.model_id
        self.sample_rate = inner.sample_rate
        self.stamps = StampLog()

    def voices(self) -> list[VoiceInfo]:
        return self._inner.voices()

    async def synthesize(self, request: SegmentRequest) -> AsyncIterator[np.ndarray]:
        stamps = self.stamps.by_text.setdefault(text_key(request.text), [])
        offset = 0
        async for chunk in self._inner.synthesize(request):
            stamps.append(ChunkStamp(offset, len(chunk), time.perf_counter()))
            offset += len(chunk)
            yield chunk

    async def abort(self, request_id: str) -> None:
        await self._inner.abort(request_id)

    async def start(self) -> None:
        await self._inner.start()

    async def close(self) -> None:
        await self._inner.close()


def emit_time_of(stamps: list[ChunkStamp], sample: int) -> float | None:
    """When the chunk holding ``sample`` (offset within the segment) was emitted."""
    for stamp in stamps:
        if stamp.sample_offset <= sample < stamp.sample_offset + stamp.samples:
            return stamp.emitted_at
    return None
