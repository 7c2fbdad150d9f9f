"""A client that stops reading is held at its own bounded queue; others stream on."""

from __future__ import annotations

import asyncio
import json
import re
import socket

import httpx
from gateway_support import fake_app, serve
from websockets.asyncio.client import ClientConnection, connect

from gateway.protocol import unpack_audio_frame
from realtime_engine.engines.fake import FakeEngine

QUEUE_ITEMS = 8
TEXT = "A long enough sentence to fill many frames of audio for the slow reader. " * 80


async def speak(ws: ClientConnection, context_id: str, text: str) -> None:
    pcm = {"type": "session.update", "session": {"output": {"format": "pcm16"}}}
    await ws.send(json.dumps(pcm))
    await ws.send(json.dumps({"type": "text.append", "context_id": context_id, "text": text}))
    await ws.send(json.dumps({"type": "context.end", "context_id": context_id}))


async def read_context(ws: ClientConnection, until: str = "context.done") -> list[int]:
    """Frame seqs up to the ``until`` event."""
    seqs: list[int] = []
    while True:
        raw = await asyncio.wait_for(ws.recv(), 30)
        if isinstance(raw, bytes):
            seqs.append(unpack_audio_frame(raw).seq)
        elif json.loads(raw)["type"] == until:
            return seqs


async def outbound_depth(http: httpx.AsyncClient) -> float:
    text = (await http.get("/metrics")).text
    match = re.search(r"^speech_outbound_queue_depth (\S+)$", text, re.M)
    assert match is not None
    return float(match.group(1))


async def test_a_reader_that_stops_holds_only_its_own_queue() -> None:
    engine = FakeEngine(chunk_samples=960)  # as fast as it is consumed
    app = fake_app(engine, outbound_queue_items=QUEUE_ITEMS, limits={"max_lead_s": 3600})
    async with serve(app) as url, httpx.AsyncClient(base_url=url.replace("ws", "http")) as http:
        # A tiny receive buffer and a one-message client queue: the kernel and
        # the client library stop absorbing frames almost at once.
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", int(url.rsplit(":", 1)[1])))
        slow = await connect(f"{url}/v1/realtime", sock=sock, max_queue=1)
        await speak(slow, "slow", TEXT)
        async with asyncio.timeout(30):  # the slow session's queue fills up, and stays bounded
            while await outbound_depth(http) < QUEUE_ITEMS:
                pass
        async with connect(f"{url}/v1/realtime") as fast:
            for n in range(3):
                await speak(fast, f"fast{n}", "Other sessions are not held up.")
                seqs = await read_context(fast)
                assert seqs == list(range(len(seqs))) and seqs
        assert await outbound_depth(http) <= QUEUE_ITEMS
        slow_session = engine.log.requests[0].request_id.rsplit(":", 2)[0]
        running = [rid for rid in engine.running if rid.startswith(slow_session)]
        assert running, "its generation waits for the reader"
        # Reading again it gets what was queued, in order; a cancel ends the rest.
        await slow.send(json.dumps({"type": "context.cancel", "context_id": "slow"}))
        seqs = await read_context(slow, until="context.cancelled")
        assert seqs == list(range(len(seqs))) and len(seqs) > QUEUE_ITEMS
        await slow.close()
