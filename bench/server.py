"""A gateway served in-process on an ephemeral port, for smoke runs and tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

import uvicorn

from realtime_engine.engines.base import SpeechEngine


class ServerStartError(RuntimeError):
    """The in-process server did not start listening."""


def gateway_app(engine: SpeechEngine, **settings: Any) -> Any:
    """The gateway's ASGI app around ``engine`` (settings as ``GatewaySettings`` fields)."""
    from gateway.app import create_app
    from gateway.settings import GatewaySettings

    # One anonymous client opens every bench session: lift the per-key caps.
    settings.setdefault("max_sessions_per_key", 100_000)
    settings.setdefault("max_contexts_per_key", 100_000)
    return create_app(GatewaySettings(port=0, **settings), engine)


@contextlib.asynccontextmanager
async def serve(
    app: Any, host: str = "127.0.0.1", start_timeout_s: float = 30.0
) -> AsyncIterator[str]:
    """Run ``app`` with uvicorn on port 0 in this event loop; yields ``http://host:port``."""
    config = uvicorn.Config(
        app,
        host=host,
        port=0,
        log_level=os.environ.get("BENCH_SERVER_LOG", "warning"),
        lifespan="on",
        ws_max_size=16 * 1024 * 1024,
        backlog=2048,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(), name="bench-gateway")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + start_timeout_s
    while not server.started:
        if task.done():
            exc = task.exception()
            raise ServerStartError(f"gateway exited during start-up: {exc!r}") from exc
        if loop.time() > deadline:
            server.should_exit = True
            await asyncio.gather(task, return_exceptions=True)
            raise ServerStartError(f"gateway not listening after {start_timeout_s} s")
        await asyncio.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        await asyncio.gather(task, return_exceptions=True)
