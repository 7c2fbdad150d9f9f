"""One check for every engine: kill it mid-stream, then everything must report it promptly.

``check_death_is_reported`` opens sessions with streaming contexts on a live
gateway, calls ``kill`` once audio flows on all of them, and asserts: every
open context gets a retryable ``engine_unavailable`` error and a failed
``context.done`` within ``REPORT_WITHIN_S``; ``/ready`` is 503; the metrics
say so; new sessions get 1013, new contexts and HTTP requests are refused
retryably; and every connection still closes cleanly (nothing hangs).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
from ws_recorder import Client, is_event, open_client

from gateway.protocol import CLOSE_TRY_AGAIN, ErrorCode

REPORT_WITHIN_S = 2.0
SESSION = {"output": {"format": "pcm16"}, "max_audio_seconds": 30}
LONG_TEXT = "Keep talking for quite a while so the stream is still going. " * 4


async def check_death_is_reported(
    url: str, kill: Callable[[], Any], sessions: int = 2, contexts_per_session: int = 2
) -> float:
    """Returns the seconds from the kill to the last context's error."""
    ws_url = url.replace("http://", "ws://") + "/v1/realtime"
    clients = [await open_client(ws_url) for _ in range(sessions)]
    contexts: list[tuple[Client, str]] = []
    for n, client in enumerate(clients):
        await client.send(type="session.update", session=SESSION)
        await client.wait_for(is_event("session.updated"))
        for c in range(contexts_per_session):
            context_id = f"s{n}c{c}"
            await client.send(type="text.append", context_id=context_id, text=LONG_TEXT)
            await client.send(type="context.end", context_id=context_id)
            contexts.append((client, context_id))
    for client in clients:  # audio flows everywhere: the kill lands mid-stream
        await client.wait_for(lambda item: isinstance(item, bytes), timeout=120)
    # One more context that has text but no audio yet must fail just the same.
    idle = clients[0]
    await idle.send(type="text.append", context_id="waiting", text="No sentence end yet")
    await idle.wait_for(is_event("context.created", context_id="waiting"))
    contexts.append((idle, "waiting"))

    result = kill()
    if asyncio.iscoroutine(result):
        await result
    killed = time.perf_counter()
    last = 0.0
    for client, context_id in contexts:
        error = await client.wait_for(
            is_event("error", context_id=context_id), timeout=REPORT_WITHIN_S + 5
        )
        assert error["error"]["code"] == ErrorCode.ENGINE_UNAVAILABLE, error
        assert error["error"]["retryable"] and error["error"]["retry_after_ms"] > 0
        done = await client.wait_for(is_event("context.done", context_id=context_id))
        assert done["status"] == "failed"
        at = next(t for t, item in client.events if item is error)
        last = max(last, at - killed)
    assert last <= REPORT_WITHIN_S, f"the last context heard after {last:.2f} s"

    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        # A stream can hear of the death before the health watch's next poll
        # flips /ready: readiness must follow within the same bound.
        deadline = killed + REPORT_WITHIN_S
        while (ready := await http.get("/ready")).status_code != 503:
            assert time.perf_counter() < deadline, f"/ready still {ready.text}"
            await asyncio.sleep(0.02)
        assert ready.json()["status"] == "failed", ready.text
        metrics = (await http.get("/metrics")).text
        assert "speech_engine_up 0.0" in metrics
        assert "speech_engine_deaths_total 1.0" in metrics
        speech = await http.post("/v1/audio/speech", json={"input": "Hello.", "model": "x"})
        assert speech.status_code == 503
        assert speech.json()["error"]["code"] == ErrorCode.ENGINE_UNAVAILABLE

    # An open session cannot start new contexts; a new session is told to come back.
    await idle.send(type="text.append", context_id="after", text="Hello.")
    refused = await idle.wait_for(is_event("error", context_id="after"))
    assert refused["error"]["code"] == ErrorCode.ENGINE_UNAVAILABLE
    assert refused["error"]["retryable"]
    late = await _connect(ws_url)
    assert await late.closed_with() == CLOSE_TRY_AGAIN
    first = late.events[0][1]
    assert isinstance(first, dict) and first["error"]["code"] == ErrorCode.ENGINE_UNAVAILABLE

    # Nothing hangs: every session still closes promptly.
    for client in clients:
        await client.ws.close()
        await asyncio.wait_for(client.task, 10)
    return last


async def _connect(ws_url: str) -> Client:
    from websockets.asyncio.client import connect

    return Client(await connect(ws_url))
