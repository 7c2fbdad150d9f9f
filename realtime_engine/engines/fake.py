"""A deterministic engine for tests and load rehearsals: no model, checkable audio.

Each segment is a sine tone whose pitch derives from the segment text (so
audio from different segments is distinguishable) with a duration
proportional to its length. Timing (first-chunk delay, real-time factor),
chunk size and failures are configurable; aborts and requests are recorded
so tests can assert that cancelled work really stopped; the log keeps only
the most recent ``log_limit`` entries per list, so a long load run stays flat.

Faults on demand (``speech-gateway serve --engine fake --fake-options JSON``):
``fail_after_segments`` (later segments raise ``EngineError``),
``hang_after_segments`` (later segments never yield: the gateway's stall
limit must catch them) and ``die_after_segments`` (the engine dies: running
and later segments raise ``EngineDeadError`` and ``failure()`` says why, as
a dead talker process would). ``die()`` does the last on demand.
"""

from __future__ import annotations

import asyncio
import functools
import math
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from realtime_engine.engines.base import (
    EngineDeadError,
    EngineError,
    SegmentRequest,
    UnsupportedVoiceError,
    VoiceInfo,
)
from realtime_engine.format import FRAME_SAMPLES, SAMPLE_RATE

T = TypeVar("T")


@dataclass
class FakeEngineConfig:
    sample_rate: int = SAMPLE_RATE
    first_chunk_delay_s: float = 0.0
    # Wall seconds per second of audio after the first chunk (0: as fast as possible).
    realtime_factor: float = 0.0
    chunk_samples: int = 4 * FRAME_SAMPLES
    seconds_per_char: float = 0.05
    min_seconds: float = 0.12
    amplitude: float = 0.3
    # A segment whose text contains ``fail_on`` raises EngineError after
    # ``fail_after_chunks`` chunks.
    fail_on: str | None = None
    fail_after_chunks: int = 0
    start_delay_s: float = 0.0
    voices: tuple[str, ...] = ("default", "fake-bright")
    # Faults by segment count (segments started since the engine started;
    # None: never). See the module docstring.
    fail_after_segments: int | None = None
    hang_after_segments: int | None = None
    die_after_segments: int | None = None
    # Entries kept per log list (the most recent ones).
    log_limit: int = 1000


