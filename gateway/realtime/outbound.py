"""The session's single, bounded, ordered queue towards the socket.

Workers and the reader put items; the writer takes them one by one. Rules
that depend on *sending* live here, at the moment of sending: frames of a
cancelled context are dropped, TTFA and ``audio_ms_sent`` are measured, and
``context.done`` / ``context.cancelled`` are built only when their turn
comes, so they report exactly what the client received before them.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Literal, Protocol

from pydantic import BaseModel

from gateway.metrics import GatewayMetrics
from gateway.protocol import ContextCancelled, ContextDone, ErrorEvent, dump_event
from gateway.realtime.context_stats import ContextStats


class ContextWorker(Protocol):
    """What the writer reads of a context's worker (``gateway.realtime.contexts.ContextWorker``)."""

    @property
    def context_id(self) -> str: ...
    @property
    def cancelled(self) -> bool: ...
    @property
    def stats(self) -> ContextStats: ...


@dataclass(frozen=True, slots=True)
class OutAudio:
    worker: ContextWorker
    data: str | bytes  # a binary frame, or an audio.delta JSON event
    duration_ms: float


@dataclass(frozen=True, slots=True)
class OutEvent:
    event: BaseModel
    worker: ContextWorker | None = None  # set: dropped once that context is cancelled


@dataclass(frozen=True, slots=True)
class OutDone:
    worker: ContextWorker
    status: Literal["completed", "failed"]
    reply_to: str | None


@dataclass(frozen=True, slots=True)
class OutCancelled:
    worker: ContextWorker
    reply_to: str | None
    unspoken_tail: str


@dataclass(frozen=True, slots=True)
class OutClose:
    code: int
    reason: str


OutItem = OutAudio | OutEvent | OutDone | OutCancelled | OutClose
Outgoing = str | bytes | OutClose


class Outbound:
    def __init__(self, maxsize: int, metrics: GatewayMetrics) -> None:
        self._queue: asyncio.Queue[OutItem] = asyncio.Queue(maxsize)
        self._metrics = metrics
        metrics.track_outbound_queue(self)
        self.last_audio_at = time.perf_counter()

    def qsize(self) -> int:
        return self._queue.qsize()

    async def put(self, item: OutItem) -> None:
        await self._queue.put(item)

    async def get(self) -> Outgoing:
        """The next message to send (skipping what must no longer be sent)."""
        while True:
            item = await self._queue.get()
            message = self._render(item)
            if message is not None:
                return message

    def drain(self) -> None:
        """Forget everything queued (the connection is gone)."""
        while not self._queue.empty():
            self._queue.get_nowait()

    def _render(self, item: OutItem) -> Outgoing | None:
        if isinstance(item, OutAudio):
            return self._audio(item)
        if isinstance(item, OutEvent):
            if item.worker is not None and item.worker.cancelled:
                return None
            if isinstance(item.event, ErrorEvent):
                self._metrics.error(item.event.error.type, item.event.error.code)
            return dump_event(item.event)
        if isinstance(item, OutDone):
            if item.worker.cancelled:
                return None
            stats = item.worker.stats
            done = ContextDone(
                context_id=item.worker.context_id,
                status=item.status,
                audio_ms=round(stats.sent_ms),
                metrics=stats.metrics(),
                reply_to=item.reply_to,
            )
            return dump_event(done)
        if isinstance(item, OutCancelled):
            stats = item.worker.stats
            spoken, unspoken = stats.spoken_split(item.unspoken_tail)
            cancelled = ContextCancelled(
                context_id=item.worker.context_id,
                audio_ms_sent=round(stats.sent_ms),
                text_spoken=spoken,
                text_unspoken=unspoken,
                reply_to=item.reply_to,
            )
            return dump_event(cancelled)
        return item

    def _audio(self, item: OutAudio) -> Outgoing | None:
        worker = item.worker
        if worker.cancelled:
            return None  # the guarantee: nothing of a cancelled context after the cancel
        now = time.perf_counter()
        stats = worker.stats
        if stats.first_sent_at is None:
            stats.first_sent_at = now
            if stats.first_ready_at is not None:
                self._metrics.ttfa_seconds.observe(now - stats.first_ready_at)
                self._metrics.observe_stages(stats.stage_seconds())
        stats.sent_ms += item.duration_ms
        self.last_audio_at = now
        self._metrics.audio_seconds_out.inc(item.duration_ms / 1000)
        return item.data
