"""One WebSocket session as a sans-I/O state machine.

Messages go in (``receive_text``/``receive_bytes``, with the current time),
actions come out: events to send, contexts to open, segments to speak, flush /
end markers, cancels, voice creation, closing the connection. The context
pipeline executes the actions and reports back (``context_closed``); nothing
here touches sockets, tasks or clocks, so every rule is unit-testable.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ValidationError

from gateway.protocol import (
    CLOSE_POLICY,
    CLOSE_TOO_BIG,
    MAX_STREAM,
    READ_ONLY_SESSION_FIELDS,
    ContextCancel,
    ContextCreated,
    ContextEnd,
    ErrorCode,
    ErrorDetail,
    ErrorEvent,
    Limits,
    Ping,
    Pong,
    ProtocolError,
    SessionConfig,
    SessionCreated,
    SessionUpdate,
    SessionUpdated,
    TextAppend,
    TextFlush,
    VoiceCreate,
    apply_session_update,
    invalid_request,
    parse_client_event,
    validation_error_detail,
)
from gateway.protocol import decode_audio_payload as decode_audio_payload
from gateway.realtime.actions import Action as Action
from gateway.realtime.actions import CancelContext as CancelContext
from gateway.realtime.actions import Close as Close
from gateway.realtime.actions import ContextQuota as ContextQuota
from gateway.realtime.actions import CreateVoice as CreateVoice
from gateway.realtime.actions import EndContext as EndContext
from gateway.realtime.actions import Flush as Flush
from gateway.realtime.actions import OpenContext as OpenContext
from gateway.realtime.actions import Segmenter as Segmenter
from gateway.realtime.actions import SegmenterFactory as SegmenterFactory
from gateway.realtime.actions import Send as Send
from gateway.realtime.actions import Speak as Speak
from gateway.realtime.actions import Unlimited as Unlimited


@dataclass
class _Context:
    key: int
    context_id: str
    stream: int
    config: SessionConfig
    segmenter: Segmenter
    manual: bool
    state: Literal["open", "ending"] = "open"
    chars: int = 0
    segments: int = 0
    manual_buffer: list[str] = field(default_factory=list)
    flushes: int = 0


FinishedStatus = Literal["completed", "failed", "cancelled"]
_REMEMBERED_FINISHED = 4096


def error_event(detail: ErrorDetail) -> ErrorEvent:
    return ErrorEvent(reply_to=detail.reply_to, error=detail)


def requested_voice(data: str, limits: Limits) -> str | None:
    """The voice a ``session.update`` asks for, read ahead of the session so the
    pipeline can look it up in a shared voice store first; None for anything else."""
    if '"session.update"' not in data or len(data) > limits.max_message_bytes:
        return None
    try:
        event = parse_client_event(data)
    except ProtocolError:
        return None  # the session answers it
    if not isinstance(event, SessionUpdate):
        return None
    voice = event.session.get("voice")
    return voice if isinstance(voice, str) else None


class Session:
    def __init__(
        self,
        config: SessionConfig,
        limits: Limits,
        segmenter_factory: SegmenterFactory,
        voice_exists: Callable[[str], bool],
        quota: ContextQuota | None = None,
    ) -> None:
        self.config = config
        self.limits = limits
        self._segmenter_factory = segmenter_factory
        self._voice_exists = voice_exists
        self._quota = quota or Unlimited()
        self._contexts: dict[str, _Context] = {}
        self._by_key: dict[int, _Context] = {}
        self._finished: OrderedDict[str, FinishedStatus] = OrderedDict()
        self._next_key = 0
        self._next_stream = 0
        self.oversize_count = 0
        self.binary_count = 0
        self.closed = False
        # Set by the pipeline while new contexts are refused (draining, engine dead).
        self.refusal: ErrorDetail | None = None

    # ------------------------------------------------------------------ inputs

    def start(self) -> list[Action]:
        return [Send(SessionCreated(session=self.config, limits=self.limits))]

    def receive_bytes(self, data: bytes, now: float) -> list[Action]:
        """Binary frames carry nothing from clients in v1: an error, twice closes."""
        if self.closed:
            return []
        self.binary_count += 1
        detail = invalid_request(
            ErrorCode.BINARY_NOT_ALLOWED, "binary messages are not accepted from clients"
        )
        actions: list[Action] = [Send(error_event(detail))]
        if self.binary_count >= 2:
            actions.append(self._close(CLOSE_POLICY, "binary messages from client"))
        return actions

    def receive_text(self, data: str, now: float) -> list[Action]:
        if self.closed:
            return []
        limit = self.limits.max_message_bytes
        if len(data) > limit or (len(data) * 4 > limit and len(data.encode()) > limit):
            return self._oversize(len(data.encode()))
        try:
            event = parse_client_event(data)
        except ProtocolError as e:
            return [Send(error_event(e.detail))]
        match event:
            case TextAppend():
                return self._append(event, now)
            case TextFlush():
                return self._flush(event, now)
            case ContextEnd():
                return self._end(event, now)
            case ContextCancel():
                return self._cancel(event)
            case SessionUpdate():
                return self._update(event)
            case VoiceCreate():
                return self._voice_create(event)
            case Ping():
                return [Send(Pong(reply_to=event.event_id))]
        raise AssertionError(f"unhandled event {event!r}")  # pragma: no cover

    def poll(self, now: float) -> list[Action]:
        """Timers: auto-mode segments whose buffer delay has passed."""
        actions: list[Action] = []
        for ctx in list(self._contexts.values()):
            if not ctx.manual:
                actions += self._speak(ctx, ctx.segmenter.poll(now), now)
        return actions

    def next_deadline(self) -> float | None:
        deadlines = [
            d
            for ctx in self._contexts.values()
            if not ctx.manual and (d := ctx.segmenter.next_deadline()) is not None
        ]
        return min(deadlines, default=None)

    def context_closed(self, key: int, status: FinishedStatus) -> None:
        """The pipeline finished a context (done, failed or cancelled)."""
        ctx = self._by_key.pop(key, None)
        if ctx is None:
            return
        if self._contexts.get(ctx.context_id) is ctx:
            del self._contexts[ctx.context_id]
        self._remember_finished(ctx.context_id, status)
        self._quota.release()

    @property
    def open_contexts(self) -> list[str]:
        return list(self._contexts)

    # ------------------------------------------------------------------ handlers

    def _oversize(self, size: int) -> list[Action]:
        self.oversize_count += 1
        detail = invalid_request(
            ErrorCode.MESSAGE_TOO_BIG,
            f"message of {size} bytes exceeds max_message_bytes={self.limits.max_message_bytes}",
        )
        actions: list[Action] = [Send(error_event(detail))]
        if self.oversize_count >= 2:
            actions.append(self._close(CLOSE_TOO_BIG, "messages over max_message_bytes"))
        return actions

    def _append(self, event: TextAppend, now: float) -> list[Action]:
        ctx = self._contexts.get(event.context_id)
        actions: list[Action] = []
        if ctx is None:
            if self._finished.get(event.context_id) == "cancelled":
                return []  # late tokens after a barge-in are expected: dropped quietly
            if event.context_id in self._finished:
                return [self._error(ErrorCode.CONTEXT_ENDED, event, "the context has finished")]
            opened = self._open(event)
            if isinstance(opened, Send):
                return [opened]
            ctx, actions = opened
        if ctx.state == "ending":
            return [self._error(ErrorCode.CONTEXT_ENDED, event, "context.end was already sent")]
        if ctx.chars + len(event.text) > self.limits.max_text_chars_per_context:
            return [
                *actions,
                self._error(
                    ErrorCode.TEXT_TOO_LONG,
                    event,
                    f"the context would exceed max_text_chars_per_context="
                    f"{self.limits.max_text_chars_per_context}",
                    param="text",
                ),
            ]
        ctx.chars += len(event.text)
        if ctx.manual:
            ctx.manual_buffer.append(event.text)
            return actions
        return actions + self._speak(ctx, ctx.segmenter.feed(event.text, now), now)

    def _open(self, event: TextAppend) -> Send | tuple[_Context, list[Action]]:
        if self.refusal is not None:
            update = {"reply_to": event.event_id, "context_id": event.context_id}
            return Send(error_event(self.refusal.model_copy(update=update)))
        if len(self._contexts) >= self.limits.max_contexts:
            detail = self._detail(
                ErrorCode.TOO_MANY_CONTEXTS,
                event,
                f"at most {self.limits.max_contexts} contexts may be open at once",
            )
            detail.type, detail.retryable, detail.retry_after_ms = "rate_limit_error", True, 250
            return Send(error_event(detail))
        if not self._quota.acquire():
            detail = self._detail(
                ErrorCode.KEY_CONTEXT_LIMIT, event, "this key has too many open contexts"
            )
            detail.type, detail.retryable, detail.retry_after_ms = "rate_limit_error", True, 1000
            return Send(error_event(detail))
        key = self._next_key
        self._next_key += 1
        ctx = _Context(
            key=key,
            context_id=event.context_id,
            stream=self._allocate_stream(),
            config=self.config,
            segmenter=self._segmenter_factory(self.config),
            manual=self.config.text_buffering.mode == "manual",
        )
        self._contexts[ctx.context_id] = ctx
        self._by_key[key] = ctx
        self._finished.pop(ctx.context_id, None)
        created = ContextCreated(
            context_id=ctx.context_id, stream=ctx.stream, reply_to=event.event_id
        )
        return ctx, [OpenContext(key, ctx.context_id, ctx.stream, ctx.config), Send(created)]

    def _allocate_stream(self) -> int:
        in_use = {c.stream for c in self._contexts.values()}
        while self._next_stream in in_use:
            self._next_stream = (self._next_stream + 1) % (MAX_STREAM + 1)
        stream = self._next_stream
        self._next_stream = (stream + 1) % (MAX_STREAM + 1)
        return stream

    def _drain_text(self, ctx: _Context, now: float) -> list[Action]:
        """Everything buffered becomes segments now."""
        segments: list[str] = []
        if ctx.manual and ctx.manual_buffer:
            segments += ctx.segmenter.feed("".join(ctx.manual_buffer), now)
            ctx.manual_buffer.clear()
        segments += ctx.segmenter.flush()
        return self._speak(ctx, segments, now)

    def _flush(self, event: TextFlush, now: float) -> list[Action]:
        ctx = self._active(event.context_id)
        if ctx is None:
            return self._not_active(event)
        if ctx.state == "ending":
            return [self._error(ErrorCode.CONTEXT_ENDED, event, "context.end was already sent")]
        ctx.flushes += 1
        flush_id = event.flush_id or f"flush_{ctx.flushes}"
        return [*self._drain_text(ctx, now), Flush(ctx.key, flush_id, event.event_id)]

    def _end(self, event: ContextEnd, now: float) -> list[Action]:
        ctx = self._active(event.context_id)
        if ctx is None:
            return self._not_active(event)
        if ctx.state == "ending":
            return [self._error(ErrorCode.CONTEXT_ENDED, event, "context.end was already sent")]
        ctx.state = "ending"
        return [*self._drain_text(ctx, now), EndContext(ctx.key, event.event_id)]

    def _cancel(self, event: ContextCancel) -> list[Action]:
        ctx = self._active(event.context_id)
        if ctx is None:
            return self._not_active(event)
        tail = "".join(ctx.manual_buffer) + "".join(ctx.segmenter.flush())
        self.context_closed(ctx.key, "cancelled")
        return [CancelContext(ctx.key, event.event_id, tail)]

    def _update(self, event: SessionUpdate) -> list[Action]:
        patch = event.session
        for name in READ_ONLY_SESSION_FIELDS:
            if name in patch and patch[name] != getattr(self.config, name):
                return [
                    self._error(
                        ErrorCode.READ_ONLY_FIELD,
                        event,
                        f"session.{name} cannot be changed",
                        param=f"session.{name}",
                    )
                ]
        try:
            updated = apply_session_update(self.config, patch)
        except ValidationError as e:
            detail = validation_error_detail(
                e, reply_to=event.event_id, skip_tag=False, prefix="session"
            )
            return [Send(error_event(detail))]
        if updated.voice != self.config.voice and not self._voice_exists(updated.voice):
            return [
                self._error(
                    ErrorCode.VOICE_NOT_FOUND,
                    event,
                    f"unknown voice {updated.voice!r}",
                    param="session.voice",
                )
            ]
        self.config = updated
        return [Send(SessionUpdated(session=updated, reply_to=event.event_id))]

    def _voice_create(self, event: VoiceCreate) -> list[Action]:
        try:
            audio = decode_audio_payload(event.audio)
        except ValueError as e:
            return [self._error(ErrorCode.VOICE_INVALID, event, str(e), param="audio")]
        return [CreateVoice(audio, event.text, event.voice_id, event.event_id)]

    # ------------------------------------------------------------------ helpers

    def _speak(self, ctx: _Context, segments: list[str], now: float) -> list[Action]:
        actions: list[Action] = []
        for text in segments:
            if text.strip():
                actions.append(Speak(ctx.key, ctx.segments, text, now))
                ctx.segments += 1
        return actions

    def _active(self, context_id: str) -> _Context | None:
        return self._contexts.get(context_id)

    def _not_active(self, event: TextFlush | ContextEnd | ContextCancel) -> list[Action]:
        status = self._finished.get(event.context_id)
        if status == "cancelled":
            return []  # racing a barge-in: nothing left to do
        if status is not None:
            return [self._error(ErrorCode.CONTEXT_ENDED, event, "the context has finished")]
        return [
            self._error(
                ErrorCode.CONTEXT_NOT_FOUND,
                event,
                f"no context {event.context_id!r}",
                param="context_id",
            )
        ]

    def _remember_finished(self, context_id: str, status: FinishedStatus) -> None:
        self._finished[context_id] = status
        self._finished.move_to_end(context_id)
        while len(self._finished) > _REMEMBERED_FINISHED:
            self._finished.popitem(last=False)

    def _detail(
        self, code: ErrorCode, event: BaseModel, message: str, param: str | None = None
    ) -> ErrorDetail:
        return invalid_request(
            code,
            message,
            param=param,
            reply_to=getattr(event, "event_id", None),
            context_id=getattr(event, "context_id", None),
        )

    def _error(
        self, code: ErrorCode, event: BaseModel, message: str, param: str | None = None
    ) -> Send:
        return Send(error_event(self._detail(code, event, message, param)))

    def _close(self, code: int, reason: str) -> Close:
        self.closed = True
        return Close(code, reason)
