"""Pipecat TTS service for the realtime speech gateway.

Install with ``pip install 'realtime-speech-gateway[pipecat]'``:

    tts = GatewayTTSService(url="http://localhost:8000", api_key=KEY)
    pipeline = Pipeline([transport.input(), stt, llm, tts, transport.output()])

One WebSocket per service, one protocol context per Pipecat audio context:
``run_tts`` appends text to the context (token mode by default, since the
gateway cuts speakable segments itself), the end of the turn (``flush_audio``)
ends it, and an interruption cancels it and waits for the server's ack, after
which no audio of that context exists. Audio is 16-bit PCM at the pipeline's
output rate (24 kHz by default). A dropped connection ends the contexts it
carried; the next utterance opens a new one.

Timing: the gateway reports when each *segment* starts, not each word, so no
word timestamps are produced; Pipecat emits the text of each aggregation as it
is sent (``push_text_frames``).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import replace
from typing import Any

from loguru import logger
from pipecat.frames.frames import (
    ErrorFrame,
    Frame,
    StartFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
)
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TextAggregationMode, WebsocketTTSService
from pipecat.utils.errors import ErrorCategory

from gateway.client import (
    AudioChunk,
    AuthenticationError,
    ClientError,
    Connection,
    ConnectionClosedError,
    Context,
    HandshakeError,
    InvalidRequestError,
    PolicyViolationError,
    RateLimitError,
    ServerError,
)
from gateway.integrations._link import SAMPLE_RATES, GatewayLink, GatewayOptions, TokenProvider
from gateway.protocol import (
    NATIVE_SAMPLE_RATE,
    ContextCancelled,
    ContextDone,
    ErrorDetail,
    ErrorEvent,
)

CANCEL_ACK_TIMEOUT_S = 5.0

_CATEGORY_BY_TYPE = {
    "authentication_error": ErrorCategory.AUTHENTICATION,
    "rate_limit_error": ErrorCategory.RATE_LIMIT,
    "engine_overloaded": ErrorCategory.SERVER,
    "server_error": ErrorCategory.SERVER,
    # one context's text refused (too long, ended): the application's input, not the service
    "invalid_request_error": ErrorCategory.APPLICATION,
}


def error_category(error: BaseException) -> ErrorCategory | None:
    """Pipecat's category for an SDK error (None: let Pipecat work it out)."""
    if isinstance(error, AuthenticationError | PolicyViolationError):
        return ErrorCategory.AUTHENTICATION
    if isinstance(error, HandshakeError):
        return {401: ErrorCategory.AUTHENTICATION, 403: ErrorCategory.AUTHORIZATION}.get(
            error.status, ErrorCategory.CONNECTIVITY
        )
    if isinstance(error, InvalidRequestError):
        return ErrorCategory.INVALID_REQUEST  # at connect: a wrong voice or model
    if isinstance(error, RateLimitError):
        return ErrorCategory.RATE_LIMIT
    if isinstance(error, ServerError):
        return ErrorCategory.SERVER
    if isinstance(error, ClientError):
        return ErrorCategory.CONNECTIVITY
    return None


