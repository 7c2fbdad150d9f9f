"""Runs one session: executes the state machine's actions with asyncio.

The WebSocket handler feeds it messages (``receive_text``/``receive_bytes``)
and sends what ``next_message`` returns; everything in between (context
workers, timers, voice creation, cancel ordering) happens here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from gateway.auth import ANONYMOUS
from gateway.availability import refusal
from gateway.protocol import (
    CLOSE_NORMAL,
    CLOSE_SERVER_ERROR,
    ErrorCode,
    ErrorDetail,
    SessionConfig,
    VoiceCreated,
    voice_store_unavailable,
)
from gateway.realtime.contexts import ContextWorker
from gateway.realtime.outbound import Outbound, OutCancelled, OutClose, OutEvent, Outgoing
from gateway.realtime.session import (
    Action,
    CancelContext,
    Close,
    ContextQuota,
    CreateVoice,
    EndContext,
    Flush,
    OpenContext,
    Segmenter,
    Send,
    Session,
    Speak,
    error_event,
    requested_voice,
)
from gateway.state import GatewayState
from gateway.voice_backends import VoiceStoreError
from realtime_engine.engines.base import UnsupportedVoiceError

SegmenterFactory = Callable[[SessionConfig], Segmenter]
log = logging.getLogger("gateway.realtime.pipeline")


class KeyContextQuota:
    """Per-key context limit backed by the process-wide admission counters."""

    def __init__(self, state: GatewayState, key_id: str) -> None:
        self._state = state
        self._key_id = key_id

    def acquire(self) -> bool:
        return self._state.admission.try_open_context(self._key_id)

    def release(self) -> None:
        self._state.admission.close_context(self._key_id)


class SessionPipeline:
    def __init__(
        self,
        state: GatewayState,
        config: SessionConfig,
        segmenter_factory: SegmenterFactory,
        quota: ContextQuota | None = None,
        key_id: str = ANONYMOUS,
    ) -> None:
        self.state = state
        self.session_id = config.id
        self.key_id = key_id  # voices are per API key
        self.session = Session(
            config,
            state.settings.limits,
            segmenter_factory,
            lambda voice_id: state.voices.has(voice_id, key_id),
            quota,
        )
        self.outbound = Outbound(state.settings.outbound_queue_items, state.metrics)
        self.workers: dict[int, ContextWorker] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._ticker: asyncio.Task[None] | None = None
        self.last_message_at = time.perf_counter()
        self.closing = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.state.sessions.add(self)
        await self._execute(self.session.start())
        self._ticker = asyncio.create_task(self._tick_loop(), name=f"ticker-{self.session_id}")

    async def aclose(self) -> None:
        """The connection is gone: abort every engine request, stop every task.

        Safe under cancellation: if an abort is interrupted, the tasks are
        still cancelled and the bookkeeping already done.
        """
        self.closing = True
        self.state.sessions.discard(self)
        workers = list(self.workers.values())
        try:
            for worker in workers:
                await self._stop_worker(worker, "cancelled")
        finally:
            pending: list[asyncio.Task[None]] = [*self._tasks]
            if self._ticker is not None:
                pending.append(self._ticker)
            pending += [w.task for w in workers if w.task is not None]
            for task in pending:
                task.cancel()
            self.outbound.drain()
        await asyncio.gather(*pending, return_exceptions=True)

    # ------------------------------------------------------------------ process events

    @property
    def open_context_count(self) -> int:
        return len(self.workers)

    async def fail_contexts(self, detail: ErrorDetail) -> None:
        """The engine died: every open context fails now with ``detail``."""
        await asyncio.gather(*(w.fail_now(detail) for w in list(self.workers.values())))

    async def shut_down(self, detail: ErrorDetail, code: int) -> None:
        """The drain ran out of time: cancel what is open with ``detail``, then close."""
        for worker in list(self.workers.values()):
            await self._stop_worker(worker, "cancelled")
            cancelled = detail.model_copy(update={"context_id": worker.context_id})
            await self.outbound.put(OutEvent(error_event(cancelled)))
        if not self.closing:
            self.closing = True
            await self.outbound.put(OutClose(code, detail.code))

    # ------------------------------------------------------------------ socket side

    async def receive_text(self, data: str) -> None:
        now = time.perf_counter()
        self.last_message_at = now
        # New contexts are refused while draining or after the engine died.
        self.session.refusal = refusal(self.state)
        if (voice_id := requested_voice(data, self.state.settings.limits)) is not None:
            await self._refresh_voice(voice_id)
        await self._execute(self.session.receive_text(data, now))
        self._wake.set()

    async def receive_bytes(self, data: bytes) -> None:
        now = time.perf_counter()
        self.last_message_at = now
        await self._execute(self.session.receive_bytes(data, now))

    async def next_message(self) -> Outgoing:
        return await self.outbound.get()

    def idle_for(self, now: float) -> float:
        return now - max(self.last_message_at, self.outbound.last_audio_at)

    # ------------------------------------------------------------------ actions

    async def _execute(self, actions: list[Action]) -> None:
        for action in actions:
            match action:
                case Send(event=event):
                    await self.outbound.put(OutEvent(event))
                case OpenContext():
                    self._open(action)
                case Speak() | Flush() | EndContext():
                    worker = self.workers.get(action.key)
                    if worker is not None and not worker.finished:
                        worker.submit(action)
                case CancelContext():
                    await self._cancel(action)
                case CreateVoice():
                    self._spawn(self._create_voice(action))
                case Close(code=code, reason=reason):
                    self.closing = True
                    await self.outbound.put(OutClose(code, reason))

    def _open(self, spec: OpenContext) -> None:
        settings = self.state.settings
        worker = ContextWorker(
            spec,
            self.session_id,
            self.state.engine,
            self.outbound,
            max_lead_s=settings.limits.max_lead_s,
            encode_inline_max_ms=settings.encode_inline_max_ms,
            encode_pool=self.state.encode_pool,
            stall_timeout_s=settings.engine_stall_timeout_s,
            read_ahead_s=settings.read_ahead_s,
            on_closed=self._worker_closed,
            on_queue_change=self.state.metrics.queue_depth.inc,
            resolve_voice=lambda voice_id: self.state.voices.reference(voice_id, self.key_id),
        )
        self.workers[spec.key] = worker
        self.state.metrics.contexts_active.inc()
        worker.start()

    def _worker_closed(self, worker: ContextWorker, status: str) -> None:
        """A worker finished by itself (completed or failed)."""
        self.workers.pop(worker.key, None)
        self.state.metrics.contexts_active.dec()
        self.state.metrics.contexts_total.labels(status=status).inc()
        self.session.context_closed(worker.key, "failed" if status == "failed" else "completed")

    async def _cancel(self, action: CancelContext) -> None:
        worker = self.workers.get(action.key)
        if worker is None:
            return
        await self._stop_worker(worker, "cancelled")
        await self.outbound.put(OutCancelled(worker, action.reply_to, action.unspoken_tail))

    async def _stop_worker(self, worker: ContextWorker, status: str) -> None:
        # Order matters: the flag first (the writer drops this context's frames
        # from here on), then the engine abort (while the request still runs),
        # then the task.
        worker.cancelled = True
        worker.discard_queued()
        if not worker.finished:
            worker.finished = True
            self.workers.pop(worker.key, None)
            self.state.metrics.contexts_active.dec()
            self.state.metrics.contexts_total.labels(status=status).inc()
            self.session.context_closed(worker.key, "cancelled")
        try:
            if worker.current_request is not None:
                await self.state.engine.abort(worker.current_request)
        finally:
            if worker.task is not None:
                worker.task.cancel()

    # ------------------------------------------------------------------ background work

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _refresh_voice(self, voice_id: str) -> None:
        """Look the voice up in the store first: it may have been made on another replica."""
        try:
            await self.state.voices.refresh(voice_id, self.key_id)
        except VoiceStoreError as e:
            log.warning("voice lookup failed; using what this replica last saw: %s", e)

    async def _create_voice(self, action: CreateVoice) -> None:
        try:
            created = await self.state.voices.create(
                action.audio, action.text, action.voice_id, self.key_id
            )
        except UnsupportedVoiceError as e:
            await self._send_error(ErrorCode.VOICE_UNSUPPORTED, str(e), action.reply_to)
        except VoiceStoreError as e:
            detail = voice_store_unavailable(str(e), reply_to=action.reply_to)
            await self.outbound.put(OutEvent(error_event(detail)))
        except ValueError as e:
            param = getattr(e, "param", None)
            await self._send_error(ErrorCode.VOICE_INVALID, str(e), action.reply_to, param=param)
        except Exception as e:
            log.error("voice creation failed", exc_info=e)
            detail = ErrorDetail(
                type="server_error",
                code=ErrorCode.INTERNAL_ERROR,
                message=f"voice creation failed: {type(e).__name__}: {e}",
                reply_to=action.reply_to,
            )
            await self.outbound.put(OutEvent(error_event(detail)))
        else:
            event = VoiceCreated(
                voice_id=created.voice_id,
                duration_s=round(created.duration_s, 3),
                frames=created.frames,
                cached=created.cached,
                reply_to=action.reply_to,
            )
            await self.outbound.put(OutEvent(event))

    async def _send_error(
        self, code: ErrorCode, message: str, reply_to: str | None, param: str | None = None
    ) -> None:
        detail = ErrorDetail(
            type="invalid_request_error",
            code=code,
            message=message,
            param=param,
            reply_to=reply_to,
        )
        await self.outbound.put(OutEvent(error_event(detail)))

    async def _tick_loop(self) -> None:
        """Segmenter deadlines (auto mode) and the idle timeout."""
        idle_timeout = self.state.settings.limits.idle_timeout_s
        try:
            while not self.closing:
                now = time.perf_counter()
                deadline = now + max(0.0, idle_timeout - self.idle_for(now))
                segment_deadline = self.session.next_deadline()
                if segment_deadline is not None:
                    deadline = min(deadline, segment_deadline)
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), max(0.0, deadline - now))
                now = time.perf_counter()
                await self._execute(self.session.poll(now))
                if self.idle_for(now) >= idle_timeout and not self.workers_busy():
                    self.closing = True
                    await self.outbound.put(OutClose(CLOSE_NORMAL, "idle timeout"))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a broken timer must not leave the session hanging
            self.closing = True
            await self.outbound.put(OutClose(CLOSE_SERVER_ERROR, f"internal error: {e}"[:120]))

    def workers_busy(self) -> bool:
        """Audio is still being made: not idle even if nothing was sent yet."""
        return any(w.busy for w in self.workers.values())
