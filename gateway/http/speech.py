"""OpenAI-compatible HTTP speech: ``POST /v1/audio/speech`` and ``GET /v1/models``.

The body streams: the response starts as soon as the engine has its first
chunk (that chunk is awaited before the status line is sent, so a request the
engine refuses at once still gets a proper 4xx/5xx). ``stream_format: sse``
sends OpenAI's ``speech.audio.delta`` / ``speech.audio.done`` events instead
of raw bytes. Compressed formats are encoded on a worker thread.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import functools
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from gateway.availability import refusal
from gateway.http.errors import (
    ApiError,
    authenticate,
    bad_request,
    error_response,
    parse_json_body,
    store_unavailable,
)
from gateway.http.speech_request import SpeechParams, parse_speech_request
from gateway.http.voices import voice_routes
from gateway.protocol import ErrorCode, ErrorDetail
from gateway.state import GatewayState
from gateway.voice_clips import MIN_REFERENCE_SECONDS
from gateway.voices import VoiceStoreError, can_clone, cloning_unsupported, decode_clip
from realtime_engine.audio.containers import ContainerEncoder
from realtime_engine.audio.errors import AudioFormatError
from realtime_engine.engines.base import (
    EngineError,
    SegmentRequest,
    SpeechEngine,
    UnsupportedVoiceError,
    VoiceReference,
)
from realtime_engine.format import SAMPLE_RATE as OUTPUT_SAMPLE_RATE  # OpenAI's rate too
from realtime_engine.talker.types import TalkerSampling
from realtime_engine.text.segmenter import TextSegmenter

_INLINE_FORMATS = frozenset({"wav", "pcm"})  # cheap enough to encode on the event loop
_CREATED = int(time.time())
logger = logging.getLogger(__name__)


def _engine_failure(error: EngineError) -> ApiError:
    if isinstance(error, UnsupportedVoiceError):
        return bad_request(str(error), "voice", ErrorCode.VOICE_UNSUPPORTED)
    return ApiError(
        500,
        ErrorDetail(
            type="server_error", code=ErrorCode.ENGINE_ERROR, message=str(error), retryable=True
        ),
    )


class _Encoder:
    """A container encoder that runs on a worker thread when it is costly."""

    def __init__(self, fmt: str, input_rate: int, streaming: bool) -> None:
        self._inline = fmt in _INLINE_FORMATS
        try:
            self._encoder = ContainerEncoder(
                fmt, OUTPUT_SAMPLE_RATE, streaming, input_rate=input_rate
            )
        except AudioFormatError as e:
            raise bad_request(str(e), e.param or "response_format") from e
        self.content_type = self._encoder.content_type

    async def feed(self, pcm: np.ndarray) -> bytes:
        if self._inline:
            return self._encoder.feed(pcm)
        return await asyncio.to_thread(self._encoder.feed, pcm)

    async def finish(self) -> bytes:
        if self._inline:
            return self._encoder.finish()
        return await asyncio.to_thread(self._encoder.finish)


async def _resolve_voice(
    params: SpeechParams, state: GatewayState, key_id: str
) -> tuple[str, VoiceReference | None]:
    """The voice to synthesize with and its codes; a reference clip becomes a (cached)
    cloned voice of the caller's key."""
    if params.ref_audio is None:
        try:
            return params.voice, await state.voices.reference(params.voice, key_id)
        except ValueError as e:
            raise bad_request(str(e), "voice", ErrorCode.VOICE_NOT_FOUND) from e
    if not can_clone(state.engine):
        raise bad_request(
            str(cloning_unsupported(state.engine)), params.ref_param, ErrorCode.VOICE_UNSUPPORTED
        )
    try:
        created = await state.voices.create(params.ref_audio, params.ref_text, None, key_id)
        reference = await state.voices.reference(created.voice_id, key_id)
    except UnsupportedVoiceError as e:
        raise bad_request(str(e), params.ref_param, ErrorCode.VOICE_UNSUPPORTED) from e
    except ValueError as e:
        raise bad_request(str(e), params.ref_param, ErrorCode.VOICE_INVALID) from e
    return created.voice_id, reference


