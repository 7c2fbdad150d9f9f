"""The WebSocket path with the real Higgs engine (tiny random checkpoint, CPU)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.protocol import SessionConfig, apply_session_update, unpack_audio_frame
from gateway.realtime.contexts import to_engine_request
from gateway.realtime.session import OpenContext
from gateway.settings import GatewaySettings
from realtime_engine.engines.higgs import HiggsEngine

SESSION = {
    "output": {"format": "pcm_f32"},
    "latency_preset": "exact",
    "sampling": {"seed": 11},
    "max_audio_seconds": 0.6,
}


@pytest.fixture
def engine(tiny_checkpoint: Path) -> Iterator[HiggsEngine]:
    yield HiggsEngine.from_pretrained(str(tiny_checkpoint), "cpu")


def speak(ws: Any, context_id: str, text: str) -> tuple[np.ndarray, dict[str, Any]]:
    ws.send_text(json.dumps({"type": "text.append", "context_id": context_id, "text": text}))
    ws.send_text(json.dumps({"type": "context.end", "context_id": context_id}))
    payloads: list[bytes] = []
    while True:
        message = ws.receive()
        if message.get("bytes") is not None:
            payloads.append(unpack_audio_frame(message["bytes"]).payload)
            continue
        event = json.loads(message["text"])
        assert event["type"] != "error", event
        if event["type"] == "context.done":
            return np.frombuffer(b"".join(payloads), "<f4"), event


async def test_streamed_audio_is_the_engine_output_bit_for_bit(
    engine: HiggsEngine, tiny_checkpoint: Path
) -> None:
    with (
        TestClient(create_app(GatewaySettings(), engine)) as client,
        client.websocket_connect("/v1/realtime") as ws,
    ):
        assert json.loads(ws.receive_text())["type"] == "session.created"
        ws.send_text(json.dumps({"type": "session.update", "session": SESSION}))
        assert json.loads(ws.receive_text())["type"] == "session.updated"
        first, done = speak(ws, "one", "Hello world.")
        second, _ = speak(ws, "two", "Hello world.")
    assert done["status"] == "completed" and done["metrics"]["segments"] == 1
    assert len(first) == round(0.6 * 24000)  # the segment budget, exactly
    np.testing.assert_array_equal(first, second)  # seeded: the same audio twice
    # What the socket carried is exactly what the engine produced for that request.
    config = apply_session_update(SessionConfig(id="s", model="m"), SESSION)
    request = to_engine_request("offline", OpenContext(0, "x", 0, config), "Hello world.")
    offline = HiggsEngine.from_pretrained(str(tiny_checkpoint), "cpu")  # the app closed its own
    await offline.start()
    try:
        direct = np.concatenate([c async for c in offline.synthesize(request)])
    finally:
        await offline.close()
    np.testing.assert_array_equal(first, direct[: len(first)].astype(np.float32))