class RecentList(list[T]):
    """A list that keeps only its most recent ``limit`` items (amortised O(1) append)."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = max(limit, 1)

    def append(self, item: T) -> None:
        super().append(item)
        if len(self) >= 2 * self.limit:
            del self[: len(self) - self.limit]


@dataclass
class FakeEngineLog:
    limit: int = 1000
    requests: RecentList[SegmentRequest] = field(init=False)
    aborted: RecentList[str] = field(init=False)  # abort() calls for running requests
    finished: RecentList[str] = field(init=False)  # ran to the end
    stopped: RecentList[str] = field(init=False)  # stopped early by abort
    failed: RecentList[str] = field(init=False)
    # Closed by the consumer while running, without an abort: with a real
    # engine that work would have kept running.
    abandoned: RecentList[str] = field(init=False)

    def __post_init__(self) -> None:
        for name in ("requests", "aborted", "finished", "stopped", "failed", "abandoned"):
            setattr(self, name, RecentList(self.limit))


def segment_pitch_hz(text: str) -> float:
    return 200.0 + float(zlib.crc32(text.encode()) % 600)


@functools.lru_cache(maxsize=128)
def _tone_period(pitch_hz: int, sample_rate: int, amplitude: float) -> np.ndarray:
    """One period of a whole-hertz tone: ``sample_rate / gcd`` samples, at most one second."""
    period = sample_rate // math.gcd(pitch_hz, sample_rate)
    table = _tone(float(pitch_hz), sample_rate, amplitude, period)
    table.flags.writeable = False  # shared by every segment at this pitch
    return table


def _tone(
    pitch_hz: float, sample_rate: int, amplitude: float, n: int, start: int = 0
) -> np.ndarray:
    t = np.arange(start, n, dtype=np.float64) / sample_rate
    return (amplitude * np.sin(2 * np.pi * pitch_hz * t)).astype(np.float32)


class FakeEngine:
    name = "fake"
    model_id = "fake-tone"

    def __init__(self, config: FakeEngineConfig | None = None, **overrides: object) -> None:
        self.config = config or FakeEngineConfig()
        for key, value in overrides.items():
            if not hasattr(self.config, key):
                raise TypeError(f"unknown FakeEngine option {key!r}")
            setattr(self.config, key, value)
        self.sample_rate = self.config.sample_rate
        self.log = FakeEngineLog(self.config.log_limit)
        self.started = False
        self.closed = False
        self.segments = 0  # segments started
        self._death: str | None = None
        self._abort_events: dict[str, asyncio.Event] = {}

    def voices(self) -> list[VoiceInfo]:
        return [VoiceInfo(v, description="test tone") for v in self.config.voices]

    def length(self, request: SegmentRequest) -> int:
        """Samples in a segment's audio."""
        cfg = self.config
        if request.fixed_rows is not None:
            return request.fixed_rows * FRAME_SAMPLES * cfg.sample_rate // SAMPLE_RATE
        seconds = max(cfg.min_seconds, len(request.text) * cfg.seconds_per_char)
        return int(seconds / max(request.speed, 1e-3) * cfg.sample_rate)

    def render(
        self, request: SegmentRequest, start: int = 0, stop: int | None = None
    ) -> np.ndarray:
        """Samples ``[start, stop)`` of a segment's audio (all of it by default):
        exactly what the stream concatenates to.

        Streams render one chunk at a time, so a long segment never holds its
        whole audio (large short-lived arrays are what fragments a heap).
        """
        cfg = self.config
        stop = self.length(request) if stop is None else min(stop, self.length(request))
        pitch = segment_pitch_hz(request.text)
        if pitch.is_integer():
            # Indexing one period costs a copy instead of a sine per sample: load
            # runs render hundreds of segments a second in the gateway's process.
            table = _tone_period(int(pitch), cfg.sample_rate, cfg.amplitude)
            return table[np.arange(start, stop) % len(table)]
        return _tone(pitch, cfg.sample_rate, cfg.amplitude, stop, start)

    def failure(self) -> str | None:
        """Why the engine is dead, or None while it lives (the gateway's health watch)."""
        return self._death

    def die(self, reason: str = "injected engine death") -> None:
        """Die now: running segments raise ``EngineDeadError``, later ones at once."""
        if self._death is None:
            self._death = reason
        for event in self._abort_events.values():
            event.set()  # wake every running segment so it sees the death

    def _fault(self, index: int) -> str | None:
        """The fault due for the segment started ``index``-th (0-based), if any."""
        cfg = self.config
        for name, after in (
            ("die", cfg.die_after_segments),
            ("fail", cfg.fail_after_segments),
            ("hang", cfg.hang_after_segments),
        ):
            if after is not None and index >= after:
                return name
        return None

    def _raise_if_dead(self, request_id: str) -> None:
        if self._death is not None:
            self.log.failed.append(request_id)
            raise EngineDeadError(f"the fake engine is dead: {self._death}")

    async def synthesize(self, request: SegmentRequest) -> AsyncIterator[np.ndarray]:
        cfg = self.config
        self.log.requests.append(request)
        self._raise_if_dead(request.request_id)
        # A cloned voice travels as its reference; the tone ignores it.
        if request.reference is None and request.voice not in cfg.voices:
            self.log.failed.append(request.request_id)
            raise UnsupportedVoiceError(f"unknown voice {request.voice!r}")
        fault = self._fault(self.segments)
        self.segments += 1
        aborted = self._abort_events.setdefault(request.request_id, asyncio.Event())
        timings = request.timings
        try:
            if timings is not None:
                timings.mark("submitted")
            if fault == "die":
                self.die(f"died after {cfg.die_after_segments} segments")
            elif fault == "fail":
                self.log.failed.append(request.request_id)
                raise EngineError(f"injected failure in {request.request_id}")
            elif fault == "hang":
                await aborted.wait()  # nothing, ever, until aborted
            self._raise_if_dead(request.request_id)
            total = self.length(request)
            if await self._sleep_unless(aborted, cfg.first_chunk_delay_s):
                self._raise_if_dead(request.request_id)
                self.log.stopped.append(request.request_id)
                return
            for index, start in enumerate(range(0, total, cfg.chunk_samples)):
                failing = cfg.fail_on is not None and cfg.fail_on in request.text
                if failing and index >= cfg.fail_after_chunks:
                    self.log.failed.append(request.request_id)
                    raise EngineError(f"injected failure in {request.request_id}")
                chunk = self.render(request, start, start + cfg.chunk_samples)
                if index and await self._sleep_unless(
                    aborted, len(chunk) / cfg.sample_rate * cfg.realtime_factor
                ):
                    self._raise_if_dead(request.request_id)
                    self.log.stopped.append(request.request_id)
                    return
                self._raise_if_dead(request.request_id)
                if aborted.is_set():
                    self.log.stopped.append(request.request_id)
                    return
                if timings is not None:
                    timings.mark("first_chunk")
                yield chunk
                self._raise_if_dead(request.request_id)
                if aborted.is_set():
                    # The consumer resumed us after aborting: it must not get more.
                    self.log.stopped.append(request.request_id)
                    return
            self.log.finished.append(request.request_id)
        except (GeneratorExit, asyncio.CancelledError):
            if aborted.is_set():
                self.log.stopped.append(request.request_id)
            else:
                self.log.abandoned.append(request.request_id)
            raise
        finally:
            self._abort_events.pop(request.request_id, None)

    @staticmethod
    async def _sleep_unless(event: asyncio.Event, seconds: float) -> bool:
        """Sleep ``seconds``; True when ``event`` fired meanwhile."""
        if seconds <= 0:
            await asyncio.sleep(0)
            return event.is_set()
        try:
            # A timeout scope, not wait_for: no extra task per chunk under load runs.
            async with asyncio.timeout(seconds):
                await event.wait()
        except TimeoutError:
            return False
        return True

    async def abort(self, request_id: str) -> None:
        event = self._abort_events.get(request_id)
        if event is not None and not event.is_set():
            self.log.aborted.append(request_id)
            event.set()

    @property
    def running(self) -> list[str]:
        return [rid for rid, ev in self._abort_events.items() if not ev.is_set()]

    async def start(self) -> None:
        if not self.started:
            await asyncio.sleep(self.config.start_delay_s)
            self.started = True

    async def close(self) -> None:
        for event in self._abort_events.values():
            event.set()
        self.closed = True
