"""A real uvicorn server on port 0 and the ``websockets`` client: concurrency, auth, limits."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import httpx
import pytest
from gateway_support import fake_app, serve
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

from gateway.protocol import (
    CLOSE_POLICY,
    CLOSE_TRY_AGAIN,
    SUBPROTOCOL,
    parse_server_event,
    unpack_audio_frame,
)
from realtime_engine.engines.fake import FakeEngine


async def send(ws: ClientConnection, **event: Any) -> None:
    await ws.send(json.dumps(event))


async def until(ws: ClientConnection, type_: str, **match: Any) -> dict[str, Any]:
    while True:
        message = await asyncio.wait_for(ws.recv(), 10)
        if isinstance(message, bytes):
            continue
        parse_server_event(message)
        event: dict[str, Any] = json.loads(message)
        if event["type"] == type_ and all(event.get(k) == v for k, v in match.items()):
            return event


async def close_code(ws: ClientConnection) -> int:
    with pytest.raises(ConnectionClosed) as info:
        while True:
            await asyncio.wait_for(ws.recv(), 10)
    assert info.value.rcvd is not None
    return info.value.rcvd.code


async def test_fifty_contexts_random_cancels_no_frame_after_cancelled() -> None:
    engine = FakeEngine(realtime_factor=0.05, chunk_samples=960, first_chunk_delay_s=0.005)
    app = fake_app(engine, limits={"max_contexts": 64})
    pcm = {"output": {"format": "pcm16"}}
    rng = random.Random(7)
    names = [f"ctx{i}" for i in range(50)]
    to_cancel = set(rng.sample(names, 35))
    async with (
        serve(app) as url,
        connect(f"{url}/v1/realtime", subprotocols=[Subprotocol(SUBPROTOCOL)]) as ws,
    ):
        assert ws.subprotocol == SUBPROTOCOL
        await until(ws, "session.created")
        await send(ws, type="session.update", session=pcm)
        await until(ws, "session.updated")
        stream_of: dict[str, int] = {}
        cancelled_streams: set[int] = set()
        finished: dict[str, str] = {}
        frames_after_cancel = 0
        frames_seen: dict[int, list[int]] = {}

        async def reader() -> None:
            nonlocal frames_after_cancel
            while len(finished) < len(names):
                message = await asyncio.wait_for(ws.recv(), 20)
                if isinstance(message, bytes):
                    frame = unpack_audio_frame(message)
                    if frame.stream in cancelled_streams:
                        frames_after_cancel += 1
                    frames_seen.setdefault(frame.stream, []).append(frame.seq)
                    continue
                event = json.loads(message)
                if event["type"] == "context.created":
                    stream_of[event["context_id"]] = event["stream"]
                elif event["type"] == "context.cancelled":
                    cancelled_streams.add(stream_of[event["context_id"]])
                    finished[event["context_id"]] = "cancelled"
                elif event["type"] == "context.done":
                    finished[event["context_id"]] = event["status"]
                elif event["type"] == "error":
                    raise AssertionError(event)

        async def drive(name: str) -> None:
            text = " ".join(f"Line {i}." for i in range(6))
            for word in text.split(" "):
                await send(ws, type="text.append", context_id=name, text=word + " ")
                await asyncio.sleep(rng.uniform(0, 0.004))
            if name in to_cancel:
                await asyncio.sleep(rng.uniform(0, 0.4))
                await send(ws, type="context.cancel", context_id=name)
            else:
                await send(ws, type="context.end", context_id=name)

        read = asyncio.create_task(reader())
        await asyncio.gather(*(drive(n) for n in names))
        await asyncio.wait_for(read, 30)

    assert frames_after_cancel == 0
    assert {n for n, s in finished.items() if s == "cancelled"} <= to_cancel
    assert all(finished[n] == "completed" for n in names if n not in to_cancel)
    for seqs in frames_seen.values():
        assert seqs == list(range(len(seqs)))  # no gaps, in order, per stream
    # Every engine request either ran to its end or was aborted and stopped.
    assert engine.running == []
    assert engine.log.abandoned == []
    ids = {r.request_id for r in engine.log.requests}
    assert ids == set(engine.log.finished) | set(engine.log.stopped)
    assert set(engine.log.stopped) <= set(engine.log.aborted)
    assert engine.log.aborted, "some cancels hit running requests"


async def test_abuse_closes_one_session_and_not_the_other() -> None:
    engine = FakeEngine(realtime_factor=0.1, chunk_samples=960)
    async with (
        serve(fake_app(engine)) as url,
        connect(f"{url}/v1/realtime") as good,
        connect(f"{url}/v1/realtime") as bad,
    ):
        await until(good, "session.created")
        await until(bad, "session.created")
        await send(good, type="text.append", context_id="g", text="Keep talking please. " * 3)
        await send(good, type="context.end", context_id="g")
        await bad.send("{oops")
        assert (await until(bad, "error"))["error"]["code"] == "invalid_json"
        await bad.send(b"\x00")
        await until(bad, "error")
        await bad.send(b"\x00")
        assert await close_code(bad) == CLOSE_POLICY
        done = await until(good, "context.done")
        assert done["status"] == "completed"


async def test_auth_with_keys_headers_and_tokens() -> None:
    app = fake_app(api_keys=("k-one", "k-two"))
    async with serve(app) as url:
        http = url.replace("ws://", "http://")
        async with connect(f"{url}/v1/realtime") as ws:
            error = await until(ws, "error")
            assert error["error"]["type"] == "authentication_error"
            assert error["error"]["code"] == "auth_required"
            assert await close_code(ws) == CLOSE_POLICY
        async with connect(
            f"{url}/v1/realtime", additional_headers={"Authorization": "Bearer nope"}
        ) as ws:
            assert (await until(ws, "error"))["error"]["code"] == "auth_invalid"
            assert await close_code(ws) == CLOSE_POLICY
        async with connect(
            f"{url}/v1/realtime", additional_headers={"Authorization": "Bearer k-two"}
        ) as ws:
            await until(ws, "session.created")
        async with httpx.AsyncClient(base_url=http) as client:
            assert (await client.post("/v1/tokens")).status_code == 401
            minted = await client.post(
                "/v1/tokens", headers={"Authorization": "Bearer k-one"}, json={"expires_in_s": 30}
            )
            assert minted.status_code == 200
            token = minted.json()["token"]
            assert minted.json()["expires_in_s"] == 30
            bad_ttl = await client.post(
                "/v1/tokens", headers={"Authorization": "Bearer k-one"}, json={"expires_in_s": 1e9}
            )
            assert bad_ttl.status_code == 400
            assert bad_ttl.json()["error"]["param"] == "expires_in_s"
            short = await client.post(
                "/v1/tokens", headers={"Authorization": "Bearer k-one"}, json={"expires_in_s": 0.05}
            )
        async with connect(f"{url}/v1/realtime?token={token}") as ws:
            await until(ws, "session.created")
        async with connect(f"{url}/v1/realtime?token={token[:-3]}abc") as ws:
            assert (await until(ws, "error"))["error"]["code"] == "auth_invalid"
        await asyncio.sleep(0.1)
        async with connect(f"{url}/v1/realtime?token={short.json()['token']}") as ws:
            assert (await until(ws, "error"))["error"]["code"] == "token_expired"
            assert await close_code(ws) == CLOSE_POLICY


async def test_per_key_session_and_context_limits() -> None:
    app = fake_app(
        FakeEngine(realtime_factor=0.2),
        api_keys=("a", "b"),
        max_sessions_per_key=2,
        max_contexts_per_key=1,
    )
    as_a = {"Authorization": "Bearer a"}
    async with (
        serve(app) as url,
        connect(f"{url}/v1/realtime", additional_headers=as_a) as first,
        connect(f"{url}/v1/realtime", additional_headers=as_a) as second,
    ):
        await until(first, "session.created")
        await until(second, "session.created")
        async with connect(f"{url}/v1/realtime", additional_headers=as_a) as third:
            error = (await until(third, "error"))["error"]
            assert (error["type"], error["code"]) == ("rate_limit_error", "key_session_limit")
            assert await close_code(third) == CLOSE_TRY_AGAIN
        async with connect(
            f"{url}/v1/realtime", additional_headers={"Authorization": "Bearer b"}
        ) as other_key:
            await until(other_key, "session.created")
        # One context per key, across the key's sessions.
        await send(first, type="text.append", context_id="x", text="Long enough to last. " * 4)
        await until(first, "context.created")
        await send(second, type="text.append", context_id="y", text="Refused.")
        error = (await until(second, "error"))["error"]
        assert (error["type"], error["code"]) == ("rate_limit_error", "key_context_limit")
        assert error["retryable"] and error["retry_after_ms"] > 0
        await send(first, type="context.cancel", context_id="x")
        await until(first, "context.cancelled")
        await send(second, type="text.append", context_id="y", text="Now it fits.")
        await until(second, "context.created")


async def test_http_endpoints_and_metrics() -> None:
    async with serve(fake_app()) as url:
        http = url.replace("ws://", "http://")
        async with connect(f"{url}/v1/realtime") as ws:
            await until(ws, "session.created")
            await ws.send("not json")
            await until(ws, "error")
            await send(ws, type="text.append", context_id="m", text="Measure me.")
            await send(ws, type="context.end", context_id="m")
            await until(ws, "context.done")
        async with httpx.AsyncClient(base_url=http) as client:
            assert (await client.get("/health")).json() == {"status": "ok"}
            ready = await client.get("/ready")
            assert ready.status_code == 200 and ready.json()["status"] == "ready"
            page = await client.get("/")
            assert page.status_code == 200 and "text/html" in page.headers["content-type"]
            metrics = (await client.get("/metrics")).text
    assert "speech_sessions_total 1.0" in metrics
    assert 'speech_contexts_total{status="completed"} 1.0' in metrics
    assert "speech_ttfa_seconds_count 1.0" in metrics
    assert 'speech_errors_total{code="invalid_json",type="invalid_request_error"} 1.0' in metrics
    assert "speech_audio_seconds_out_total" in metrics
    for name in ("speech_engine_step_seconds", "speech_engine_batch_size", "speech_queue_depth"):
        assert name in metrics


async def test_ready_is_503_until_the_engine_is_warm() -> None:
    from starlette.testclient import TestClient

    client = TestClient(fake_app())  # no lifespan: the engine never started
    response = client.get("/ready")
    assert response.status_code == 503 and response.json()["status"] == "loading"
    with client.websocket_connect("/v1/realtime") as ws:
        assert json.loads(ws.receive_text())["error"]["type"] == "engine_overloaded"
        assert ws.receive()["code"] == CLOSE_TRY_AGAIN


async def test_per_key_limits_do_not_apply_to_an_open_server() -> None:
    app = fake_app(max_sessions_per_key=1, max_contexts_per_key=1)
    async with (
        serve(app) as url,
        connect(f"{url}/v1/realtime") as first,
        connect(f"{url}/v1/realtime") as second,
    ):
        await until(first, "session.created")
        await until(second, "session.created")
        for ws in (first, second):
            await send(ws, type="text.append", context_id="c", text="x")
            await until(ws, "context.created")


class FailingStartEngine(FakeEngine):
    async def start(self) -> None:
        raise OSError("weights not found")


async def test_background_warm_up_health_ready_and_refusals() -> None:
    app = fake_app(FakeEngine(start_delay_s=0.5), warm_in_background=True)
    async with serve(app) as url:
        http = url.replace("ws://", "http://")
        async with httpx.AsyncClient(base_url=http) as client:
            assert (await client.get("/health")).status_code == 200
            loading = await client.get("/ready")
            assert loading.status_code == 503 and loading.json()["status"] == "loading"
            async with connect(f"{url}/v1/realtime") as ws:
                error = (await until(ws, "error"))["error"]
                assert error["type"] == "engine_overloaded" and error["retryable"]
                assert await close_code(ws) == CLOSE_TRY_AGAIN
            for _ in range(100):
                if (await client.get("/ready")).status_code == 200:
                    break
                await asyncio.sleep(0.05)
            assert (await client.get("/ready")).json()["status"] == "ready"
        async with connect(f"{url}/v1/realtime") as ws:
            await until(ws, "session.created")


async def test_an_engine_that_fails_to_start_is_reported_by_ready() -> None:
    app = fake_app(FailingStartEngine(), warm_in_background=True)
    async with serve(app) as url, httpx.AsyncClient(base_url=url.replace("ws", "http")) as client:
        for _ in range(100):
            failed = await client.get("/ready")
            if failed.json()["status"] != "loading":
                break
            await asyncio.sleep(0.02)
        assert failed.status_code == 503
        assert failed.json() == {"status": "failed", "error": "OSError: weights not found"}
        assert (await client.get("/health")).status_code == 200
