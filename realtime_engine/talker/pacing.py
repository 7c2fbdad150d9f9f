"""Playback pacing: which audio streams sit out a decode step (no vLLM, no I/O).

A GPU talker generates audio several times faster than it plays: at 256
streams on one H100 each stream gets about 3.6 seconds of audio a second.
Every stream in the batch lengthens the decode step for all of them, and a
new stream's first audio is a fixed count of steps (the delay pattern and
its preset's first chunk, about 26 at every load), so past some batch size
the streams that are seconds ahead of their listeners make the newcomers
wait. Pacing caps the decode batch at ``max_decode_batch``: when more audio
streams are running, the ones with the most audio buffered ahead of
playback sit out the step, but only those with at least ``min_buffer_s`` of
it, so a stream near its listener's playback position always decodes, cap
or no cap. That is earliest-deadline-first among the streams: a stream's
deadline is the moment its listener runs out of audio, and a stream still
before its first chunk has none buffered at all.

The buffer is estimated from the engine's own clock, conservatively, so
that it is never more than what the listener holds: playback is taken to
start when the stream's first row was generated, which is earlier than its
first chunk can reach the listener, and of the audio generated, the frames
that may not have left in a chunk yet are not counted: the holdback and up
to a chunk's worth less one (:func:`unsent_frames_bound`).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from realtime_engine.format import DELAY_ROWS, FRAMES_PER_SECOND, ChunkingParams

# Off by default. Served at 256 streams (docs/bench/RESULTS.md sections 43-44),
# a cap of 160 cut TTFA p95 by a third and the audio made a second by a fifth on
# a slow H100, while on a faster one caps of 192 and 224 made p95 later: a choice
# to measure on the deployment's own hardware.
DEFAULT_MAX_DECODE_BATCH = 0
SUGGESTED_MAX_DECODE_BATCH = 160
DEFAULT_MIN_BUFFER_S = 1.0


class PacingConfigError(ValueError):
    """The pacing settings in the engine's configuration are malformed."""


@dataclass(frozen=True)
class PacingPolicy:
    """``max_decode_batch`` 0 (the default) turns pacing off."""

    max_decode_batch: int = DEFAULT_MAX_DECODE_BATCH
    min_buffer_s: float = DEFAULT_MIN_BUFFER_S

    def __post_init__(self) -> None:
        if self.max_decode_batch < 0:
            raise PacingConfigError(f"max_decode_batch must be >= 0, got {self.max_decode_batch}")
        if not self.min_buffer_s >= 0:
            raise PacingConfigError(f"min_buffer_s must be >= 0, got {self.min_buffer_s}")

    @classmethod
    def from_config(cls, raw: Mapping[str, Any] | None) -> PacingPolicy:
        """The policy in an engine's ``additional_config`` entry (missing fields default)."""
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise PacingConfigError(f"pacing settings must be an object, got {raw!r}")
        unknown = set(raw) - {"max_decode_batch", "min_buffer_s"}
        if unknown:
            raise PacingConfigError(f"unknown pacing settings: {sorted(unknown)}")
        try:
            return cls(
                max_decode_batch=int(raw.get("max_decode_batch", DEFAULT_MAX_DECODE_BATCH)),
                min_buffer_s=float(raw.get("min_buffer_s", DEFAULT_MIN_BUFFER_S)),
            )
        except (TypeError, ValueError) as e:
            raise PacingConfigError(f"bad pacing settings {dict(raw)!r}: {e}") from e

    @property
    def active(self) -> bool:
        return self.max_decode_batch > 0


def unsent_frames_bound(chunking: ChunkingParams) -> int:
    """The most complete frames a stream with these chunking settings can have
    generated and not yet sent: the holdback, plus less than one chunk (a
    chunk leaves as soon as the frames past the holdback make it whole, and
    no chunk is longer than ``chunk_frames``, nor the first than
    ``first_chunk_frames``)."""
    largest = max(chunking.chunk_frames, chunking.first_chunk_frames)
    return chunking.right_holdback_frames + largest - 1


class RunningStream(NamedTuple):
    """One running request as pacing sees it: ``rows`` generated so far, the
    engine-clock time its first row came (``None`` before it has one), and
    for audio, :func:`unsent_frames_bound` of its chunking (``None``: rows
    for a tool, never paced). A tuple: the scheduler builds one per running
    request every step."""

    rows: int
    first_row_at: float | None
    unsent_frames: int | None = 0


def buffered_s(stream: RunningStream, now: float) -> float:
    """Seconds of audio sent ahead of the (earliest possible) playback
    position, at the least; negative for a stream behind real time."""
    if stream.first_row_at is None:
        return 0.0
    sent = max(0, stream.rows - DELAY_ROWS - (stream.unsent_frames or 0))
    return sent / FRAMES_PER_SECOND - (now - stream.first_row_at)


def streams_to_hold(
    policy: PacingPolicy, running: Sequence[tuple[int, float | None, int | None]], now: float
) -> list[int]:
    """Indices into ``running`` (:class:`RunningStream` or plain tuples of its
    fields) of the streams that sit out this step: the most-buffered audio
    streams above ``min_buffer_s``, as many as bring the batch down to
    ``max_decode_batch`` (fewer when not enough are buffered)."""
    excess = len(running) - policy.max_decode_batch
    if not policy.active or excess <= 0:
        return []
    floor = policy.min_buffer_s
    ahead = []
    # buffered_s inlined: this runs over every running request at every step.
    for i, (rows, first_row_at, unsent) in enumerate(running):
        if unsent is not None and first_row_at is not None:
            sent = max(0, rows - DELAY_ROWS - unsent)
            seconds = sent / FRAMES_PER_SECOND - (now - first_row_at)
            if seconds >= floor:
                ahead.append((seconds, -i))
    # The most buffered first; among equals, the earliest in the running list.
    return sorted(-neg_i for _, neg_i in heapq.nlargest(excess, ahead))
