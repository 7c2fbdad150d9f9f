"""Build an engine and serve it on uvicorn: one gateway process (``serve``, or a worker)."""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from collections.abc import Callable

import uvicorn

from gateway.app import create_app
from gateway.drain import ENGINE_DEAD_EXIT_STATUS, SUPERVISOR_STOP_SIGNAL, DrainingServer
from gateway.settings import GatewaySettings
from gateway.state import GatewayState
from realtime_engine.engines.base import EngineError, SpeechEngine
from realtime_engine.format import DEFAULT_CODEC_KERNELS, DEFAULT_CODEC_PRECISION
from realtime_engine.talker.backends import TalkerOptions


def build_engine(
    kind: str,
    model: str | None,
    device: str | None,
    talker: TalkerOptions | None = None,
    codec_precision: str = DEFAULT_CODEC_PRECISION,
    codec_batch: int = 64,
    codec_kernels: str = DEFAULT_CODEC_KERNELS,
    fake_options: dict[str, object] | None = None,
    talker_host: str | None = None,
) -> SpeechEngine:
    """``talker_host``: the vLLM talker's engine is served by that endpoint
    (``serve --workers``) instead of started here."""
    if kind == "fake":
        from realtime_engine.engines.fake import FakeEngine

        try:
            return FakeEngine(None, **(fake_options or {}))
        except TypeError as e:
            raise EngineError(f"--fake-options: {e}") from e
    if fake_options:
        raise EngineError("--fake-options applies to --engine fake only")
    if kind == "cpu-voice":
        from realtime_engine.engines.cpu_voice import CpuVoiceEngine

        return CpuVoiceEngine()
    from realtime_engine.engines.higgs import HiggsEngine

    engine: SpeechEngine = HiggsEngine.from_pretrained(
        model or "tiny",
        device,
        talker=talker,
        codec_precision=codec_precision,
        codec_batch=codec_batch,
        codec_kernels=codec_kernels,
        talker_host=talker_host,
    )
    return engine


def say(message: str) -> None:
    print(f"speech-gateway: {message}", flush=True)


def build_server(
    settings: GatewaySettings, engine: SpeechEngine, log_level: str = "info"
) -> tuple[DrainingServer, GatewayState]:
    """The server for ``settings.host``/``port`` (or for the sockets given to its ``serve``)."""
    app = create_app(settings, engine)
    state: GatewayState = app.state.gateway
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        lifespan="on",
        log_level=log_level,
        # Messages up to twice the limit reach the session (an error, then 1009
        # on the second); beyond that the transport closes with 1009 at once.
        ws_max_size=2 * settings.limits.max_message_bytes,
        # Opus and PCM do not compress: per-message deflate only costs CPU
        # and latency on every frame.
        ws_per_message_deflate=False,
        ws_ping_interval=settings.ws_ping_interval_s,
        ws_ping_timeout=settings.ws_ping_timeout_s,
    )
    server = DrainingServer(config, state, settings.drain_timeout_s, settings.exit_on_engine_death)
    return server, state


async def serve(
    settings: GatewaySettings,
    engine: SpeechEngine,
    log_level: str = "info",
    say: Callable[[str], None] = say,
    *,
    sockets: list[socket.socket] | None = None,
    on_ready: Callable[[], None] | None = None,
) -> bool:
    """Serve until interrupted; False when the server never started (engine failed).

    ``sockets``: serve on these bound sockets (a worker: the shared one first)
    instead of binding ``settings.host``/``port``. ``on_ready`` is called once
    the engine is warm; a worker's supervisor announces the address then.
    """
    server, state = build_server(settings, engine, log_level)
    if settings.workers > 1:  # a worker: its supervisor's stops come as their own signal
        signal.signal(SUPERVISOR_STOP_SIGNAL, server.handle_supervisor_stop)
    task = asyncio.create_task(server.serve(sockets))
    started = time.perf_counter()
    while not server.started and not task.done():
        await asyncio.sleep(0.05)
    if not server.started:
        await task
        return False
    port = server.servers[0].sockets[0].getsockname()[1]
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "") else settings.host
    say(f"listening on {host}:{port}; warming up the {engine.name} engine ({engine.model_id})")
    while not state.ready and state.engine_error is None and not task.done():
        await asyncio.sleep(0.05)
    if state.engine_error is not None:
        say(f"error: the engine failed to start: {state.engine_error}")
        server.should_exit = True
        await task
        return False
    if state.ready:
        say(f"ready in {time.perf_counter() - started:.1f}s")
        if on_ready is not None:
            on_ready()
        else:
            say(f"open http://{host}:{port}/  (WebSocket ws://{host}:{port}/v1/realtime)")
    await task
    if server.engine_died:
        say(f"error: the engine died: {state.engine_error}")
        raise SystemExit(ENGINE_DEAD_EXIT_STATUS)
    return True