async def _parse(body: object, state: GatewayState, key_id: str) -> SpeechParams:
    max_seconds = state.settings.limits.max_reference_seconds
    if isinstance(body, dict) and isinstance(voice := body.get("voice"), str):
        await state.voices.refresh(voice, key_id)  # a voice made on another replica
    parse = functools.partial(
        parse_speech_request,
        body,
        has_voice=lambda voice_id: state.voices.has(voice_id, key_id),
        model_names=frozenset({state.model_name, state.engine.model_id}),
        max_input_chars=state.settings.limits.max_text_chars_per_context,
        check_clip=lambda audio, param: decode_clip(
            audio, max_seconds, param, MIN_REFERENCE_SECONDS
        ),
    )
    has_reference = isinstance(body, dict) and ("ref_audio" in body or "references" in body)
    # Decoding a reference clip is real work: keep it off the event loop.
    return await asyncio.to_thread(parse) if has_reference else parse()


def _sse(event: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(event, separators=(',', ':'))}\n\n".encode()


async def _prepend(
    first: np.ndarray | None, rest: AsyncIterator[np.ndarray]
) -> AsyncIterator[np.ndarray]:
    if first is not None:
        yield first
    async for chunk in rest:
        yield chunk


async def _encoded(
    pcm: AsyncIterator[np.ndarray], encoder: _Encoder, on_audio: Callable[[int], None]
) -> AsyncIterator[bytes]:
    async for chunk in pcm:
        on_audio(chunk.size)
        if data := await encoder.feed(chunk):
            yield data
    if tail := await encoder.finish():
        yield tail


