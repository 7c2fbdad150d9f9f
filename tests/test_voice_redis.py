"""Voices in a real Redis shared by two libraries (two replicas in one process):
visible on both, deletes seen at once, the per-key limit atomic across them,
no codes left behind, and a store that is down answered with a retryable error."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import pytest_asyncio
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from redis_support import free_port, redis_server, require_redis_client
from voice_clips_support import CloningFakeEngine, clip, tone, wav_s16
from websockets.asyncio.client import connect

from bench.server import gateway_app, serve
from gateway.cli import main as cli_main
from gateway.voices import VoiceConflictError, VoiceLibrary, VoiceNotFoundError

CLIP = wav_s16(tone(1.5))


@pytest_asyncio.fixture
async def store(tmp_path: Path) -> AsyncIterator[str]:
    require_redis_client()
    async with redis_server(tmp_path) as server:
        yield server.url


def replica(url: str, **kw: Any) -> tuple[VoiceLibrary, CloningFakeEngine]:
    from gateway.voice_redis import RedisVoiceBackend

    engine = CloningFakeEngine()
    return VoiceLibrary(engine, backend=RedisVoiceBackend.from_url(url), **kw), engine


async def test_a_voice_made_on_one_replica_is_used_and_deleted_on_another(store: str) -> None:
    a, engine_a = replica(store)
    b, engine_b = replica(store)
    try:
        await a.create(CLIP, "a tone", "mine", key_id="key_a")
        assert not b.has("mine", "key_a")  # b has not looked yet: has() never does I/O
        await b.refresh("mine", "key_a")
        assert b.has("mine", "key_a") and not b.has("mine", "key_b")
        mine_a, mine_b = await a.reference("mine", "key_a"), await b.reference("mine", "key_a")
        assert mine_a is not None and mine_b is not None
        assert np.array_equal(mine_a.codes, mine_b.codes) and mine_b.text == "a tone"
        again = await b.create(CLIP, "a tone", None, key_id="key_a")  # same clip: b's cache hit
        assert again.cached and again.voice_id == "mine" and engine_b.encoded == 0
        assert [v.voice_id for v in await b.list("key_a")][-1] == "mine"
        assert "mine" not in [v.voice_id for v in await b.list("key_b")]
        with pytest.raises(VoiceNotFoundError):
            await b.reference("mine", "key_b")
        await a.delete("mine", "key_a")
        # b still holds the codes in memory, but the name is gone from the store
        with pytest.raises(VoiceNotFoundError):
            await b.reference("mine", "key_a")
        await b.refresh("mine", "key_a")
        assert not b.has("mine", "key_a")
        with pytest.raises(VoiceNotFoundError):
            await b.delete("mine", "key_a")
        assert engine_a.encoded == 1
    finally:
        await a.close()
        await b.close()


async def test_the_per_key_limit_holds_for_concurrent_creates_on_two_replicas(
    store: str,
) -> None:
    a, _ = replica(store, max_voices=3)
    b, _ = replica(store, max_voices=3)
    try:
        creates = [(a, b)[i % 2].create(clip(200 + 50 * i), None, f"v{i}", "k") for i in range(8)]
        results = await asyncio.gather(*creates, return_exceptions=True)
        made = [r for r in results if not isinstance(r, BaseException)]
        refused = [r for r in results if isinstance(r, VoiceConflictError)]
        assert len(made) == 3 and len(refused) == 5, results
        assert len(await a.list("k")) == len(await b.list("k")) == 3 + 2  # + built-ins
        # one id, two clips, two replicas at once: one wins, the other is told
        racing = await asyncio.gather(
            a.create(clip(900), None, "same", "k2"),
            b.create(clip(950), None, "same", "k2"),
            return_exceptions=True,
        )
        assert sum(isinstance(r, VoiceConflictError) for r in racing) == 1, racing
    finally:
        await a.close()
        await b.close()


async def test_deleting_the_last_name_of_a_clip_drops_its_codes(store: str) -> None:
    import redis.asyncio as redis

    a, _ = replica(store)
    client = redis.Redis.from_url(store)
    try:
        await a.create(CLIP, None, "one", "k")
        await a.create(CLIP, None, "two", "k")  # the same clip under a second name
        await a.delete("one", "k")
        assert (await a.reference("two", "k")) is not None
        await a.delete("two", "k")
        assert await client.keys("*") == []  # nothing left behind
    finally:
        await a.close()
        await client.aclose()


async def test_a_store_that_is_down_is_a_retryable_error_and_never_a_5xx_crash() -> None:
    require_redis_client()
    down = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    async with serve(gateway_app(CloningFakeEngine(), voice_store=down)) as base:
        async with httpx.AsyncClient(base_url=base) as http:
            listed = await http.get("/v1/voices")
            created = await http.post("/v1/voices", json={"audio": base64.b64encode(CLIP).decode()})
            spoken = await http.post("/v1/audio/speech", json={"input": "Hi.", "voice": "mine"})
            builtin = await http.post("/v1/audio/speech", json={"input": "Hi.", "voice": "default"})
        for response in (listed, created, spoken):
            error = response.json()["error"]
            assert response.status_code == 503, response.text
            assert error["code"] == "voice_store_unavailable" and error["retryable"] is True
        assert builtin.status_code == 200  # built-in voices need no store
        async with connect(base.replace("http", "ws") + "/v1/realtime") as ws:
            await ws.recv()  # session.created
            audio = base64.b64encode(CLIP).decode()
            await ws.send(json.dumps({"type": "voice.create", "audio": audio, "event_id": "c"}))
            event = json.loads(await ws.recv())
            assert event["error"]["code"] == "voice_store_unavailable", event
            await ws.send(json.dumps({"type": "session.update", "session": {"voice": "mine"}}))
            event = json.loads(await ws.recv())
            assert event["error"]["code"] == "voice_not_found", event  # and the session lives


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--voice-store", "memcached://x"], "redis://, rediss:// or unix://"),
        (["--voice-store", "redis://x:1/0", "--voice-dir", "/tmp/v"], "exclude each other"),
    ],
)
def test_a_bad_voice_store_setting_is_a_clear_cli_error(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["serve", "--engine", "fake", *args]) == 2
    assert message in capsys.readouterr().err


async def test_a_context_whose_voice_cannot_be_read_fails_retryably(tmp_path: Path) -> None:
    require_redis_client()
    async with contextlib.AsyncExitStack() as stack:
        store = await stack.enter_async_context(redis_server(tmp_path))
        app = gateway_app(CloningFakeEngine(), voice_store=store.url)
        base = await stack.enter_async_context(serve(app))
        ws = await stack.enter_async_context(connect(base.replace("http", "ws") + "/v1/realtime"))
        await ws.recv()  # session.created
        audio = base64.b64encode(CLIP).decode()
        await ws.send(json.dumps({"type": "voice.create", "audio": audio, "voice_id": "mine"}))
        assert json.loads(await ws.recv())["type"] == "voice.created"
        await ws.send(json.dumps({"type": "session.update", "session": {"voice": "mine"}}))
        assert json.loads(await ws.recv())["type"] == "session.updated"
        await store.stop()  # the store goes away under the running gateway
        await ws.send(json.dumps({"type": "text.append", "context_id": "c", "text": "Hi."}))
        await ws.send(json.dumps({"type": "context.end", "context_id": "c"}))
        events: list[dict[str, Any]] = []
        while not events or events[-1]["type"] != "context.done":
            message = await ws.recv()
            if isinstance(message, str):
                events.append(json.loads(message))
        error = next(e["error"] for e in events if e["type"] == "error")
        assert error["code"] == "voice_store_unavailable" and error["retryable"], events
        assert error["context_id"] == "c" and events[-1]["status"] == "failed"
        await ws.send(json.dumps({"type": "ping", "event_id": "p"}))
        assert json.loads(await ws.recv())["type"] == "pong"  # the session lives on


@given(
    arrays(
        np.int64,
        st.tuples(st.integers(1, 400), st.just(8)),
        elements=st.integers(0, 1023),
    )
)
def test_codes_round_trip_through_their_stored_form(codes: np.ndarray) -> None:
    from gateway.voice_redis import codes_blob, codes_of

    back = codes_of(codes_blob(codes))
    assert back is not None and back.dtype == np.int64 and np.array_equal(back, codes)


@given(st.binary(max_size=200))
def test_stored_bytes_that_are_not_codes_are_refused_not_raised(blob: bytes) -> None:
    from gateway.voice_redis import codes_of

    codes = codes_of(blob)
    if codes is not None:  # whole rows of in-range values are codes
        assert len(blob) % 16 == 0 and codes.shape == (len(blob) // 16, 8)
        assert codes.min() >= 0 and codes.max() < 1024
