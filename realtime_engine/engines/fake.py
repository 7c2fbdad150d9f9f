"""A deterministic engine for tests and load rehearsals: no model, checkable audio.

Each segment is a sine tone whose pitch derives from the segment text (so
audio from different segments is distinguishable) with a duration
proportional to its length. Timing (first-chunk delay, real-time factor),
chunk size and failures are configurable; aborts and requests are recorded
so tests can assert that cancelled work really stopped.
"""

from __future__ import annotations

import asyncio
import functools
import math
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import numpy as np

from realtime_engine.engines.base import (
    EngineError,
    SegmentRequest,
    UnsupportedVoiceError,
    VoiceInfo,
)
from realtime_engine.format import FRAME_SAMPLES, SAMPLE_RATE


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


@dataclass
class FakeEngineLog:
    requests: list[SegmentRequest] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)  # abort() calls for running requests
    finished: list[str] = field(default_factory=list)  # ran to the end
    stopped: list[str] = field(default_factory=list)  # stopped early by abort
    failed: list[str] = field(default_factory=list)
    # Closed by the consumer while running, without an abort: with a real
    # engine that work would have kept running.
    abandoned: list[str] = field(default_factory=list)


def segment_pitch_hz(text: str) -> float:
    return 200.0 + float(zlib.crc32(text.encode()) % 600)


@functools.lru_cache(maxsize=128)
def _tone_period(pitch_hz: int, sample_rate: int, amplitude: float) -> np.ndarray:
    """One period of a whole-hertz tone: ``sample_rate / gcd`` samples, at most one second."""
    period = sample_rate // math.gcd(pitch_hz, sample_rate)
    table = _tone(float(pitch_hz), sample_rate, amplitude, period)
    table.flags.writeable = False  # shared by every segment at this pitch
    return table


def _tone(pitch_hz: float, sample_rate: int, amplitude: float, n: int) -> np.ndarray:
    t = np.arange(n, dtype=np.float64) / sample_rate
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
        self.log = FakeEngineLog()
        self.started = False
        self.closed = False
        self._abort_events: dict[str, asyncio.Event] = {}

    def voices(self) -> list[VoiceInfo]:
        return [VoiceInfo(v, description="test tone") for v in self.config.voices]

    def render(self, request: SegmentRequest) -> np.ndarray:
        """The whole audio of a segment, exactly what the stream concatenates to."""
        cfg = self.config
        if request.fixed_rows is not None:
            n = request.fixed_rows * FRAME_SAMPLES * cfg.sample_rate // SAMPLE_RATE
        else:
            seconds = max(cfg.min_seconds, len(request.text) * cfg.seconds_per_char)
            n = int(seconds / max(request.speed, 1e-3) * cfg.sample_rate)
        pitch = segment_pitch_hz(request.text)
        if pitch.is_integer():
            # Tiling one period costs a copy instead of a sine per sample: load
            # runs render hundreds of segments a second in the gateway's process.
            return np.resize(_tone_period(int(pitch), cfg.sample_rate, cfg.amplitude), n)
        return _tone(pitch, cfg.sample_rate, cfg.amplitude, n)

    async def synthesize(self, request: SegmentRequest) -> AsyncIterator[np.ndarray]:
        cfg = self.config
        self.log.requests.append(request)
        if request.voice not in cfg.voices:
            self.log.failed.append(request.request_id)
            raise UnsupportedVoiceError(f"unknown voice {request.voice!r}")
        aborted = self._abort_events.setdefault(request.request_id, asyncio.Event())
        timings = request.timings
        try:
            if timings is not None:
                timings.mark("submitted")
            audio = self.render(request)
            if await self._sleep_unless(aborted, cfg.first_chunk_delay_s):
                self.log.stopped.append(request.request_id)
                return
            for index, start in enumerate(range(0, len(audio), cfg.chunk_samples)):
                failing = cfg.fail_on is not None and cfg.fail_on in request.text
                if failing and index >= cfg.fail_after_chunks:
                    self.log.failed.append(request.request_id)
                    raise EngineError(f"injected failure in {request.request_id}")
                chunk = audio[start : start + cfg.chunk_samples]
                if index and await self._sleep_unless(
                    aborted, len(chunk) / cfg.sample_rate * cfg.realtime_factor
                ):
                    self.log.stopped.append(request.request_id)
                    return
                if aborted.is_set():
                    self.log.stopped.append(request.request_id)
                    return
                if timings is not None:
                    timings.mark("first_chunk")
                yield chunk
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
