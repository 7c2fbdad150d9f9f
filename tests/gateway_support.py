"""Shared pieces for the gateway tests: a small sentence segmenter and WS helpers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.types import ASGIApp
from websockets.asyncio.client import ClientConnection, connect

from gateway.app import create_app
from gateway.protocol import Limits, SessionConfig
from gateway.settings import GatewaySettings
from realtime_engine.engines.fake import FakeEngine

_SENTENCE_END = re.compile(r"[.!?]+\s+")


class SentenceSegmenter:
    """Implements ``gateway.realtime.session.Segmenter``: sentence ends, else the buffer delay."""

    def __init__(self, max_delay_s: float) -> None:
        self.max_delay_s = max_delay_s
        self.buffer = ""
        self.first_unspoken_at: float | None = None

    def feed(self, text: str, now: float) -> list[str]:
        if text and not self.buffer:
            self.first_unspoken_at = now
        self.buffer += text
        out: list[str] = []
        while match := _SENTENCE_END.search(self.buffer):
            out.append(self.buffer[: match.end()])
            self.buffer = self.buffer[match.end() :]
        if out:
            self.first_unspoken_at = now if self.buffer else None
        return out

    def poll(self, now: float) -> list[str]:
        deadline = self.next_deadline()
        if deadline is None or now < deadline:
            return []
        cut = self.buffer.rfind(" ")
        if cut <= 0:
            return []
        head, self.buffer = self.buffer[: cut + 1], self.buffer[cut + 1 :]
        self.first_unspoken_at = now if self.buffer else None
        return [head]

    def flush(self) -> list[str]:
        out = [self.buffer] if self.buffer else []
        self.buffer, self.first_unspoken_at = "", None
        return out

    def next_deadline(self) -> float | None:
        if self.first_unspoken_at is None or " " not in self.buffer.strip():
            return None
        return self.first_unspoken_at + self.max_delay_s


def sentence_segmenter(config: SessionConfig) -> SentenceSegmenter:
    return SentenceSegmenter(config.text_buffering.max_buffer_delay_ms / 1000)


# --------------------------------------------------------------------------- servers


@contextlib.asynccontextmanager
async def serve(app: ASGIApp, **ws_options: Any) -> AsyncIterator[str]:
    """Run ``app`` on a real uvicorn at 127.0.0.1:0 (lifespan on); yield ``ws://host:port``."""
    options: dict[str, Any] = {"ws_per_message_deflate": False, **ws_options}
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, lifespan="on", log_level="warning", **options
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("the test server stopped before it started")
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"ws://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


def fake_app(engine: FakeEngine | None = None, **settings: Any) -> Starlette:
    limits = settings.pop("limits", {})
    gateway_settings = GatewaySettings(limits=Limits(**limits), **settings)
    return create_app(
        gateway_settings, engine or FakeEngine(), segmenter_factory=sentence_segmenter
    )


async def open_session(base: str, key: str | None = None) -> ClientConnection:
    """A WebSocket session on ``base`` (``http://host:port``), past ``session.created``."""
    headers = {"Authorization": f"Bearer {key}"} if key else None
    ws = await connect(base.replace("http", "ws") + "/v1/realtime", additional_headers=headers)
    assert (await next_event(ws))["type"] == "session.created"
    return ws


async def next_event(ws: ClientConnection) -> dict[str, Any]:
    """The next JSON event (audio frames skipped)."""
    while True:
        message = await ws.recv()
        if isinstance(message, str):
            event: dict[str, Any] = json.loads(message)
            return event


async def send_event(ws: ClientConnection, event: dict[str, Any]) -> dict[str, Any]:
    """Send ``event``; the next JSON event back."""
    await ws.send(json.dumps(event))
    return await next_event(ws)


async def speak_context(
    ws: ClientConnection, context_id: str, text: str
) -> tuple[list[dict[str, Any]], int]:
    """Speak ``text`` in one context: its events up to ``context.done``, and the audio bytes."""
    await ws.send(json.dumps({"type": "text.append", "context_id": context_id, "text": text}))
    await ws.send(json.dumps({"type": "context.end", "context_id": context_id}))
    events: list[dict[str, Any]] = []
    audio = 0
    while True:
        message = await ws.recv()
        if isinstance(message, bytes):
            audio += len(message)
            continue
        events.append(json.loads(message))
        if events[-1]["type"] == "context.done":
            return events, audio
