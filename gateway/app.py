"""The Starlette application: WebSocket ``/v1/realtime`` plus the HTTP surface.

The WebSocket handler only moves messages between the socket and a
``SessionPipeline``; admission (auth, limits, readiness) happens before the
session starts, and refusals are explained with an ``error`` event followed by
the close code, which browsers can see (an HTTP status on a refused upgrade is
invisible to them).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from prometheus_client import Gauge
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from gateway import availability
from gateway.auth import AuthError
from gateway.device_trace import DeviceTraceSignal
from gateway.engine_health import watch_engine
from gateway.gc_heap import freeze_startup_heap
from gateway.loop_lag import watch_loop_lag
from gateway.metrics import EnginePoller
from gateway.metrics_fanout import SCOPE_PARAM, WORKER_SCOPE, server_metrics
from gateway.protocol import (
    CLOSE_POLICY,
    CLOSE_SERVER_ERROR,
    CLOSE_TRY_AGAIN,
    SUBPROTOCOL,
    ErrorCode,
    ErrorDetail,
    ErrorEvent,
    SessionConfig,
    dump_event,
    safe_json,
)
from gateway.realtime.outbound import OutClose
from gateway.realtime.pipeline import KeyContextQuota, SegmenterFactory, SessionPipeline
from gateway.realtime.segmenting import default_segmenter_factory
from gateway.settings import GatewaySettings
from gateway.state import GatewayState, VoiceRegistry
from gateway.web_demo import demo_routes, find_demo_dir
from realtime_engine.engines.base import SpeechEngine

log = logging.getLogger("gateway")


def _default_voices(state: GatewayState) -> VoiceRegistry | None:
    try:
        voices = importlib.import_module("gateway.voices")
    except ImportError:
        return None
    library = getattr(voices, "VoiceLibrary", None)
    if library is None:
        return None
    settings = state.settings
    backend = voices.open_voice_backend(settings.voice_store, settings.voice_dir)
    log.info("voices kept in %s", backend.description)
    registry: VoiceRegistry = library(
        state.engine,
        max_reference_seconds=settings.limits.max_reference_seconds,
        max_cached=settings.voice_cache_entries,
        backend=backend,
    )
    return registry


def _voice_metrics(state: GatewayState) -> None:
    """/metrics gauges read from the voice library's counters, when it keeps them."""
    stats = getattr(state.voices, "stats", None)
    if not callable(stats):
        return
    for name, field, doc in (
        ("speech_voice_encodes", "encodes", "Reference clips run through the codec encoder"),
        ("speech_voice_cache_hits", "hits", "Reference clips answered from the voice cache"),
        ("speech_voice_cache_evictions", "evictions", "Encoded voices evicted from memory"),
        ("speech_voice_cache_entries", "cached", "Encoded voices held in memory"),
    ):
        Gauge(name, doc, registry=state.metrics.registry).set_function(_reader(stats, field))


def _reader(stats: Callable[[], object], field: str) -> Callable[[], float]:
    return lambda: float(getattr(stats(), field))


def _http_routes(state: GatewayState) -> list[BaseRoute]:
    """Routes of the OpenAI-compatible HTTP module, when it is installed."""
    try:
        module = importlib.import_module("gateway.http.speech")
    except ImportError:
        return []
    routes = getattr(module, "routes", None)
    return list(routes(state)) if routes is not None else []


