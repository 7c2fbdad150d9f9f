"""Prometheus metrics for one gateway (its own registry, so apps never collide)."""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping, Sequence
from typing import Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

_LATENCY_BUCKETS = (0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0)
_STEP_BUCKETS = (0.001, 0.002, 0.004, 0.006, 0.008, 0.012, 0.02, 0.04, 0.08, 0.2)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
# Stages start at sub-millisecond queueing, so finer than the TTFA buckets at the low end.
_STAGE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, *_LATENCY_BUCKETS)
# The loop should wake within a millisecond; hundreds mean every session waits.
_LOOP_LAG_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def batch_bucket(batch_size: float) -> str:
    """The power-of-two range a (mean) batch size falls in: ``1``, ``2``, ``3-4``, ``5-8``…"""
    size = max(1, math.ceil(batch_size))
    upper = 1 << (size - 1).bit_length()
    if upper <= 2:
        return str(upper)
    if upper > _BATCH_BUCKETS[-1]:
        return f">{_BATCH_BUCKETS[-1]}"
    return f"{upper // 2 + 1}-{upper}"


class GatewayMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.sessions_active = Gauge(
            "speech_sessions_active", "Open WebSocket sessions", registry=r
        )
        self.sessions_total = Counter("speech_sessions", "WebSocket sessions accepted", registry=r)
        self.sessions_refused = Counter(
            "speech_sessions_refused", "WebSocket sessions refused", ["reason"], registry=r
        )
        self.contexts_active = Gauge("speech_contexts_active", "Open contexts", registry=r)
        self.contexts_total = Counter(
            "speech_contexts", "Finished contexts by outcome", ["status"], registry=r
        )
        self.ttfa_seconds = Histogram(
            "speech_ttfa_seconds",
            "First segment speakable to first audio frame sent",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.stage_seconds = Histogram(
            "speech_stage_seconds",
            "First segment speakable to each first-audio stage "
            "(queue, prefill, first_row, first_frame_row, first_chunk, encoded, ttfa)",
            ["stage"],
            buckets=_STAGE_BUCKETS,
            registry=r,
        )
        self.event_loop_lag_seconds = Histogram(
            "speech_event_loop_lag_seconds",
            "How late the event loop ran a timer (every session's I/O waits this long)",
            buckets=_LOOP_LAG_BUCKETS,
            registry=r,
        )
        self.engine_step_seconds = Histogram(
            "speech_engine_step_seconds",
            "Engine decode step time",
            buckets=_STEP_BUCKETS,
            registry=r,
        )
        self.engine_step_seconds_by_batch = Histogram(
            "speech_engine_step_seconds_by_batch",
            "Engine decode step time by the batch size it ran at (power-of-two ranges)",
            ["batch"],
            buckets=_STEP_BUCKETS,
            registry=r,
        )
        self.engine_batch_size = Histogram(
            "speech_engine_batch_size",
            "Requests per engine step",
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.engine_steps = Counter(
            "speech_engine_steps",
            "Engine sampling steps (each one a row for every request in its batch)",
            registry=r,
        )
        # Against speech_talker_audio_seconds: rows the talker made that never
        # became audio (a request stopped before its rows were decoded).
        self.engine_rows = Counter(
            "speech_engine_rows",
            "Code rows the talker made, one per request per step (40 ms of audio each; "
            "a request's first 7 rows complete no frame)",
            registry=r,
        )
        self.queue_depth = Gauge(
            "speech_queue_depth", "Segments waiting for the engine", registry=r
        )
        self.engine_waiting = Gauge(
            "speech_engine_waiting_requests", "Requests queued inside the engine", registry=r
        )
        self.outbound_queue_depth = Gauge(
            "speech_outbound_queue_depth", "Frames and events waiting for sockets", registry=r
        )
        # Read at scrape time from the live queues rather than counted on every
        # put and get: a gauge update takes a lock, and this one would be
        # updated twice per audio frame.
        self._outbound_queues: weakref.WeakSet[SizedQueue] = weakref.WeakSet()
        self.outbound_queue_depth.set_function(self._outbound_depth)
        self.audio_seconds_out = Counter(
            "speech_audio_seconds_out", "Audio seconds sent to clients", registry=r
        )
        self.errors_total = Counter(
            "speech_errors", "Error events sent, by type and code", ["type", "code"], registry=r
        )
        self.engine_up = Gauge(
            "speech_engine_up", "1 while the engine is started and alive, else 0", registry=r
        )
        self.engine_deaths = Counter(
            "speech_engine_deaths", "Times the engine died while serving", registry=r
        )
        self.draining = Gauge(
            "speech_draining", "1 while the server drains before shutting down", registry=r
        )
        # Data-parallel talkers: one engine core per rank, each sending its own audio.
        self.talker_streams = Counter(
            "speech_talker_streams",
            "Talker streams served, by data-parallel rank",
            ["rank"],
            registry=r,
        )
        self.talker_active_streams = Gauge(
            "speech_talker_active_streams",
            "Talker streams running, by data-parallel rank (known from their first chunk)",
            ["rank"],
            registry=r,
        )
        self.talker_chunks = Counter(
            "speech_talker_chunks",
            "Audio chunks from the talker, by data-parallel rank",
            ["rank"],
            registry=r,
        )
        self.talker_audio_seconds = Counter(
            "speech_talker_audio_seconds",
            "Audio seconds from the talker, by data-parallel rank",
            ["rank"],
            registry=r,
        )
        self.talker_first_chunk_seconds = Histogram(
            "speech_talker_first_chunk_seconds",
            "Talker request start to its first audio chunk, by data-parallel rank",
            ["rank"],
            buckets=_STAGE_BUCKETS,
            registry=r,
        )

    def track_outbound_queue(self, queue: SizedQueue) -> None:
        """Count ``queue``'s items in ``outbound_queue_depth`` for as long as it lives."""
        self._outbound_queues.add(queue)

    def _outbound_depth(self) -> float:
        return float(sum(queue.qsize() for queue in list(self._outbound_queues)))

    def observe_stages(self, stages: Mapping[str, float]) -> None:
        """One context's first-audio stages (seconds after its first segment was speakable)."""
        for stage, seconds in stages.items():
            self.stage_seconds.labels(stage=stage).observe(seconds)

    def error(self, error_type: str, code: str) -> None:
        self.errors_total.labels(type=error_type, code=code).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class SizedQueue(Protocol):
    def qsize(self) -> int: ...


class RunnerStatsLike(Protocol):
    """Cumulative counters an engine may expose as ``engine.stats()``."""

    @property
    def steps(self) -> int: ...

    @property
    def rows(self) -> int: ...

    @property
    def mean_step_s(self) -> float: ...

    @property
    def waiting(self) -> int | None: ...  # None: the engine does not know


class RankCountersLike(Protocol):
    @property
    def streams(self) -> int: ...

    @property
    def active(self) -> int: ...

    @property
    def chunks(self) -> int: ...

    @property
    def audio_seconds(self) -> float: ...


class RankReportLike(Protocol):
    """What an engine with data-parallel talker ranks reports as ``engine.rank_stats()``."""

    @property
    def counters(self) -> Mapping[int, RankCountersLike]: ...

    @property
    def first_chunk_s(self) -> Sequence[tuple[int, float]]: ...


class RankStatsSampler:
    """Turns cumulative per-rank talker counters into ``rank``-labelled metrics."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self._metrics = metrics
        self._seen: dict[int, tuple[int, int, float]] = {}

    def observe(self, report: RankReportLike) -> None:
        m = self._metrics
        for rank, c in report.counters.items():
            label = str(rank)
            streams, chunks, seconds = self._seen.get(rank, (0, 0, 0.0))
            m.talker_streams.labels(rank=label).inc(max(0, c.streams - streams))
            m.talker_chunks.labels(rank=label).inc(max(0, c.chunks - chunks))
            m.talker_audio_seconds.labels(rank=label).inc(max(0.0, c.audio_seconds - seconds))
            m.talker_active_streams.labels(rank=label).set(c.active)
            self._seen[rank] = (c.streams, c.chunks, c.audio_seconds)
        for rank, seconds in report.first_chunk_s:
            m.talker_first_chunk_seconds.labels(rank=str(rank)).observe(seconds)


class EngineStatsSampler:
    """Turns cumulative runner counters into step-time and batch-size samples.

    Each ``observe`` records the mean step time and mean batch size since the
    previous call (one histogram sample per interval, not per step), and the
    step time again under that batch size's range, for step time vs batch.
    """

    def __init__(self, metrics: GatewayMetrics) -> None:
        self._metrics = metrics
        self._steps = 0
        self._total_s = 0.0
        self._rows = 0

    def observe(self, stats: RunnerStatsLike) -> None:
        total_s = stats.mean_step_s * stats.steps
        new_steps = stats.steps - self._steps
        if new_steps > 0:
            step_s = (total_s - self._total_s) / new_steps
            batch = (stats.rows - self._rows) / new_steps
            self._metrics.engine_step_seconds.observe(step_s)
            self._metrics.engine_batch_size.observe(batch)
            by_batch = self._metrics.engine_step_seconds_by_batch
            by_batch.labels(batch=batch_bucket(batch)).observe(step_s)
            self._metrics.engine_steps.inc(new_steps)
        if stats.rows > self._rows:  # fewer: a restarted engine's counters
            self._metrics.engine_rows.inc(stats.rows - self._rows)
        self._steps, self._total_s, self._rows = stats.steps, total_s, stats.rows
        if stats.waiting is not None:
            self._metrics.engine_waiting.set(stats.waiting)


class EnginePoller:
    """Reads an engine's optional ``stats()`` and ``rank_stats()`` counters into the metrics."""

    def __init__(self, metrics: GatewayMetrics, engine: object) -> None:
        stats, ranks = getattr(engine, "stats", None), getattr(engine, "rank_stats", None)
        self._stats = stats if callable(stats) else None
        self._ranks = ranks if callable(ranks) else None
        self._steps = EngineStatsSampler(metrics)
        self._by_rank = RankStatsSampler(metrics)

    @property
    def active(self) -> bool:
        return self._stats is not None or self._ranks is not None

    def poll(self) -> None:
        current = self._stats() if self._stats is not None else None
        if current is not None:
            self._steps.observe(current)
        report = self._ranks() if self._ranks is not None else None
        if report is not None:
            self._by_rank.observe(report)
