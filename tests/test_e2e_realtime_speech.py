"""End to end over the realtime WebSocket: LLM-style token stream in, Opus out, Whisper checks it.

A real uvicorn server runs the gateway with the embedded CPU voice; the
``websockets`` client streams text a token at a time as a language model
would, decodes every Opus packet with libopus and the transcript must match
the text (word error rate at most 10 %).
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import numpy as np
import opuslib_next as opuslib
import pytest
from asr import transcribe, wer
from live_server import live_server
from websockets.asyncio.client import ClientConnection, connect
from websockets.typing import Subprotocol

from gateway.app import create_app
from gateway.protocol import SUBPROTOCOL, parse_server_event, unpack_audio_frame
from gateway.settings import GatewaySettings
from realtime_engine.engines.cpu_voice import CpuVoiceEngine

pytestmark = pytest.mark.slow

TEXT = (
    "Thanks for calling. Your order shipped this morning, and it should arrive on Friday. "
    "Is there anything else I can help you with today?"
)
MAX_WER = 0.10
SAMPLE_RATE = 24_000


def llm_tokens(text: str) -> list[str]:
    """Word pieces with their leading space, the way chat models stream text."""
    return re.findall(r"\s*\S+", text)


async def send(ws: ClientConnection, **event: Any) -> None:
    await ws.send(json.dumps(event))


async def test_token_stream_to_opus_is_intelligible() -> None:
    app = create_app(GatewaySettings(), CpuVoiceEngine())
    decoder = opuslib.Decoder(SAMPLE_RATE, 1)
    pcm: list[np.ndarray] = []
    events: list[dict[str, Any]] = []
    expected_seq = 0
    expected_pts = 0
    async with live_server(app, lifespan="on") as url:
        ws_url = url.replace("http://", "ws://") + "/v1/realtime"
        async with connect(ws_url, subprotocols=[Subprotocol(SUBPROTOCOL)]) as ws:
            created = json.loads(await asyncio.wait_for(ws.recv(), 30))
            assert created["type"] == "session.created"
            assert created["session"]["output"] == {
                "format": "opus", "sample_rate": SAMPLE_RATE, "frame_ms": 20,
            }  # fmt: skip

            async def stream_text() -> None:
                for token in llm_tokens(TEXT):
                    await send(ws, type="text.append", context_id="turn1", text=token)
                    await asyncio.sleep(0.015)
                await send(ws, type="context.end", context_id="turn1")

            writer = asyncio.create_task(stream_text())
            while True:
                message = await asyncio.wait_for(ws.recv(), 120)
                if isinstance(message, bytes):
                    frame = unpack_audio_frame(message)
                    assert (frame.seq, frame.pts_ms) == (expected_seq, expected_pts)
                    samples = decoder.decode(frame.payload, 2880)
                    pcm.append(np.frombuffer(samples, dtype="<i2").astype(np.float32) / 32768)
                    expected_seq += 1
                    expected_pts += 20
                    continue
                parse_server_event(message)
                event = json.loads(message)
                events.append(event)
                assert event["type"] != "error", event
                if event["type"] == "context.done":
                    break
            await writer

    done = events[-1]
    assert done["status"] == "completed" and done["context_id"] == "turn1"
    assert done["metrics"]["segments"] >= 2  # spoken while the text was still arriving
    spoken = " ".join(e["text"] for e in events if e["type"] == "segment.started")
    assert spoken.split() == TEXT.split()
    audio = np.concatenate(pcm)
    assert abs(audio.size / SAMPLE_RATE * 1000 - done["audio_ms"]) <= 40
    hypothesis = transcribe(audio, SAMPLE_RATE)
    assert wer(TEXT, hypothesis) <= MAX_WER, hypothesis
