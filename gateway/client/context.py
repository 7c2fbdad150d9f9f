"""One utterance stream of a connection: text in, audio chunks out."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel

from gateway.client.audio import FrameDecoder, make_decoder, payload_duration_ms
from gateway.client.errors import ClientError, error_from_detail
from gateway.protocol import (
    NATIVE_SAMPLE_RATE,
    ContextCancel,
    ContextCancelled,
    ContextCreated,
    ContextDone,
    ContextEnd,
    ErrorDetail,
    ErrorEvent,
    OutputConfig,
    ServerEvent,
    TextAppend,
    TextFlush,
)


@dataclass
class AudioChunk:
    """One audio frame of a context, as received (and decoded on request)."""

    context_id: str
    stream: int
    seq: int
    pts_ms: int
    payload: bytes
    format: str
    sample_rate: int
    received_at: float  # time.perf_counter() when the frame arrived
    pcm: np.ndarray | None = None  # float32 mono, once decoded
    decoded_at: float | None = None

    @property
    def duration_ms(self) -> float:
        if self.pcm is not None:
            return len(self.pcm) * 1000.0 / self.sample_rate
        return payload_duration_ms(self.format, self.sample_rate, self.payload)


ContextItem = ServerEvent | AudioChunk
Finished = ContextDone | ContextCancelled


class _Closed:
    """Queue sentinel: the connection ended; consumers raise ``error`` (if any)."""

    def __init__(self, error: ClientError | None) -> None:
        self.error = error


@dataclass
class ContextState:
    """What the connection's reader keeps per context (shared with ``Context``)."""

    context_id: str
    dispatch: str  # "context": events go to this context's queue; "connection": to the connection
    queue: asyncio.Queue[ContextItem | _Closed] = field(default_factory=asyncio.Queue)
    output: OutputConfig | None = None  # the session output when the context was created
    stream: int | None = None
    created: asyncio.Future[ContextCreated] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    finished: asyncio.Future[Finished] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    errors: list[ErrorDetail] = field(default_factory=list)


@dataclass(frozen=True)
class Utterance:
    pcm: np.ndarray  # float32 mono
    sample_rate: int
    chunks: int
    done: ContextDone


class Context:
    """Created by :meth:`Connection.context`; the first :meth:`append` opens it."""

    _flush_ids = itertools.count(1)

    def __init__(
        self,
        session_output: Callable[[], OutputConfig],
        state: ContextState,
        send: Callable[[BaseModel], Awaitable[None]],
        owner: object = None,
    ) -> None:
        # The session's output settings when the context opens (they apply to it).
        self._session_output = session_output
        self._owner = owner
        self._state = state
        self._send = send
        self._decoder: FrameDecoder | None = None
        self.first_text_sent_at: float | None = None

    @property
    def id(self) -> str:
        return self._state.context_id

    @property
    def connection(self) -> object:
        """The :class:`~gateway.client.connection.Connection` this context lives on
        (typed loosely: that module imports this one, not the other way round)."""
        return self._owner

    @property
    def stream(self) -> int | None:
        return self._state.stream

    @property
    def errors(self) -> list[ErrorDetail]:
        """Error events received for this context so far."""
        return list(self._state.errors)

    @property
    def result(self) -> Finished | None:
        """``context.done`` or ``context.cancelled`` once it has arrived."""
        f = self._state.finished
        return f.result() if f.done() and not f.cancelled() and f.exception() is None else None

    # ------------------------------------------------------------------ sending

    async def append(self, text: str) -> None:
        if self._state.output is None:
            self._state.output = self._session_output().model_copy()
        await self._send(TextAppend(context_id=self.id, text=text))
        if self.first_text_sent_at is None:
            self.first_text_sent_at = time.perf_counter()

    async def flush(self, flush_id: str | None = None) -> str:
        """Speak everything buffered now; returns the id ``text.flushed`` will carry."""
        flush_id = flush_id or f"flush_{next(self._flush_ids)}"
        await self._send(TextFlush(context_id=self.id, flush_id=flush_id))
        return flush_id

    async def end(self) -> None:
        await self._send(ContextEnd(context_id=self.id))

    async def cancel(self, wait: bool = True, timeout: float = 10.0) -> Finished | None:
        """Barge-in: stop this context now; with ``wait``, return the server's ack
        (``context.cancelled``, or ``context.done`` if it had already finished)."""
        await self._send(ContextCancel(context_id=self.id))
        if not wait:
            return None
        return await self.wait_finished(timeout)

    async def wait_created(self, timeout: float | None = None) -> ContextCreated:
        return await asyncio.wait_for(asyncio.shield(self._state.created), timeout)

    async def wait_finished(self, timeout: float | None = None) -> Finished:
        return await asyncio.wait_for(asyncio.shield(self._state.finished), timeout)

    # ------------------------------------------------------------------ receiving

    async def events(self) -> AsyncIterator[ContextItem]:
        """Every event and audio chunk of this context, up to and including
        ``context.done`` / ``context.cancelled``."""
        if self._state.dispatch != "context":
            raise ClientError(f"context {self.id!r} dispatches its events to the connection")
        while True:
            item = await self._state.queue.get()
            if isinstance(item, _Closed):
                raise item.error or ClientError(f"connection closed before {self.id!r} finished")
            yield item
            if isinstance(item, ContextDone | ContextCancelled):
                return

    async def audio(self, decode: bool = True) -> AsyncIterator[AudioChunk]:
        """Audio chunks in order until the context is done or cancelled.

        Raises the server's error (a ``ServerError`` subclass) when the context
        fails, or when it is refused before it was ever created.
        """
        async for item in self.events():
            if isinstance(item, AudioChunk):
                if decode:
                    self.decode(item)
                yield item
            elif isinstance(item, ErrorEvent) and self._state.stream is None:
                raise error_from_detail(item.error)
            elif isinstance(item, ContextDone) and item.status == "failed":
                detail = self._state.errors[-1] if self._state.errors else None
                if detail is not None:
                    raise error_from_detail(detail)
                raise ClientError(f"context {self.id!r} failed without an error event")

    def decode(self, chunk: AudioChunk) -> np.ndarray:
        """Decode ``chunk`` in place (chunks of one context must be decoded in order)."""
        if chunk.pcm is None:
            if self._decoder is None:
                self._decoder = make_decoder(chunk.format, chunk.sample_rate)
            chunk.pcm = self._decoder.decode(chunk.payload)
            chunk.decoded_at = time.perf_counter()
        return chunk.pcm

    async def collect(self) -> Utterance:
        """Wait for the whole utterance and return it as one PCM array."""
        parts: list[np.ndarray] = []
        output = self._state.output
        sample_rate: int = output.sample_rate if output else NATIVE_SAMPLE_RATE
        async for chunk in self.audio():
            assert chunk.pcm is not None  # decoded by audio()
            parts.append(chunk.pcm)
            sample_rate = chunk.sample_rate
        finished = await self.wait_finished()
        if not isinstance(finished, ContextDone):
            raise ClientError(f"context {self.id!r} was cancelled")
        pcm = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
        return Utterance(pcm=pcm, sample_rate=sample_rate, chunks=len(parts), done=finished)
