"""LiveKit Agents TTS plug-in for the realtime speech gateway.

Install with ``pip install 'realtime-speech-gateway[livekit]'``:

    session = AgentSession(tts=GatewayTTS(url="http://localhost:8000", api_key=KEY), ...)

One WebSocket per ``GatewayTTS``, one protocol context per ``stream()`` or
``synthesize()``: ``push_text`` appends (the gateway cuts speakable segments
itself), ``flush`` is ``text.flush``, ``end_input`` is ``context.end``, and
closing a stream before its audio is done cancels the context on the server
and waits for the ack. Audio is 16-bit PCM, 24 kHz unless ``sample_rate`` says
otherwise. A dropped connection fails the streams it carried with a retryable
``APIConnectionError``; the next attempt reconnects.

Timing: the gateway reports when each *segment* starts, not each word, so the
``aligned_transcript`` capability is off.
"""

from __future__ import annotations

import asyncio
import contextlib

from livekit.agents import (
    DEFAULT_API_CONNECT_OPTIONS,
    APIConnectionError,
    APIConnectOptions,
    APIError,
    APIStatusError,
    APITimeoutError,
    tts,
)

from gateway.client import (
    AuthenticationError,
    ClientError,
    Connection,
    ConnectionClosedError,
    Context,
    EngineOverloadedError,
    HandshakeError,
    InvalidRequestError,
    PolicyViolationError,
    RateLimitError,
    ServerError,
)
from gateway.integrations._link import GatewayLink, GatewayOptions, TokenProvider
from gateway.protocol import NATIVE_SAMPLE_RATE

CANCEL_ACK_TIMEOUT_S = 5.0
MIME_TYPE = "audio/pcm"  # PCM16 mono, what GatewayLink asks the server for


def api_error(error: BaseException) -> APIError:
    """LiveKit's error for an SDK error (4xx ones are not retried by the framework)."""
    message = str(error)
    if isinstance(error, APIError):
        return error
    if isinstance(error, TimeoutError):
        return APITimeoutError(f"gateway: {message or 'timed out'}")
    if isinstance(error, AuthenticationError | PolicyViolationError):
        return APIStatusError(message, status_code=401, body=_body(error))
    if isinstance(error, HandshakeError):
        return APIStatusError(message, status_code=error.status)
    if isinstance(error, InvalidRequestError):
        return APIStatusError(message, status_code=400, body=_body(error))
    if isinstance(error, RateLimitError):
        return APIStatusError(message, status_code=429, body=_body(error))
    if isinstance(error, EngineOverloadedError):
        return APIStatusError(message, status_code=503, body=_body(error))
    if isinstance(error, ServerError):
        return APIStatusError(message, status_code=500, body=_body(error))
    if isinstance(error, ClientError):
        return APIConnectionError(f"gateway: {message}")
    return APIError(f"gateway: {message}")


def _body(error: ClientError) -> object | None:
    return error.detail.model_dump() if isinstance(error, ServerError) else None


