"""SDK behaviour at the protocol's edges, against a scripted WebSocket server
(a real ``websockets`` server on port 0 that plays a fixed script)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from websockets.asyncio.server import ServerConnection, serve

from gateway.client import (
    AudioChunk,
    ProtocolViolationError,
    ServerClosedError,
    TryAgainLaterError,
    connect,
)
from gateway.protocol import (
    ContextCreated,
    ContextDone,
    ContextMetrics,
    Limits,
    SessionConfig,
    SessionCreated,
    SessionUpdated,
    pack_audio_frame,
)

Script = Callable[[ServerConnection], Awaitable[None]]


@contextlib.asynccontextmanager
async def scripted(script: Script) -> AsyncIterator[str]:
    async with serve(script, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"ws://127.0.0.1:{port}/v1/realtime"


def created() -> str:
    return SessionCreated(session=SessionConfig(id="sess_x"), limits=Limits()).model_dump_json()


async def test_unknown_event_types_are_skipped_and_bad_known_ones_raise() -> None:
    async def script(ws: ServerConnection) -> None:
        await ws.send(created())
        await ws.send(json.dumps({"type": "future.feature", "x": 1}))
        await ws.send(json.dumps({"type": "context.created", "context_id": "c"}))  # no stream
        await ws.send(b"\x09\x01")  # not a v1 frame
        await ws.wait_closed()

    async with scripted(script) as url, connect(url) as conn:
        events = aiter(conn)
        with pytest.raises(ProtocolViolationError):
            await anext(events)
        with pytest.raises(ProtocolViolationError):
            await anext(aiter(conn))
        assert conn.unknown_events == 1


async def test_replies_without_reply_to_still_resolve_requests() -> None:
    async def script(ws: ServerConnection) -> None:
        await ws.send(created())
        request = json.loads(await ws.recv())
        assert request["type"] == "session.update" and request["event_id"]
        session = SessionConfig(id="sess_x", voice=request["session"]["voice"])
        await ws.send(SessionUpdated(session=session).model_dump_json())  # no reply_to
        await ws.wait_closed()

    async with scripted(script) as url, connect(url) as conn:
        assert (await conn.session.update(voice="other")).voice == "other"


async def test_audio_is_routed_by_stream_and_timed() -> None:
    async def script(ws: ServerConnection) -> None:
        await ws.send(created())
        append = json.loads(await ws.recv())
        cid = append["context_id"]
        await ws.send(ContextCreated(context_id=cid, stream=7).model_dump_json())
        # an Opus frame header around a code-0 CELT 20 ms TOC: duration without decoding
        for seq in range(3):
            await ws.send(pack_audio_frame(7, seq, seq * 20, bytes([(31 << 3) | 0, 0])))
        done = ContextDone(context_id=cid, audio_ms=60, metrics=ContextMetrics(ttfa_ms=12.5))
        await ws.send(done.model_dump_json())
        await ws.wait_closed()

    async with scripted(script) as url, connect(url) as conn:
        ctx = conn.context("c")
        await ctx.append("hi")
        chunks = [c async for c in ctx.audio(decode=False)]
        assert [(c.stream, c.seq, c.pts_ms, c.duration_ms) for c in chunks] == [
            (7, 0, 0, 20.0),
            (7, 1, 20, 20.0),
            (7, 2, 40, 20.0),
        ]
        assert all(isinstance(c, AudioChunk) and c.pcm is None for c in chunks)
        assert chunks[0].received_at <= chunks[-1].received_at
        assert isinstance(ctx.result, ContextDone) and ctx.result.metrics.ttfa_ms == 12.5


@pytest.mark.parametrize(("code", "error"), [(1013, TryAgainLaterError), (1011, ServerClosedError)])
async def test_close_at_connect_is_typed(code: int, error: type[Exception]) -> None:
    async def script(ws: ServerConnection) -> None:
        await ws.close(code, "busy")

    async with scripted(script) as url:
        with pytest.raises(error) as err:
            await connect(url)
    assert err.value.code == code  # type: ignore[attr-defined]


async def test_close_mid_context_fails_the_context() -> None:
    async def script(ws: ServerConnection) -> None:
        await ws.send(created())
        append = json.loads(await ws.recv())
        await ws.send(ContextCreated(context_id=append["context_id"], stream=0).model_dump_json())
        await ws.close(1011, "engine died")

    async with scripted(script) as url, connect(url) as conn:
        ctx = conn.context("c")
        await ctx.append("hi")
        with pytest.raises(ServerClosedError):
            async for _ in ctx.audio():
                pass
        with pytest.raises(ServerClosedError):
            await ctx.wait_finished(5)