async def _sse_events(
    encoded: AsyncIterator[bytes], samples: Callable[[], int]
) -> AsyncIterator[bytes]:
    try:
        async for data in encoded:
            yield _sse({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
    except EngineError as e:
        yield _sse({"type": "error", "error": _engine_failure(e).body()["error"]})
        return
    yield _sse({"type": "speech.audio.done", "usage": {"output_audio_samples": samples()}})


def split_for_speech(text: str) -> list[str]:
    """Cut a whole input into engine segments the way the realtime path does."""
    segmenter = TextSegmenter()
    segments = [*segmenter.feed(text, 0.0), *segmenter.end()]
    return [s.speech_text for s in segments if s.speech_text]


class _SpeechJob:
    """One speech request: its input cut into segments that the engine speaks in order."""

    def __init__(self, engine: SpeechEngine, template: SegmentRequest) -> None:
        self._engine = engine
        self._template = template
        self._texts = split_for_speech(template.text)
        self._current: str | None = None

    @property
    def request_id(self) -> str:
        return self._template.request_id

    async def chunks(self) -> AsyncIterator[np.ndarray]:
        for index, text in enumerate(self._texts):
            segment = dataclasses.replace(
                self._template, request_id=f"{self.request_id}-{index}", text=text
            )
            self._current = segment.request_id
            stream = self._engine.synthesize(segment)
            try:
                async for chunk in stream:
                    yield chunk
            finally:
                self._current = None
                await _close(stream)

    async def abort(self) -> None:
        """Stop the segment being spoken now; later ones are never started."""
        if self._current is not None:
            await self._engine.abort(self._current)


async def _close(iterator: AsyncIterator[Any]) -> None:
    close = getattr(iterator, "aclose", None)
    if close is not None:
        await close()


async def _guarded(
    body: AsyncIterator[bytes], chunks: AsyncIterator[np.ndarray], job: _SpeechJob
) -> AsyncIterator[bytes]:
    """Stop the engine work when the client goes away or the stream fails."""
    finished = False
    try:
        async for data in body:
            yield data
        finished = True
    except EngineError:
        logger.warning("speech request %s failed mid-stream", job.request_id, exc_info=True)
        raise
    finally:
        # Shielded: this also runs when the response task is being cancelled.
        with anyio.CancelScope(shield=True):
            if not finished:
                await job.abort()
            await _close(chunks)


class _AbortingStreamingResponse(StreamingResponse):
    """Streams the body and stops it as soon as the client disconnects.

    Watching ``receive`` for ``http.disconnect`` (rather than waiting for the
    next write to fail) ends engine work at once, and the body iterator is
    always closed so its clean-up (the engine abort) runs right away.
    """

    def __init__(
        self,
        body: AsyncIterator[bytes],
        media_type: str,
        on_disconnect: Callable[[], Awaitable[None]],
    ) -> None:
        super().__init__(body, media_type=media_type)
        self._on_disconnect = on_disconnect

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:
                        pass  # the client went away mid-write
                    finally:
                        group.cancel_scope.cancel()

                group.start_soon(stream)
                await self.listen_for_disconnect(receive)
                # Abort first: the engine stops its work instead of merely
                # seeing its consumer vanish.
                await self._on_disconnect()
                group.cancel_scope.cancel()
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                with anyio.CancelScope(shield=True):
                    await close()


async def create_speech(request: Request, state: GatewayState) -> Response:
    try:
        key_id = authenticate(request, state)
        # Draining, or the engine died (HTTP requests wait for a warming engine).
        if (unavailable := refusal(state, warming=False)) is not None:
            raise ApiError(503, unavailable)
        body = parse_json_body(await request.body())
        params = await _parse(body, state, key_id)
        encoder = _Encoder(params.response_format, state.engine.sample_rate, params.stream)
        voice, reference = await _resolve_voice(params, state, key_id)
        job = _SpeechJob(
            state.engine,
            SegmentRequest(
                request_id=f"speech_{uuid.uuid4().hex[:16]}",
                text=params.input,
                voice=voice,
                reference=reference,
                sampling=TalkerSampling(
                    temperature=params.sampling.temperature,
                    top_k=params.sampling.top_k,
                    top_p=params.sampling.top_p,
                    seed=params.sampling.seed,
                ),
                max_new_tokens=params.max_new_tokens,
                speed=params.speed,
            ),
        )
        chunks = job.chunks()
        try:
            first: np.ndarray | None = await anext(chunks, None)
        except EngineError as e:
            raise _engine_failure(e) from e
    except ApiError as e:
        return error_response(e, state)
    except VoiceStoreError as e:
        return error_response(store_unavailable(e), state)

    sample_rate = state.engine.sample_rate
    samples = 0

    def count(n: int) -> None:
        nonlocal samples
        samples += n
        state.metrics.audio_seconds_out.inc(n / sample_rate)

    media_type = encoder.content_type
    pcm = _prepend(first, chunks)
    if not params.stream:
        try:
            content = b"".join([data async for data in _encoded(pcm, encoder, count)])
        except EngineError as e:
            return error_response(_engine_failure(e), state)
        finally:
            await _close(chunks)
        return Response(content, media_type=media_type)
    encoded = _encoded(pcm, encoder, count)
    body = _sse_events(encoded, lambda: samples) if params.stream_format == "sse" else encoded
    return _AbortingStreamingResponse(
        _guarded(body, chunks, job),
        "text/event-stream" if params.stream_format == "sse" else media_type,
        on_disconnect=job.abort,
    )


async def list_models(request: Request, state: GatewayState) -> Response:
    try:
        authenticate(request, state)
    except ApiError as e:
        return error_response(e, state)
    names = dict.fromkeys([state.model_name, state.engine.model_id])
    data = [
        {"id": name, "object": "model", "created": _CREATED, "owned_by": "speech-gateway"}
        for name in names
    ]
    return JSONResponse({"object": "list", "data": data})


def routes(state: GatewayState) -> list[BaseRoute]:
    """The HTTP API routes of this module and of the voices API."""

    async def speech(request: Request) -> Response:
        return await create_speech(request, state)

    async def models(request: Request) -> Response:
        return await list_models(request, state)

    return [
        Route("/v1/audio/speech", speech, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        *voice_routes(state),
    ]
