"""Pipeline behaviour seen through the socket: look-ahead cap, budgets, failures."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from gateway_support import fake_app
from starlette.testclient import TestClient

from gateway.protocol import unpack_audio_frame
from realtime_engine.engines.base import EngineError, EngineOverloadedError, SegmentRequest
from realtime_engine.engines.fake import FakeEngine


def read_until(ws: Any, type_: str, frames: list[bytes]) -> dict[str, Any]:
    while True:
        message = ws.receive()
        if message.get("bytes") is not None:
            frames.append(message["bytes"])
            continue
        assert "text" in message, message
        event: dict[str, Any] = json.loads(message["text"])
        if event["type"] == type_:
            return event
        assert event["type"] != "error", event


def test_generation_runs_at_most_max_lead_ahead_of_playback() -> None:
    engine = FakeEngine(chunk_samples=960)  # as fast as possible: only the cap slows it
    app = fake_app(engine, limits={"max_lead_s": 0.3})
    text = "A long unbroken stretch of words that makes five seconds of tone" + "x" * 36
    frames: list[bytes] = []
    with TestClient(app) as client, client.websocket_connect("/v1/realtime") as ws:
        read_until(ws, "session.created", frames)
        ws.send_text(json.dumps({"type": "text.append", "context_id": "c", "text": text}))
        read_until(ws, "segment.started", frames)
        first_audio = time.perf_counter()
        time.sleep(0.4)
        ws.send_text(json.dumps({"type": "context.cancel", "context_id": "c"}))
        cancelled = read_until(ws, "context.cancelled", frames)
        elapsed = time.perf_counter() - first_audio
    assert len(text) * 0.05 == 5.0
    sent_s = cancelled["audio_ms_sent"] / 1000
    assert sent_s <= elapsed + 0.3 + 0.1  # playback time + lead + one chunk
    assert sent_s >= 0.3  # it did run ahead, up to the cap
    assert engine.log.aborted and engine.log.stopped == engine.log.aborted


def test_max_audio_seconds_cuts_a_runaway_segment() -> None:
    engine = FakeEngine(chunk_samples=960)
    frames: list[bytes] = []
    with TestClient(fake_app(engine)) as client, client.websocket_connect("/v1/realtime") as ws:
        read_until(ws, "session.created", frames)
        ws.send_text(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {"max_audio_seconds": 0.5, "output": {"format": "pcm16"}},
                }
            )
        )
        read_until(ws, "session.updated", frames)
        ws.send_text(json.dumps({"type": "text.append", "context_id": "r", "text": "y" * 60}))
        ws.send_text(json.dumps({"type": "context.end", "context_id": "r"}))
        seg_done = read_until(ws, "segment.done", frames)
        done = read_until(ws, "context.done", frames)
    assert seg_done["end_ms"] == 500 and done["audio_ms"] == 500
    samples = sum(len(unpack_audio_frame(f).payload) // 2 for f in frames)
    assert samples == 12000
    # The engine turns the cap into its own model steps.
    assert engine.log.requests[0].max_audio_seconds == 0.5
    assert engine.log.aborted == [engine.log.requests[0].request_id]


class BrokenEngine(FakeEngine):
    """Fails with an unexpected exception type (a bug, not an EngineError)."""

    async def synthesize(self, request: SegmentRequest) -> AsyncIterator[np.ndarray]:
        if "bug" in request.text:
            raise ZeroDivisionError("division by zero in the engine")
        async for chunk in super().synthesize(request):
            yield chunk


def test_unexpected_engine_exceptions_fail_only_their_context() -> None:
    frames: list[bytes] = []
    with (
        TestClient(fake_app(BrokenEngine())) as client,
        client.websocket_connect("/v1/realtime") as ws,
    ):
        read_until(ws, "session.created", frames)
        ws.send_text(json.dumps({"type": "text.append", "context_id": "b", "text": "a bug."}))
        ws.send_text(json.dumps({"type": "context.end", "context_id": "b"}))
        message = json.loads(ws.receive_text())
        while message["type"] != "error":
            message = json.loads(ws.receive_text())
        assert message["error"]["code"] == "internal_error"
        assert message["error"]["context_id"] == "b"
        assert "ZeroDivisionError" in message["error"]["message"]
        done = read_until(ws, "context.done", frames)
        assert done["status"] == "failed"
        ws.send_text(json.dumps({"type": "text.append", "context_id": "ok", "text": "Fine."}))
        ws.send_text(json.dumps({"type": "context.end", "context_id": "ok"}))
        assert read_until(ws, "context.done", frames)["status"] == "completed"


class RaisingOnAbortEngine(FakeEngine):
    """Some engines end an aborted request by raising instead of returning."""

    async def synthesize(self, request: SegmentRequest) -> AsyncIterator[np.ndarray]:
        async for chunk in super().synthesize(request):
            yield chunk
        if request.request_id in self.log.aborted:
            raise EngineError(f"{request.request_id} aborted")


def test_an_engine_raising_on_abort_adds_nothing_after_cancelled() -> None:
    engine = RaisingOnAbortEngine(realtime_factor=0.5, chunk_samples=960)
    frames: list[bytes] = []
    with TestClient(fake_app(engine)) as client, client.websocket_connect("/v1/realtime") as ws:
        read_until(ws, "session.created", frames)
        ws.send_text(
            json.dumps({"type": "text.append", "context_id": "c", "text": "Zed zed zed. " * 8})
        )
        read_until(ws, "segment.started", frames)
        ws.send_text(json.dumps({"type": "context.cancel", "context_id": "c"}))
        read_until(ws, "context.cancelled", frames)
        ws.send_text(json.dumps({"type": "ping", "event_id": "last"}))
        after: list[dict[str, Any]] = []
        while not after or after[-1]["type"] != "pong":
            message = ws.receive()
            assert message.get("bytes") is None, "a frame after context.cancelled"
            after.append(json.loads(message["text"]))
    assert [e["type"] for e in after] == ["pong"]
    assert engine.log.aborted


def test_queue_depth_returns_to_zero_after_cancels_and_failures() -> None:
    engine = FakeEngine(realtime_factor=0.5, chunk_samples=960, fail_on="Boom")
    app = fake_app(engine)
    gauge = app.state.gateway.metrics.queue_depth
    frames: list[bytes] = []
    with TestClient(app) as client, client.websocket_connect("/v1/realtime") as ws:
        read_until(ws, "session.created", frames)
        many = "One two three. " * 6
        ws.send_text(json.dumps({"type": "text.append", "context_id": "c", "text": many}))
        read_until(ws, "segment.started", frames)
        assert gauge._value.get() >= 4  # later segments wait their turn
        ws.send_text(json.dumps({"type": "context.cancel", "context_id": "c"}))
        read_until(ws, "context.cancelled", frames)
        failing = "Boom goes one. " * 4
        ws.send_text(json.dumps({"type": "text.append", "context_id": "f", "text": failing}))
        message: dict[str, Any] = {"type": ""}
        while message["type"] != "context.done":
            raw = ws.receive()
            if raw.get("text") is not None:
                message = json.loads(raw["text"])
    assert gauge._value.get() == 0


class GarbageChunkEngine(FakeEngine):
    """Yields one chunk the gateway cannot use, then keeps generating."""

    async def synthesize(self, request: SegmentRequest) -> AsyncIterator[np.ndarray]:
        first = True
        async for chunk in super().synthesize(request):
            if first:
                first = False
                yield np.array(["not", "audio"])
            yield chunk


def test_a_failure_of_the_gateway_side_aborts_the_engine_request() -> None:
    engine = GarbageChunkEngine(realtime_factor=0.2, chunk_samples=960)
    frames: list[bytes] = []
    with TestClient(fake_app(engine)) as client, client.websocket_connect("/v1/realtime") as ws:
        read_until(ws, "session.created", frames)
        ws.send_text(json.dumps({"type": "text.append", "context_id": "c", "text": "Fine words."}))
        ws.send_text(json.dumps({"type": "context.end", "context_id": "c"}))
        message: dict[str, Any] = {"type": ""}
        errors = []
        while message["type"] != "context.done":
            raw = ws.receive()
            if raw.get("text") is not None:
                message = json.loads(raw["text"])
                if message["type"] == "error":
                    errors.append(message["error"])
    assert message["status"] == "failed"
    assert [e["code"] for e in errors] == ["internal_error"]
    (request,) = engine.log.requests
    assert engine.log.aborted == [request.request_id]  # the engine was told to stop
    assert engine.log.abandoned == []


class FullEngine(FakeEngine):
    async def synthesize(self, request: SegmentRequest) -> AsyncIterator[np.ndarray]:
        raise EngineOverloadedError("queue full", retry_after_ms=700)
        yield np.zeros(1, np.float32)  # pragma: no cover - makes this an async generator


def test_an_overloaded_engine_is_a_retryable_engine_overloaded_error() -> None:
    frames: list[bytes] = []
    with (
        TestClient(fake_app(FullEngine())) as client,
        client.websocket_connect("/v1/realtime") as ws,
    ):
        read_until(ws, "session.created", frames)
        ws.send_text(json.dumps({"type": "text.append", "context_id": "o", "text": "Busy?"}))
        ws.send_text(json.dumps({"type": "context.end", "context_id": "o"}))
        message = json.loads(ws.receive_text())
        while message["type"] != "error":
            message = json.loads(ws.receive_text())
        done = read_until(ws, "context.done", frames)
    error = message["error"]
    assert (error["type"], error["code"]) == ("engine_overloaded", "engine_overloaded")
    assert error["retryable"] and error["retry_after_ms"] == 700
    assert done["status"] == "failed"


def test_a_stalled_engine_fails_the_context_and_is_aborted() -> None:
    engine = FakeEngine(first_chunk_delay_s=30)
    frames: list[bytes] = []
    app = fake_app(engine, engine_stall_timeout_s=0.2)
    with TestClient(app) as client, client.websocket_connect("/v1/realtime") as ws:
        read_until(ws, "session.created", frames)
        ws.send_text(json.dumps({"type": "text.append", "context_id": "s", "text": "Hello?"}))
        ws.send_text(json.dumps({"type": "context.end", "context_id": "s"}))
        started = time.perf_counter()
        message = json.loads(ws.receive_text())
        while message["type"] != "error":
            message = json.loads(ws.receive_text())
        done = read_until(ws, "context.done", frames)
        assert time.perf_counter() - started < 5
    assert message["error"]["code"] == "engine_error" and "aborted" in message["error"]["message"]
    assert done["status"] == "failed"
    (request,) = engine.log.requests
    assert engine.log.aborted == [request.request_id] == engine.log.stopped
    assert engine.log.abandoned == []


def test_a_stalled_engine_is_aborted_then_the_context_fails() -> None:
    # First chunk at once, the next one 2 s later: past the 0.2 s stall limit.
    engine = FakeEngine(chunk_samples=960, realtime_factor=50.0)
    app = fake_app(engine, engine_stall_timeout_s=0.2)
    frames: list[bytes] = []
    events: list[dict[str, Any]] = []
    with TestClient(app) as client, client.websocket_connect("/v1/realtime") as ws:
        read_until(ws, "session.created", frames)
        ws.send_text(json.dumps({"type": "text.append", "context_id": "c", "text": "Stalls. "}))
        started = time.perf_counter()
        while not events or events[-1]["type"] != "context.done":
            message = ws.receive()
            if message.get("bytes") is not None:
                frames.append(message["bytes"])
            else:
                events.append(json.loads(message["text"]))
        elapsed = time.perf_counter() - started
    error = next(e for e in events if e["type"] == "error")
    assert error["error"]["code"] == "engine_error"
    assert "no audio from the engine" in error["error"]["message"]
    assert events[-1]["status"] == "failed"
    assert len(frames) == 2  # the first chunk (40 ms) went out before the stall
    assert elapsed < 1.5  # failed at the stall limit, not when the engine woke up
    assert engine.log.aborted == [engine.log.requests[0].request_id]
    assert engine.log.stopped == engine.log.aborted  # aborted first, not abandoned
    assert engine.log.abandoned == []
