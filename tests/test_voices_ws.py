"""Voices end to end over a real server: create on the socket, use, delete, refuse;
keys kept apart; malformed clips refused with a clear error while the session lives on."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from gateway_support import next_event, open_session, send_event
from voice_clips_support import MALFORMED, STEREO, tone, wav_s16
from websockets.asyncio.client import ClientConnection

from bench.server import gateway_app, serve
from realtime_engine.engines.fake import FakeEngine
from realtime_engine.engines.higgs import HiggsEngine
from realtime_engine.talker.backends import ReferenceOptions

SESSION = {"output": {"format": "pcm_f32"}, "sampling": {"seed": 3}, "max_audio_seconds": 0.4}
CLIP = wav_s16(tone(1.5))


class CloningFakeEngine(FakeEngine):
    supports_voice_cloning = True

    async def encode_reference(self, pcm: Any, sample_rate: int) -> Any:
        import numpy as np

        return np.zeros((-(-pcm.size // 960), 8), dtype=np.int64)


async def _create(ws: ClientConnection, audio: bytes, **fields: Any) -> dict[str, Any]:
    event = {"type": "voice.create", "audio": base64.b64encode(audio).decode(), **fields}
    return await send_event(ws, event)


async def _speak(ws: ClientConnection, context_id: str, text: str) -> list[dict[str, Any]]:
    """Every event of one context, up to its ``context.done``."""
    await ws.send(json.dumps({"type": "text.append", "context_id": context_id, "text": text}))
    await ws.send(json.dumps({"type": "context.end", "context_id": context_id}))
    events = []
    while True:
        events.append(await next_event(ws))
        if events[-1]["type"] == "context.done":
            return events


@pytest_asyncio.fixture
async def higgs(tiny_checkpoint: Path) -> AsyncIterator[tuple[str, HiggsEngine]]:
    engine = HiggsEngine.from_pretrained(str(tiny_checkpoint), "cpu", talker=ReferenceOptions())
    assert engine.supports_voice_cloning  # the tiny checkpoint carries the encoder
    async with serve(gateway_app(engine)) as base:
        yield base, engine


async def test_create_use_delete_then_use_again_is_refused(
    higgs: tuple[str, HiggsEngine],
) -> None:
    base, engine = higgs
    ws = await open_session(base)
    other = await open_session(base)
    try:
        created = await _create(ws, CLIP, voice_id="mine", text="a steady tone.")
        assert created["type"] == "voice.created", created
        assert created["frames"] == 38 and created["cached"] is False  # ceil(36000 / 960)
        again = await _create(ws, CLIP, voice_id="mine", text="a steady tone.")
        assert again["cached"] is True and engine.reference_encodes == 1
        update = {"type": "session.update", "session": {**SESSION, "voice": "mine"}}
        updated = await send_event(ws, update)
        assert updated["type"] == "session.updated" and updated["session"]["voice"] == "mine"
        done = (await _speak(ws, "a", "Hello world. The quick brown fox."))[-1]
        assert done["status"] == "completed", done
        # the same key on another socket sees the voice
        seen = await send_event(other, {"type": "session.update", "session": {"voice": "mine"}})
        assert seen["type"] == "session.updated"
        async with httpx.AsyncClient(base_url=base) as client:
            listed = (await client.get("/v1/voices")).json()["data"]
            assert "mine" in [v["voice_id"] for v in listed]
            assert (await client.delete("/v1/voices/mine")).status_code == 200
        # a context opened after the delete is refused with a clear error
        events = await _speak(ws, "b", "Hello again.")
        errors = [e for e in events if e["type"] == "error"]
        assert errors and errors[0]["error"]["code"] == "voice_not_found", events
        assert events[-1]["status"] == "failed"
        # the session lives on, and choosing the deleted voice again is refused
        await send_event(ws, {"type": "session.update", "session": {"voice": "default"}})
        refused = await send_event(ws, {"type": "session.update", "session": {"voice": "mine"}})
        assert refused["type"] == "error" and refused["error"]["code"] == "voice_not_found"
        assert (await _speak(ws, "c", "Still here."))[-1]["status"] == "completed"
    finally:
        await ws.close()
        await other.close()


async def test_keys_do_not_see_each_others_voices() -> None:
    app = gateway_app(CloningFakeEngine(), api_keys=("key-a", "key-b"))
    async with serve(app) as base:
        a, b = await open_session(base, "key-a"), await open_session(base, "key-b")
        try:
            assert (await _create(a, CLIP, voice_id="private"))["type"] == "voice.created"
            used = await send_event(b, {"type": "session.update", "session": {"voice": "private"}})
            assert used["type"] == "error" and used["error"]["code"] == "voice_not_found"
            async with httpx.AsyncClient(base_url=base) as client:
                as_b = {"Authorization": "Bearer key-b"}
                listed = (await client.get("/v1/voices", headers=as_b)).json()["data"]
                assert "private" not in [v["voice_id"] for v in listed]
                assert (await client.delete("/v1/voices/private", headers=as_b)).status_code == 404
                as_a = {"Authorization": "Bearer key-a"}
                listed = (await client.get("/v1/voices", headers=as_a)).json()["data"]
                assert "private" in [v["voice_id"] for v in listed]
        finally:
            await a.close()
            await b.close()


@pytest.mark.parametrize(("name", "clip", "message"), MALFORMED, ids=[m[0] for m in MALFORMED])
async def test_malformed_clips_are_refused_and_the_session_survives(
    name: str, clip: bytes, message: str
) -> None:
    async with serve(gateway_app(CloningFakeEngine())) as base:
        ws = await open_session(base)
        try:
            refused = await _create(ws, clip, voice_id="bad")
            assert refused["type"] == "error", refused
            assert refused["error"]["code"] == "voice_invalid"
            assert message in refused["error"]["message"]
            assert (await _create(ws, CLIP, voice_id="good"))["type"] == "voice.created"
        finally:
            await ws.close()
        async with httpx.AsyncClient(base_url=base) as client:
            response = await client.post(
                "/v1/voices", files={"audio": ("clip.wav", clip)}, data={"voice_id": "bad"}
            )
        assert response.status_code == 400, response.text
        assert message in response.json()["error"]["message"]


async def test_empty_audio_and_stereo() -> None:
    async with serve(gateway_app(CloningFakeEngine())) as base:
        ws = await open_session(base)
        try:
            empty = await send_event(ws, {"type": "voice.create", "audio": ""})
            assert empty["type"] == "error" and empty["error"]["code"] == "invalid_value"
            stereo = await _create(ws, STEREO)  # mixed down to mono
            assert stereo["type"] == "voice.created" and stereo["duration_s"] == 1.5
        finally:
            await ws.close()


async def test_ref_audio_voice_create_and_voice_field_share_the_cached_codes() -> None:
    engine = CloningFakeEngine()
    app = gateway_app(engine, api_keys=("key-a", "key-b"))
    clip_b64 = base64.b64encode(CLIP).decode()
    speech = {"model": "fake-tone", "input": "Hello there.", "response_format": "pcm"}
    async with serve(app) as base, httpx.AsyncClient(base_url=base) as client:
        as_a = {"Authorization": "Bearer key-a"}
        library = app.state.gateway.voices
        inline = await client.post(
            "/v1/audio/speech",
            json={**speech, "voice": "default", "ref_audio": clip_b64, "ref_text": "a tone."},
            headers=as_a,
        )
        assert inline.status_code == 200, inline.text
        assert library.stats().encodes == 1
        ws = await open_session(base, "key-a")
        try:
            created = await _create(ws, CLIP, voice_id="named", text="a tone.")
        finally:
            await ws.close()
        assert created["cached"] is True and library.stats().encodes == 1
        metrics = (await client.get("/metrics")).text
        assert "speech_voice_encodes 1.0" in metrics
        assert "speech_voice_cache_entries 1.0" in metrics
        by_name = await client.post(
            "/v1/audio/speech", json={**speech, "voice": "named"}, headers=as_a
        )
        assert by_name.status_code == 200
        inline_ref, named_ref = (r.reference for r in engine.log.requests[-2:])
        assert inline_ref is not None and inline_ref is named_ref  # one cached object
        as_b = {"Authorization": "Bearer key-b"}
        other = await client.post(
            "/v1/audio/speech", json={**speech, "voice": "named"}, headers=as_b
        )
        assert other.status_code == 400
        assert other.json()["error"]["code"] == "voice_not_found"


async def test_a_contexts_segments_share_its_voice_and_continuity() -> None:
    engine = CloningFakeEngine()
    async with serve(gateway_app(engine)) as base:
        ws = await open_session(base)
        try:
            await _create(ws, CLIP, voice_id="mine")
            await send_event(ws, {"type": "session.update", "session": {"voice": "mine"}})
            text = "First sentence here. Second sentence here. Third one."
            assert (await _speak(ws, "a", text))[-1]["status"] == "completed"
            await send_event(ws, {"type": "session.update", "session": {"voice": "default"}})
            assert (await _speak(ws, "b", text))[-1]["status"] == "completed"
        finally:
            await ws.close()
    by_context: dict[str, list[Any]] = {}
    for request in engine.log.requests:
        by_context.setdefault(request.request_id.split(":")[1], []).append(request)
    first, second = by_context.values()
    assert len(first) >= 2 and len(second) >= 2  # several segments each
    assert all(r.continuity is first[0].continuity for r in first)
    assert all(r.continuity is second[0].continuity for r in second)
    assert first[0].continuity is not second[0].continuity
    assert first[0].reference is not None and all(r.reference is first[0].reference for r in first)
    assert all(r.reference is None and r.voice == "default" for r in second)
