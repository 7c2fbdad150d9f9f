"""A real uvicorn server on a free port, inside the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Literal

import uvicorn
from starlette.types import ASGIApp


@contextlib.asynccontextmanager
async def live_server(
    app: ASGIApp, *, lifespan: Literal["auto", "on", "off"] = "off", port: int = 0
) -> AsyncIterator[str]:
    """Serve ``app`` on 127.0.0.1 (a free port unless ``port`` is given: a restart reuses
    the port it had); yield its base URL (``http://127.0.0.1:PORT``)."""
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, lifespan=lifespan, log_level="warning"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()  # surfaces a startup failure
                raise RuntimeError("the test server stopped before it started")
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
