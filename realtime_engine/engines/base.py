"""The one interface between the gateway and any speech engine.

An engine turns one text segment into PCM chunks (float32 mono at
``sample_rate``), as an async iterator. It knows nothing about WebSockets,
output formats or contexts; the gateway owns ordering, look-ahead and cancel.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import ClassVar, Literal, Protocol, get_args, runtime_checkable

import numpy as np

from realtime_engine.engines.continuity import VoiceContinuity
from realtime_engine.engines.voice_reference import VoiceReference as VoiceReference
from realtime_engine.format import ChunkingParams as ChunkingParams
from realtime_engine.talker.types import TalkerSampling

Stage = Literal["submitted", "prefilled", "first_row", "first_frame_row", "first_chunk"]


@dataclass
class SegmentTimings:
    """When one segment reached each stage before its first audio.

    Monotonic ``time.perf_counter`` seconds (the gateway's clock too). The
    engine stamps what it can see and leaves the rest ``None``; each stamp is
    kept from its first ``mark``, so repeated calls are harmless.
    """

    submitted: float | None = None  # the engine handed the segment to its model
    prefilled: float | None = None  # the talker finished the prompt (prefill)
    first_row: float | None = None  # first code row out of the talker
    first_frame_row: float | None = None  # the row that completes the first codec frame
    first_chunk: float | None = None  # first PCM chunk out of the engine

    STAGES: ClassVar[tuple[Stage, ...]] = get_args(Stage)

    def mark(self, stage: Stage, at: float | None = None) -> None:
        """Stamp ``stage`` (now, or ``at``) unless it is already stamped."""
        if stage not in self.STAGES:
            raise ValueError(f"unknown stage {stage!r}; choose one of {self.STAGES}")
        if getattr(self, stage) is None:
            setattr(self, stage, time.perf_counter() if at is None else at)


@dataclass(frozen=True)
class SegmentRequest:
    request_id: str
    text: str
    voice: str = "default"
    sampling: TalkerSampling = field(default_factory=TalkerSampling)
    chunking: ChunkingParams | None = None  # None: the engine's default preset
    # Caps on the segment's length: seconds of audio (the engine turns them
    # into its own model steps), and raw talker steps (the HTTP API's knob).
    max_audio_seconds: float | None = None
    max_new_tokens: int | None = None
    fixed_rows: int | None = None  # benchmarks: exact output length in frames
    speed: float = 1.0  # speaking rate; engines without rate control ignore it
    # A cloned voice (resolved by the gateway); engines without an encoder refuse it.
    reference: VoiceReference | None = field(default=None, compare=False, repr=False)
    # One voice across a context's segments (see docs/voices.md); None: each
    # segment stands alone.
    continuity: VoiceContinuity | None = field(default=None, compare=False, repr=False)
    # Filled by the engine as the segment progresses (see SegmentTimings);
    # None: nobody is measuring.
    timings: SegmentTimings | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class VoiceInfo:
    voice_id: str
    description: str = ""
    builtin: bool = True


class EngineError(RuntimeError):
    """A segment failed inside the engine; raised from its chunk iterator."""


class EngineDeadError(EngineError):
    """The engine itself has died (its process or thread is gone); nothing more will run.

    Engines that can die say why from an optional ``failure() -> str | None``
    method, which the gateway's health watch polls.
    """


class UnsupportedVoiceError(EngineError):
    """The engine cannot use the requested voice (or cannot clone voices)."""


class EngineOverloadedError(EngineError):
    """The engine refuses new work for now (its queue is full); retrying later may work."""

    def __init__(self, message: str, retry_after_ms: int = 1000) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms


class SpeechEngine(Protocol):
    name: str
    model_id: str
    sample_rate: int

    def voices(self) -> list[VoiceInfo]: ...

    def synthesize(self, request: SegmentRequest) -> AsyncIterator[np.ndarray]:
        """PCM float32 chunks for one segment; raises ``EngineError`` on failure."""
        ...

    async def abort(self, request_id: str) -> None:
        """Stop the work of ``request_id`` now (no-op when it has finished)."""
        ...

    async def start(self) -> None:
        """Load and warm up (idempotent)."""
        ...

    async def close(self) -> None: ...


# An engine may set ``self_paced = True``: it makes a request's audio at its
# own pace whether or not it is read (another process, device or thread, as
# the Higgs engine's talkers), so the gateway reads it ahead of what it sends
# (gateway/realtime/segment_pull.py). Engines that make audio as it is read,
# on the gateway's own CPU, leave it unset and are read in step with sending.


@runtime_checkable
class DeviceTracing(Protocol):
    """An engine that can record a trace of its device work on request (the
    gateway toggles it on ``SIGUSR2``: docs/bench, the served step timeline)."""

    async def toggle_device_trace(self) -> str:
        """Start a trace, or stop the one recording: ``"started"`` or
        ``"stopped"``; ``EngineError`` when this engine cannot record one."""
        ...