class GatewayTTSService(WebsocketTTSService):
    """Pipecat ``WebsocketTTSService`` speaking through the gateway's realtime protocol.

    Event handlers (besides the base class's): ``on_context_cancelled(service,
    ContextCancelled)`` once the server acknowledged an interruption.
    """

    def __init__(
        self,
        *,
        url: str,
        api_key: str | None = None,
        token: str | TokenProvider | None = None,
        voice: str = "default",
        model: str | None = None,
        sample_rate: int | None = None,
        text_aggregation_mode: TextAggregationMode = TextAggregationMode.TOKEN,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            text_aggregation_mode=text_aggregation_mode,
            push_text_frames=True,  # segment timing only: no word timestamps to drive them
            push_start_frame=True,
            sample_rate=sample_rate,
            settings=TTSSettings(model=model, voice=voice, language=None),
            **kwargs,
        )
        # Checked now; the sample rate is settled when the pipeline starts the service.
        self._options = GatewayOptions(
            url=url,
            api_key=api_key,
            token=token,
            voice=voice,
            model=model,
            sample_rate=sample_rate or NATIVE_SAMPLE_RATE,
        )
        self._link: GatewayLink | None = None
        self._contexts: dict[str, Context] = {}  # open contexts, by Pipecat context id
        self._carried_by: dict[str, Connection] = {}  # the connection each one lives on
        self._receive_task: Any = None
        self._register_event_handler("on_context_cancelled")

    @property
    def gateway_link(self) -> GatewayLink:
        if self._link is None:
            raise RuntimeError("the service is not set up yet (no pipeline has started it)")
        return self._link

    def can_generate_metrics(self) -> bool:
        return True

    def _classify_error(self, exception: Exception) -> ErrorCategory | None:
        return error_category(exception)

    # ------------------------------------------------------------------ lifecycle

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        # The output rate is known now: the service's own or the pipeline's. A pipeline
        # rate the gateway does not send gets 24 kHz frames (each frame names its rate).
        rate = self.sample_rate if self.sample_rate in SAMPLE_RATES else NATIVE_SAMPLE_RATE
        self._link = GatewayLink(replace(self._options, sample_rate=rate))
        await self._connect()

    async def _connect(self) -> None:
        await super()._connect()
        await self._connect_websocket()
        if self._receive_task is None:
            self._receive_task = self.create_task(self._receive_task_handler(self._report_error))

    async def _disconnect(self) -> None:
        await super()._disconnect()
        if self._receive_task is not None:
            await self.cancel_task(self._receive_task)
            self._receive_task = None
        await self._disconnect_websocket()

    async def _connect_websocket(self) -> None:
        try:
            await self.gateway_link.connection()
        except ClientError as e:
            await self._report_connect_error(e)
            return
        await self._call_event_handler("on_connected")

    async def _disconnect_websocket(self) -> None:
        self._contexts.clear()
        self._carried_by.clear()
        if self._link is not None:
            await self._link.aclose()
            await self._call_event_handler("on_disconnected")

    async def _verify_connection(self) -> bool:
        conn = self.gateway_link.current
        if conn is None:
            return False
        try:
            await conn.ping()
        except ClientError:
            return False
        return True

    async def _report_connect_error(self, error: ClientError) -> None:
        category = error_category(error)
        await self._call_event_handler("on_connection_error", str(error))
        await self.push_error(
            f"{self} cannot connect to the gateway: {error}",
            exception=error,
            category=category,
            force_treat_as_permanent=bool(category and category.is_permanent),
        )

    # ------------------------------------------------------------------ text in

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        # A connection that died before this context's first text is replaced once.
        for last_try in (False, True):
            try:
                conn = await self.gateway_link.connection()  # reopens a dropped connection
            except ClientError as e:
                await self._report_connect_error(e)
                yield TTSStoppedFrame(context_id=context_id)
                return
            context = self._contexts.get(context_id)
            fresh = context is None
            if context is None:
                await self.start_ttfb_metrics()
                context = conn.context(context_id, dispatch="connection")
                self._contexts[context_id] = context
                self._carried_by[context_id] = conn
            try:
                await context.append(text)
            except ConnectionClosedError as e:
                self._forget(context_id)
                await self.gateway_link.discard(conn)
                if fresh and not last_try:
                    continue
                yield ErrorFrame(error=f"{self} lost the gateway: {e}", exception=e)
                yield TTSStoppedFrame(context_id=context_id)
                return
            await self.start_tts_usage_metrics(text)
            yield None  # audio arrives on the receive task
            return

    async def flush_audio(self, context_id: str | None = None) -> None:
        """The turn's text is complete: the server speaks the rest, then ``context.done``."""
        context_id = context_id or self.get_active_audio_context_id()
        context = self._contexts.get(context_id) if context_id else None
        if context is None:
            return
        try:
            await context.end()
        except ClientError as e:
            logger.warning(f"{self} could not end context {context_id}: {e}")

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        """Barge-in: cancel on the server and wait for the ack (no audio follows it)."""
        await self.stop_all_metrics()
        context = self._forget(context_id)
        if context is not None and context.result is None:
            try:
                ack = await context.cancel(wait=True, timeout=CANCEL_ACK_TIMEOUT_S)
            except (ClientError, TimeoutError) as e:
                logger.warning(f"{self} cancel of {context_id} not acknowledged: {e}")
            else:
                if isinstance(ack, ContextCancelled):
                    await self._call_event_handler("on_context_cancelled", ack)
        await super().on_audio_context_interrupted(context_id)

    # ------------------------------------------------------------------ audio out

    async def _receive_messages(self) -> None:
        """Route every event of every connection the link opens, for the service's life."""
        while True:
            conn = await self.gateway_link.wait_connected()
            try:
                async for item in conn:
                    await self._route(item)
            except ClientError as e:
                await self._connection_dropped(conn, e)
            else:
                await self._connection_dropped(conn, None)

    async def _route(self, item: object) -> None:
        if isinstance(item, AudioChunk):
            if item.context_id not in self._contexts:
                return  # cancelled: its last frames raced the cancel
            await self.stop_ttfb_metrics()
            frame = TTSAudioRawFrame(
                audio=item.payload,
                sample_rate=item.sample_rate,
                num_channels=1,
                context_id=item.context_id,
            )
            await self.append_to_audio_context(item.context_id, frame)
        elif isinstance(item, ContextDone):
            if self._forget(item.context_id) is not None:
                await self._close_context_audio(item.context_id)
        elif isinstance(item, ContextCancelled):
            self._forget(item.context_id)
        elif isinstance(item, ErrorEvent):
            await self._push_server_error(item.error)

    async def _push_server_error(self, detail: ErrorDetail) -> None:
        category = _CATEGORY_BY_TYPE.get(detail.type, ErrorCategory.UNKNOWN)
        where = f" (context {detail.context_id})" if detail.context_id else ""
        await self.push_error(
            f"{self} gateway error{where}: {detail.type}/{detail.code}: {detail.message}",
            category=category,
        )

    def _forget(self, context_id: str) -> Context | None:
        self._carried_by.pop(context_id, None)
        return self._contexts.pop(context_id, None)

    async def _close_context_audio(self, context_id: str) -> None:
        if self.audio_context_available(context_id):
            await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
            await self.remove_audio_context(context_id)

    async def _connection_dropped(self, conn: Connection, error: ClientError | None) -> None:
        """End the contexts the dead connection carried; the next utterance reconnects."""
        dropped = [cid for cid, carrier in self._carried_by.items() if carrier is conn]
        for context_id in dropped:
            self._forget(context_id)
            await self._close_context_audio(context_id)
        if error is not None and not self._disconnecting:
            await self._call_event_handler("on_disconnected")
            await self.push_error(
                f"{self} lost the gateway connection: {error}",
                exception=error,
                category=ErrorCategory.CONNECTIVITY,
            )