def create_app(
    settings: GatewaySettings | None = None,
    engine: SpeechEngine | None = None,
    *,
    voices: VoiceRegistry | None = None,
    segmenter_factory: SegmenterFactory | None = None,
) -> Starlette:
    if engine is None:
        raise ValueError("create_app needs an engine")
    settings = settings or GatewaySettings()
    state = GatewayState.create(settings, engine, voices)
    if voices is None:
        state.voices = _default_voices(state) or state.voices
    _voice_metrics(state)
    segmenters = segmenter_factory or default_segmenter_factory

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        warm = asyncio.create_task(_warm_up(state))
        sampler = asyncio.create_task(_sample_engine_stats(state, after=warm))
        health = asyncio.create_task(_watch_health(state, after=warm))
        lag = asyncio.create_task(watch_loop_lag(state.metrics.event_loop_lag_seconds.observe))
        trace_signal = DeviceTraceSignal(engine)
        trace_signal.install()
        if not settings.warm_in_background:
            await asyncio.shield(warm)
            if state.engine_error is not None:
                raise RuntimeError(f"the {engine.name} engine failed: {state.engine_error}")
        try:
            yield
        finally:
            trace_signal.uninstall()
            state.ready = False
            state.draining = True
            for task in (warm, sampler, health, lag):
                task.cancel()
            await asyncio.gather(warm, sampler, health, lag, return_exceptions=True)
            await engine.close()
            if state.encode_pool is not None:
                state.encode_pool.shutdown(cancel_futures=True)
            close_voices = getattr(state.voices, "close", None)
            if callable(close_voices):
                await close_voices()  # a shared store's connections

    async def realtime(ws: WebSocket) -> None:
        await _serve_session(ws, state, segmenters)

    routes: list[BaseRoute] = [
        WebSocketRoute("/v1/realtime", realtime),
        Route("/health", _health),
        Route("/ready", _ready),
        Route("/metrics", _metrics),
        Route("/v1/tokens", _tokens, methods=["POST"]),
        *demo_routes(_FALLBACK_PAGE, find_demo_dir()),
        *_http_routes(state),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.gateway = state
    return app


async def _warm_up(state: GatewayState) -> None:
    """Load and warm the engine; the gateway is ready once this returns."""
    try:
        await state.engine.start()
    except Exception as e:
        state.engine_error = f"{type(e).__name__}: {e}"
        log.error("the %s engine failed to start", state.engine.name, exc_info=e)
        return
    if state.settings.freeze_gc_heap:
        frozen = freeze_startup_heap()  # before the first session: a pause nobody hears
        log.info("froze %d start-up objects out of the collector's full passes", frozen)
    state.ready = True


async def _sample_engine_stats(
    state: GatewayState, after: asyncio.Task[None], interval_s: float = 1.0
) -> None:
    """Feed /metrics from engines that expose cumulative ``stats()`` / ``rank_stats()``."""
    await asyncio.shield(after)  # sample only an engine that started
    poller = EnginePoller(state.metrics, state.engine)
    if not state.ready or not poller.active:
        return
    while True:
        poller.poll()
        await asyncio.sleep(interval_s)


async def _watch_health(state: GatewayState, after: asyncio.Task[None]) -> None:
    await asyncio.shield(after)  # a started engine only
    if state.ready:
        await watch_engine(state)


def _state(request: Request) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    return state


# --------------------------------------------------------------------------- HTTP


async def _health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def _ready(request: Request) -> Response:
    state = _state(request)
    if state.ready and not state.draining:
        return JSONResponse(
            {"status": "ready", "engine": state.engine.name, "model": state.model_name}
        )
    if state.engine_error is not None:
        return JSONResponse({"status": "failed", "error": state.engine_error}, status_code=503)
    return JSONResponse({"status": "draining" if state.draining else "loading"}, status_code=503)


async def _metrics(request: Request) -> Response:
    """Prometheus text: with several workers, for all of them (``?scope=worker``: this one)."""
    state = _state(request)
    metrics, sockets = state.metrics, state.settings.worker_sockets
    own = metrics.render()
    if not sockets or request.query_params.get(SCOPE_PARAM) == WORKER_SCOPE:
        return Response(own, media_type=metrics.content_type)
    settings = state.settings
    body = await server_metrics(own, settings.worker_index, sockets, settings.workers_share_engine)
    return Response(body, media_type=metrics.content_type)


def _error_body(detail: ErrorDetail) -> dict[str, Any]:
    return {"error": detail.model_dump(exclude_none=True)}


async def _tokens(request: Request) -> Response:
    """Mint a short-lived token a browser can pass as ``?token=``."""
    state = _state(request)
    try:
        principal = state.auth.check_bearer(request.headers.get("authorization"))
    except AuthError as e:
        detail = ErrorDetail(type="authentication_error", code=e.code, message=e.message)
        state.metrics.error(detail.type, detail.code)
        return JSONResponse(_error_body(detail), status_code=401)
    ttl = state.settings.token_ttl_s
    body = await request.body()
    if body:
        try:
            payload = safe_json.loads(body)
            requested = payload.get("expires_in_s", ttl) if isinstance(payload, dict) else None
            if isinstance(requested, bool) or not isinstance(requested, int | float):
                raise ValueError("expires_in_s must be a number")
            if not 0 < requested <= state.settings.max_token_ttl_s:
                raise ValueError(
                    f"expires_in_s must be within (0, {state.settings.max_token_ttl_s}]"
                )
            ttl = float(requested)
        except ValueError as e:
            detail = ErrorDetail(
                type="invalid_request_error",
                code=ErrorCode.INVALID_VALUE,
                message=str(e),
                param="expires_in_s",
            )
            state.metrics.error(detail.type, detail.code)
            return JSONResponse(_error_body(detail), status_code=400)
    minted = state.auth.mint(principal, ttl)
    return JSONResponse(
        {
            "token": minted.token,
            "expires_at": minted.expires_at,
            "expires_in_s": minted.expires_in_s,
        }
    )


_FALLBACK_PAGE = """<!doctype html><meta charset="utf-8"><title>Speech gateway</title>
<h1>Realtime speech gateway</h1>
<p>WebSocket: <code>/v1/realtime</code> (subprotocol <code>speech.v1</code>).
HTTP: <code>POST /v1/audio/speech</code>. Health: <a href="/health">/health</a>,
<a href="/ready">/ready</a>, <a href="/metrics">/metrics</a>.</p>"""


# --------------------------------------------------------------------------- WebSocket


async def _refuse(ws: WebSocket, subprotocol: str | None, detail: ErrorDetail, code: int) -> None:
    with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
        await ws.accept(subprotocol=subprotocol)
        await ws.send_text(dump_event(ErrorEvent(error=detail)))
        await ws.close(code=code, reason=detail.code)


def _admission_error(ws: WebSocket, state: GatewayState) -> tuple[ErrorDetail, int] | str:
    """The principal's key id, or why (and with which close code) to refuse."""
    try:
        principal = state.auth.authenticate(
            ws.headers.get("authorization"), ws.query_params.get("token")
        )
    except AuthError as e:
        return ErrorDetail(
            type="authentication_error", code=e.code, message=e.message
        ), CLOSE_POLICY
    model = ws.query_params.get("model")
    if model and model not in (state.model_name, state.engine.model_id, state.engine.name):
        detail = ErrorDetail(
            type="invalid_request_error",
            code=ErrorCode.INVALID_VALUE,
            message=f"this server serves {state.model_name!r}, not {model!r}",
            param="model",
        )
        return detail, CLOSE_POLICY
    unavailable = availability.refusal(state)  # draining, warming up, or the engine died
    if unavailable is not None:
        return unavailable, CLOSE_TRY_AGAIN
    return principal.key_id


def _limit_error(refusal: str, state: GatewayState) -> tuple[ErrorDetail, int]:
    """The error (and close code) of a session a limit refused."""
    if refusal == "server":
        detail = ErrorDetail(
            type="engine_overloaded",
            code=ErrorCode.SESSION_LIMIT,
            message=f"the server is at its limit of {state.admission.max_sessions} sessions",
            retryable=True,
            retry_after_ms=1000,
        )
        return detail, CLOSE_TRY_AGAIN
    detail = ErrorDetail(
        type="rate_limit_error",
        code=ErrorCode.KEY_SESSION_LIMIT,
        message=f"this key has {state.admission.max_sessions_per_key} sessions open",
        retryable=True,
        retry_after_ms=1000,
    )
    return detail, CLOSE_TRY_AGAIN


async def _serve_session(
    ws: WebSocket, state: GatewayState, segmenter_factory: SegmenterFactory
) -> None:
    offered = ws.scope.get("subprotocols") or []
    subprotocol = SUBPROTOCOL if SUBPROTOCOL in offered else None
    admitted = _admission_error(ws, state)
    if isinstance(admitted, str):
        # checked and counted in one step: with worker processes, on the server's counters
        refusal = state.admission.try_open_session(admitted)
        if refusal is not None:
            admitted = _limit_error(refusal, state)
    if not isinstance(admitted, str):
        detail, code = admitted
        state.metrics.sessions_refused.labels(reason=detail.code).inc()
        state.metrics.error(detail.type, detail.code)
        await _refuse(ws, subprotocol, detail, code)
        return
    key_id = admitted
    state.metrics.sessions_total.inc()
    state.metrics.sessions_active.inc()
    pipeline: SessionPipeline | None = None
    try:
        config = SessionConfig(id=f"sess_{secrets.token_hex(12)}", model=state.model_name)
        pipeline = SessionPipeline(
            state, config, segmenter_factory, quota=KeyContextQuota(state, key_id), key_id=key_id
        )
        await ws.accept(subprotocol=subprotocol)
        await pipeline.start()
        writer = asyncio.create_task(_write(ws, pipeline))
        reader = asyncio.create_task(_read(ws, pipeline))
        done, _ = await asyncio.wait({writer, reader}, return_when=asyncio.FIRST_COMPLETED)
        for task in (writer, reader):
            if task not in done:
                task.cancel()
        await asyncio.gather(writer, reader, return_exceptions=True)
        for task in done:
            error = None if task.cancelled() else task.exception()
            if error is not None:
                log.error("session %s failed", config.id, exc_info=error)
                await _close_quietly(ws, CLOSE_SERVER_ERROR, "internal error")
    finally:
        # Bookkeeping first: it must happen even if this task is being cancelled.
        state.admission.close_session(key_id)
        state.metrics.sessions_active.dec()
        if pipeline is not None:
            await pipeline.aclose()


async def _read(ws: WebSocket, pipeline: SessionPipeline) -> None:
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            return
        if message.get("text") is not None:
            await pipeline.receive_text(message["text"])
        elif message.get("bytes") is not None:
            await pipeline.receive_bytes(message["bytes"])


async def _write(ws: WebSocket, pipeline: SessionPipeline) -> None:
    try:
        while True:
            message = await pipeline.next_message()
            if isinstance(message, OutClose):
                await _close_quietly(ws, message.code, message.reason)
                return
            if isinstance(message, bytes):
                await ws.send_bytes(message)
            else:
                await ws.send_text(message)
    except (WebSocketDisconnect, RuntimeError, OSError):
        return  # the peer went away; the reader sees the disconnect


async def _close_quietly(ws: WebSocket, code: int, reason: str) -> None:
    if ws.application_state == WebSocketState.DISCONNECTED:
        return
    with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):
        await ws.close(code=code, reason=reason)
