"""What a context learns while it speaks, for its ``context.done`` metrics.

``ContextStats`` is filled in by the context's worker (``gateway.realtime.contexts``)
and by the outbound writer (``gateway.realtime.outbound``); its first-audio stages also
feed the ``speech_stage_seconds`` histogram.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.protocol import ContextMetrics
from realtime_engine.engines.base import SegmentTimings

# First-audio stages, in order: (metrics / histogram name, SegmentTimings field).
ENGINE_STAGES = (
    ("queue", "submitted"),
    ("prefill", "prefilled"),
    ("first_row", "first_row"),
    ("first_frame_row", "first_frame_row"),
    ("first_chunk", "first_chunk"),
)


@dataclass
class ContextStats:
    """What the writer and the worker learn about a context, for its final events."""

    first_ready_at: float | None = None  # first segment speakable (loop clock)
    first_engine_at: float | None = None
    first_encoded_at: float | None = None  # the first chunk's frames are ready to queue
    first_sent_at: float | None = None
    first_timings: SegmentTimings | None = None  # of the segment that gave the first audio
    generation_s: float = 0.0  # wall time spent waiting on the engine
    generated_s: float = 0.0  # audio seconds produced
    sent_ms: float = 0.0
    first_segment_chars: int = 0
    segments_done: int = 0
    segment_texts: dict[int, str] = field(default_factory=dict)
    started_segments: set[int] = field(default_factory=set)

    def stage_seconds(self) -> dict[str, float]:
        """Each first-audio stage reached, in seconds after the first segment was speakable.

        Keys in stage order (``ENGINE_STAGES``, then ``encoded`` and ``ttfa``); a stage the
        engine does not report is absent. ``queue`` falls back to when the
        gateway called the engine, for engines that stamp nothing.
        """
        ready = self.first_ready_at
        if ready is None:
            return {}
        timings = self.first_timings or SegmentTimings()
        stamps: list[tuple[str, float | None]] = [
            (name, getattr(timings, field)) for name, field in ENGINE_STAGES
        ]
        if stamps[0][1] is None:
            stamps[0] = ("queue", self.first_engine_at)
        stamps.append(("encoded", self.first_encoded_at))
        stamps.append(("ttfa", self.first_sent_at))
        return {name: at - ready for name, at in stamps if at is not None}

    def metrics(self) -> ContextMetrics:
        stages = {name: round(s * 1000, 2) for name, s in self.stage_seconds().items()}
        rtf = round(self.generation_s / self.generated_s, 4) if self.generated_s > 0 else None
        return ContextMetrics(
            ttfa_ms=stages.get("ttfa"),
            queue_ms=stages.get("queue"),
            prefill_ms=stages.get("prefill"),
            first_row_ms=stages.get("first_row"),
            first_frame_row_ms=stages.get("first_frame_row"),
            first_chunk_ms=stages.get("first_chunk"),
            encoded_ms=stages.get("encoded"),
            rtf=rtf,
            first_segment_chars=self.first_segment_chars,
            segments=self.segments_done,
        )

    def spoken_split(self, unspoken_tail: str) -> tuple[str, str]:
        """Text whose audio started vs. text never voiced, at a cancel."""
        spoken = [t for i, t in sorted(self.segment_texts.items()) if i in self.started_segments]
        unspoken = [
            t for i, t in sorted(self.segment_texts.items()) if i not in self.started_segments
        ]
        return "".join(spoken), "".join(unspoken) + unspoken_tail
