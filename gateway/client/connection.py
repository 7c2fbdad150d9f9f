"""A WebSocket connection to the gateway, typed by ``gateway.protocol``.

One reader task parses every server message and routes it: events of a
context go to that context's queue (or to the connection's, for contexts
opened with ``dispatch="connection"``); everything else goes to the
connection's queue, which ``async for event in conn`` drains. Replies to
``session.update``, ``voice.create`` and ``ping`` also resolve the call that
sent them, matched by ``event_id`` / ``reply_to``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any, TypeVar, get_args

from pydantic import BaseModel, ValidationError
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from gateway.client.context import AudioChunk, Context, ContextItem, ContextState, _Closed
from gateway.client.errors import (
    ClientError,
    ConnectionClosedError,
    ProtocolViolationError,
    closed_error,
    error_from_detail,
)
from gateway.protocol import (
    CLOSE_NORMAL,
    AudioDelta,
    ContextCancelled,
    ContextCreated,
    ContextDone,
    ErrorEvent,
    Limits,
    Ping,
    Pong,
    ServerEvent,
    SessionConfig,
    SessionCreated,
    SessionUpdate,
    SessionUpdated,
    VoiceCreate,
    VoiceCreated,
    parse_server_event,
    unpack_audio_frame,
)

ConnectionItem = ServerEvent | AudioChunk
ReplyT = TypeVar("ReplyT", SessionUpdated, VoiceCreated, Pong)
MAX_CONTEXT_ID_CHARS = 64
MAX_TRACKED_EVENTS = 4096  # recent context events whose errors can be routed back


SERVER_EVENT_TYPES = frozenset(
    model.model_fields["type"].default for model in get_args(get_args(ServerEvent)[0])
)


def _event_type(message: str) -> object:
    try:
        raw = json.loads(message)
    except ValueError:
        return None
    return raw.get("type") if isinstance(raw, dict) else None


class SessionResource:
    def __init__(self, connection: Connection, created: SessionCreated) -> None:
        self._connection = connection
        self.config: SessionConfig = created.session
        self.limits: Limits = created.limits

    async def update(self, patch: dict[str, Any] | None = None, **fields: Any) -> SessionConfig:
        """Change session settings for contexts created afterwards; returns the
        effective session. Raises ``InvalidRequestError`` on a bad value."""
        body = {**(patch or {}), **fields}
        reply = await self._connection.request(SessionUpdate(session=body), SessionUpdated)
        self.config = reply.session
        return self.config


class VoicesResource:
    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    async def create(
        self, audio: bytes, *, voice_id: str | None = None, text: str | None = None
    ) -> VoiceCreated:
        """Register a reference clip (wav/flac/ogg/mp3 bytes) as a voice."""
        event = VoiceCreate(
            voice_id=voice_id, audio=base64.b64encode(audio).decode("ascii"), text=text
        )
        return await self._connection.request(event, VoiceCreated)


class Connection:
    """Use :func:`connect` to open one."""

    def __init__(self, ws: ClientConnection, created: SessionCreated, request_timeout: float):
        self._ws = ws
        self._request_timeout = request_timeout
        self.session = SessionResource(self, created)
        self.voices = VoicesResource(self)
        self.connected_at = time.perf_counter()
        self._events: asyncio.Queue[ConnectionItem | ClientError | _Closed] = asyncio.Queue()
        self._contexts: dict[str, ContextState] = {}
        self._streams: dict[int, ContextState] = {}
        self._pending: dict[str, tuple[type[BaseModel], asyncio.Future[ServerEvent]]] = {}
        self._ids = itertools.count(1)
        self._event_owner: OrderedDict[str, ContextState] = OrderedDict()
        self._closing = False
        self.unknown_events = 0  # events of types newer than this SDK, skipped
        self._closed_error: ClientError | None = None
        self._reader = asyncio.create_task(self._read_loop(), name="speech-client-reader")

    @property
    def limits(self) -> Limits:
        return self.session.limits

    @property
    def closed(self) -> bool:
        """True once the socket closed (either side): open a new connection to go on."""
        return self._closing or self._closed_error is not None

    # ------------------------------------------------------------------ API

    def context(self, context_id: str | None = None, *, dispatch: str = "context") -> Context:
        """A new context. Its events are read from the context (``dispatch="context"``,
        the default) or from ``async for event in conn`` (``dispatch="connection"``)."""
        if dispatch not in ("context", "connection"):
            raise ValueError(f"dispatch must be 'context' or 'connection', not {dispatch!r}")
        context_id = context_id or f"ctx_{uuid.uuid4().hex[:12]}"
        if not 1 <= len(context_id) <= MAX_CONTEXT_ID_CHARS:
            raise ValueError(f"a context id has 1 to {MAX_CONTEXT_ID_CHARS} characters")
        if context_id in self._contexts:
            raise ValueError(f"context {context_id!r} is still open on this connection")
        state = ContextState(context_id=context_id, dispatch=dispatch)
        self._contexts[context_id] = state

        async def send_for(event: BaseModel) -> None:
            # An id on every context event lets an error that names no context
            # (e.g. a refused context_id) still reach the context that caused it.
            event_id = f"evt_{next(self._ids)}"
            self._event_owner[event_id] = state
            while len(self._event_owner) > MAX_TRACKED_EVENTS:
                self._event_owner.popitem(last=False)
            await self.send(event.model_copy(update={"event_id": event_id}))

        return Context(lambda: self.session.config.output, state, send_for, owner=self)

    async def ping(self) -> float:
        """Round trip of a ``ping`` in seconds."""
        t0 = time.perf_counter()
        await self.request(Ping(), Pong)
        return time.perf_counter() - t0

    def __aiter__(self) -> AsyncIterator[ConnectionItem]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[ConnectionItem]:
        while True:
            item = await self._events.get()
            if isinstance(item, _Closed):
                self._events.put_nowait(item)  # later iterations end the same way
                if self._closing or item.error is None:
                    return
                raise item.error
            if isinstance(item, ClientError):
                raise item
            yield item

    async def close(self) -> None:
        self._closing = True
        await self._ws.close(CLOSE_NORMAL)
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader

    # ------------------------------------------------------------------ sending

    async def send(self, event: BaseModel) -> None:
        if self._closed_error is not None:
            raise self._closed_error
        try:
            await self._ws.send(event.model_dump_json(exclude_none=True))
        except ConnectionClosed as e:
            raise closed_error(
                e.rcvd.code if e.rcvd else None, e.rcvd.reason if e.rcvd else ""
            ) from e

    async def request(self, event: BaseModel, reply_type: type[ReplyT]) -> ReplyT:
        """Send ``event`` with a fresh ``event_id``; await the reply that echoes it."""
        event_id = f"req_{next(self._ids)}"
        event = event.model_copy(update={"event_id": event_id})
        future: asyncio.Future[ServerEvent] = asyncio.get_running_loop().create_future()
        self._pending[event_id] = (reply_type, future)
        try:
            await self.send(event)
            reply = await asyncio.wait_for(future, self._request_timeout)
            if not isinstance(reply, reply_type):
                raise ProtocolViolationError(f"expected {reply_type.__name__}, got {reply.type}")
            return reply
        finally:
            self._pending.pop(event_id, None)

    # ------------------------------------------------------------------ receiving

    async def _read_loop(self) -> None:
        error: ClientError | None = None
        try:
            async for message in self._ws:
                received_at = time.perf_counter()
                try:
                    if isinstance(message, bytes):
                        self._on_binary(message, received_at)
                    else:
                        self._on_text(message, received_at)
                except (ValidationError, ValueError) as e:
                    self._events.put_nowait(ProtocolViolationError(str(e)))
        except ConnectionClosed as e:
            error = closed_error(e.rcvd.code if e.rcvd else None, e.rcvd.reason if e.rcvd else "")
        code = self._ws.close_code
        if error is None and code not in (CLOSE_NORMAL, None) and not self._closing:
            error = closed_error(code, self._ws.close_reason or "")
        self._finish(error)

    def _on_text(self, message: str, received_at: float) -> None:
        try:
            event = parse_server_event(message)
        except ValidationError:
            if _event_type(message) not in SERVER_EVENT_TYPES:
                # A newer server's event this SDK does not know: skip it, count it.
                self.unknown_events += 1
                return
            raise
        self._on_event(event, received_at)

    def _finish(self, error: ClientError | None) -> None:
        final = error or ConnectionClosedError(self._ws.close_code, "connection closed")
        self._closed_error = final
        for _, future in self._pending.values():
            if not future.done():
                future.set_exception(final)
        for state in self._contexts.values():
            if not state.finished.done():
                state.queue.put_nowait(_Closed(final))
                state.finished.set_exception(final)
                state.finished.exception()  # retrieved: nobody may be waiting on it
            if not state.created.done():
                state.created.cancel()
        self._events.put_nowait(_Closed(error))

    def _resolve_reply(self, event: ServerEvent) -> None:
        pending = self._pending.get(event.reply_to) if event.reply_to else None
        if pending is None and not isinstance(event, ErrorEvent):
            # A reply without reply_to answers the oldest request waiting for its type.
            pending = next(
                (p for p in self._pending.values() if isinstance(event, p[0]) and not p[1].done()),
                None,
            )
        if pending is None or pending[1].done():
            return
        reply_type, future = pending
        if isinstance(event, ErrorEvent):
            future.set_exception(error_from_detail(event.error))
        elif isinstance(event, reply_type):
            future.set_result(event)

    def _on_event(self, event: ServerEvent, received_at: float) -> None:
        if isinstance(event, SessionUpdated | VoiceCreated | Pong | ErrorEvent):
            self._resolve_reply(event)
        if isinstance(event, AudioDelta):
            state = self._contexts.get(event.context_id)
            if state is None or state.stream is None:
                raise ValueError(f"audio.delta for unknown context {event.context_id!r}")
            self._route_chunk(
                state,
                state.stream,
                event.seq,
                event.pts_ms,
                base64.b64decode(event.audio),
                received_at,
            )
            return
        context_id = getattr(event, "context_id", None)
        state = self._contexts.get(context_id) if context_id else None
        if isinstance(event, ErrorEvent):
            owner = self._event_owner.get(event.error.reply_to or event.reply_to or "")
            state = self._contexts.get(event.error.context_id or "") or owner
        if state is None:
            self._events.put_nowait(event)
            return
        if isinstance(event, ContextCreated):
            state.stream = event.stream
            self._streams[event.stream] = state
            if not state.created.done():
                state.created.set_result(event)
        elif isinstance(event, ErrorEvent):
            state.errors.append(event.error)
        self._deliver(state, event)
        if isinstance(event, ContextDone | ContextCancelled):
            if not state.finished.done():
                state.finished.set_result(event)
            self._contexts.pop(state.context_id, None)
            if state.stream is not None:
                self._streams.pop(state.stream, None)

    def _on_binary(self, data: bytes, received_at: float) -> None:
        frame = unpack_audio_frame(data)
        state = self._streams.get(frame.stream)
        if state is None:
            raise ValueError(f"audio frame for unknown stream {frame.stream}")
        self._route_chunk(state, frame.stream, frame.seq, frame.pts_ms, frame.payload, received_at)

    def _route_chunk(
        self,
        state: ContextState,
        stream: int,
        seq: int,
        pts_ms: int,
        payload: bytes,
        received_at: float,
    ) -> None:
        output = state.output or self.session.config.output
        chunk = AudioChunk(
            context_id=state.context_id,
            stream=stream,
            seq=seq,
            pts_ms=pts_ms,
            payload=payload,
            format=output.format,
            sample_rate=output.sample_rate,
            received_at=received_at,
        )
        self._deliver(state, chunk)

    def _deliver(self, state: ContextState, item: ContextItem) -> None:
        if state.dispatch == "context":
            state.queue.put_nowait(item)
        else:
            self._events.put_nowait(item)