class GatewayTTS(tts.TTS):
    """LiveKit Agents TTS over the gateway's realtime WebSocket protocol."""

    def __init__(
        self,
        *,
        url: str,
        api_key: str | None = None,
        token: str | TokenProvider | None = None,
        voice: str = "default",
        model: str | None = None,
        sample_rate: int = NATIVE_SAMPLE_RATE,
    ) -> None:
        options = GatewayOptions(
            url=url, api_key=api_key, token=token, voice=voice, model=model, sample_rate=sample_rate
        )
        super().__init__(
            # Segment-level timing only, so no word-aligned transcript.
            capabilities=tts.TTSCapabilities(streaming=True, aligned_transcript=False),
            sample_rate=sample_rate,
            num_channels=1,
        )
        self.link = GatewayLink(options)
        self._prewarm: asyncio.Task[Connection] | None = None

    @property
    def model(self) -> str:
        return self.link.options.model or "realtime-speech-gateway"

    @property
    def provider(self) -> str:
        return "realtime-speech-gateway"

    def synthesize(
        self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> tts.ChunkedStream:
        return GatewayChunkedStream(tts=self, input_text=text, conn_options=conn_options)

    def stream(
        self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> tts.SynthesizeStream:
        return GatewaySynthesizeStream(tts=self, conn_options=conn_options)

    def prewarm(self) -> None:
        if self._prewarm is None or self._prewarm.done():
            self._prewarm = asyncio.create_task(self.link.connection())
            # A failed prewarm is not an error yet: the first utterance retries and reports.
            self._prewarm.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def aclose(self) -> None:
        if self._prewarm is not None:
            self._prewarm.cancel()
            with contextlib.suppress(asyncio.CancelledError, ClientError):
                await self._prewarm
        await self.link.aclose()

    async def open_context(self, conn_options: APIConnectOptions) -> Context:
        """A new protocol context on the (re)opened connection, as LiveKit errors."""
        try:
            conn = await asyncio.wait_for(self.link.connection(), conn_options.timeout)
        except (ClientError, TimeoutError) as e:
            raise api_error(e) from e
        return conn.context()

    async def send_failed(self, context: Context, error: ClientError) -> APIError:
        """A send on ``context`` failed: a dead connection is dropped so the
        framework's retry (``APIConnectionError`` is retryable) reconnects."""
        if isinstance(error, ConnectionClosedError):
            await self.link.discard(context.connection)
        return api_error(error)


async def _cancel_unfinished(context: Context, appended: bool) -> None:
    """Barge-in on a stream closed early: cancel on the server and wait for the ack."""
    if not appended or context.result is not None:
        return
    with contextlib.suppress(ClientError, TimeoutError):
        await context.cancel(wait=True, timeout=CANCEL_ACK_TIMEOUT_S)


async def _relay_audio(context: Context, emitter: tts.AudioEmitter) -> None:
    try:
        async for chunk in context.audio(decode=False):
            emitter.push(chunk.payload)
    except ClientError as e:
        raise api_error(e) from e


class GatewayChunkedStream(tts.ChunkedStream):
    """``synthesize(text)``: one context, the whole text, ended at once."""

    def __init__(self, *, tts: GatewayTTS, input_text: str, conn_options: APIConnectOptions):
        super().__init__(tts=tts, input_text=input_text, conn_options=conn_options)
        self._gateway = tts

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        context = await self._gateway.open_context(self._conn_options)
        output_emitter.initialize(
            request_id=context.id,
            sample_rate=self._gateway.sample_rate,
            num_channels=1,
            mime_type=MIME_TYPE,
        )
        appended = False
        try:
            try:
                await context.append(self.input_text)
                appended = True
                await context.end()
            except ClientError as e:
                raise await self._gateway.send_failed(context, e) from e
            await _relay_audio(context, output_emitter)
            output_emitter.flush()
        finally:
            await asyncio.shield(_cancel_unfinished(context, appended))


class GatewaySynthesizeStream(tts.SynthesizeStream):
    """``stream()``: ``push_text`` pieces go out as they come; audio comes back meanwhile."""

    def __init__(self, *, tts: GatewayTTS, conn_options: APIConnectOptions):
        super().__init__(tts=tts, conn_options=conn_options)
        self._gateway = tts

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        context = await self._gateway.open_context(self._conn_options)
        output_emitter.initialize(
            request_id=context.id,
            sample_rate=self._gateway.sample_rate,
            num_channels=1,
            mime_type=MIME_TYPE,
            stream=True,
        )
        output_emitter.start_segment(segment_id=context.id)
        appended = False

        async def send_text() -> bool:
            nonlocal appended
            async for item in self._input_ch:
                if isinstance(item, self._FlushSentinel):
                    if appended:
                        await context.flush()
                    continue
                self._mark_started()
                await context.append(item)
                appended = True
            if appended:
                await context.end()
            return appended

        sender = asyncio.create_task(send_text(), name="gateway-tts-send")
        receiver = asyncio.create_task(_relay_audio(context, output_emitter))
        try:
            # Whichever fails first ends the stream; a refused text fails the receiver.
            await asyncio.wait([sender, receiver], return_when=asyncio.FIRST_EXCEPTION)
            if receiver.done() and receiver.exception() is not None:
                await receiver
            try:
                spoke = await sender
            except ClientError as e:
                raise await self._gateway.send_failed(context, e) from e
            if spoke:  # else no context was opened and no audio will come
                await receiver
            output_emitter.end_segment()
        finally:
            for task in (sender, receiver):
                task.cancel()
            await asyncio.shield(_cancel_unfinished(context, appended))
