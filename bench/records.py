"""What one stream recorded, and what is derived from it.

All times are seconds on one monotonic clock (``time.perf_counter``) shared
by every stream of a run, so that streams can be placed in one measurement
window. ``None`` marks an event that never happened.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.playback import DEFAULT_UNDERRUN_THRESHOLD_S, simulate


@dataclass(frozen=True)
class ChunkArrival:
    t_s: float  # arrival on the client clock
    pts_ms: float  # start of this chunk on the stream's audio timeline
    duration_ms: float
    nbytes: int


@dataclass
class StreamRecord:
    stream_id: int
    target: str  # "gateway" or "peer"
    text_chars: int
    t_start: float  # the client began (before connecting)
    t_connected: float | None = None  # session ready / response headers
    t_first_text: float | None = None  # first text left the client
    t_last_text: float | None = None  # last text (and end of input) left the client
    t_first_audio_byte: float | None = None
    t_first_sample: float | None = None  # first decoded PCM sample available
    t_done: float | None = None  # end of the stream's audio (context.done / EOF)
    chunks: list[ChunkArrival] = field(default_factory=list)
    server_metrics: dict[str, Any] | None = None
    segments: list[tuple[int, str]] = field(default_factory=list)  # (start_ms, text)
    error: str | None = None
    tags: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.chunks) and self.t_done is not None

    def to_json(self, t0: float = 0.0) -> dict[str, Any]:
        """Plain data with times as seconds since ``t0``; chunks as
        ``[t_s, pts_ms, duration_ms, nbytes]`` rows."""
        out = asdict(self)
        for key, value in out.items():
            if key.startswith("t_") and isinstance(value, float):
                out[key] = round(value - t0, 6)
        out["chunks"] = [
            [round(c.t_s - t0, 6), c.pts_ms, c.duration_ms, c.nbytes] for c in self.chunks
        ]
        return out


@dataclass(frozen=True)
class StreamMetrics:
    """Per-stream numbers the reports aggregate (seconds unless named ``_ms``)."""

    ok: bool
    connect_s: float | None
    ttfa_s: float | None  # first text sent -> first audio byte
    ttfa_decoded_s: float | None  # first text sent -> first decoded sample
    server_ttfa_ms: float | None  # the server's own measure (context.done metrics)
    audio_s: float
    total_s: float | None  # first text sent -> done
    rtf: float | None  # generation time / audio time (< 1: faster than real time)
    chunks: int
    gaps_s: tuple[float, ...]  # inter-arrival times between consecutive chunks
    max_gap_s: float | None
    stalls: int
    stall_s: float
    underruns: int
    underrun_s: float
    min_lead_s: float | None
    # Audio already played when the first underrun began (None: no underrun):
    # near 0 the stream's opening chunks were late, later the steady cadence.
    first_underrun_audio_s: float | None = None


def _since(t: float | None, t0: float | None) -> float | None:
    return None if t is None or t0 is None else t - t0


def derive(
    record: StreamRecord,
    prebuffer_s: float = 0.0,
    underrun_threshold_s: float = DEFAULT_UNDERRUN_THRESHOLD_S,
) -> StreamMetrics:
    audio_s = math.fsum(c.duration_ms for c in record.chunks) / 1000.0
    report = simulate(
        [(c.t_s, c.duration_ms / 1000.0) for c in record.chunks], prebuffer_s, underrun_threshold_s
    )
    gaps = tuple(b.t_s - a.t_s for a, b in itertools.pairwise(record.chunks))
    total_s = _since(record.t_done, record.t_first_text)
    server_ttfa = (record.server_metrics or {}).get("ttfa_ms")
    first_underrun = None
    if report.underruns:
        before = record.chunks[: report.underruns[0].chunk_index]
        first_underrun = math.fsum(c.duration_ms for c in before) / 1000.0
    return StreamMetrics(
        ok=record.ok,
        connect_s=_since(record.t_connected, record.t_start),
        ttfa_s=_since(record.t_first_audio_byte, record.t_first_text),
        ttfa_decoded_s=_since(record.t_first_sample, record.t_first_text),
        server_ttfa_ms=float(server_ttfa) if isinstance(server_ttfa, int | float) else None,
        audio_s=audio_s,
        total_s=total_s,
        rtf=total_s / audio_s if total_s is not None and audio_s > 0 else None,
        chunks=len(record.chunks),
        gaps_s=gaps,
        max_gap_s=max(gaps) if gaps else None,
        stalls=len(report.stalls),
        stall_s=report.stall_s,
        underruns=len(report.underruns),
        underrun_s=report.underrun_s,
        min_lead_s=report.min_lead_s,
        first_underrun_audio_s=first_underrun,
    )


def audio_in_window(records: list[StreamRecord], t0: float, t1: float) -> float:
    """Seconds of audio whose chunks arrived within ``[t0, t1)``, over all streams."""
    return math.fsum(c.duration_ms for r in records for c in r.chunks if t0 <= c.t_s < t1) / 1000.0
