"""Seeded fuzzing of a live gateway while well-behaved sessions stream.

Thousands of hostile WebSocket messages (invalid JSON, deep nesting, lone
surrogates, huge fields, wrong shapes, binary and oversize frames) and
malformed HTTP bodies. Every malformed message gets exactly one ``error``
event (or a 4xx), no session is closed with 1011, the server logs no error
or traceback, and the streaming sessions never notice.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import random
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from gateway_support import fake_app, serve
from hostile_messages import Hostile, deep_nesting, generate, invalid_json, lone_surrogate
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from gateway.protocol import unpack_audio_frame
from realtime_engine.engines.fake import FakeEngine

pytestmark = pytest.mark.slow

SEED = 1313
MESSAGES = 2400  # over the four fuzzing sessions
FUZZERS = 4
MAX_MESSAGE_BYTES = 1_000_000
HTTP_REQUESTS = 300
WORDS = ("Well", "behaved", "clients", "keep", "streaming.", "Nothing", "disturbs", "them.")


class Recorder(logging.Handler):
    """Every warning or worse from the server's loggers (gateway, uvicorn, asyncio)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def server_logs() -> Iterator[Recorder]:
    recorder = Recorder()
    loggers = [logging.getLogger(name) for name in (None, "uvicorn", "uvicorn.error")]
    for logger in loggers:
        logger.addHandler(recorder)
    yield recorder
    for logger in loggers:
        logger.removeHandler(recorder)


async def fuzz_session(url: str, messages: list[Hostile], tally: dict[str, int]) -> None:
    """Send each message, then a ping; exactly one error must come before the pong."""
    ws = await _open(url)
    counts: dict[str, int] = {}
    for n, message in enumerate(messages):
        counts[message.category] = counts.get(message.category, 0) + 1
        await ws.send(message.data)
        if message.close_code is not None and counts[message.category] >= 2:
            await _expect_error_then_close(ws, message)
            ws, counts = await _open(url), {}
        else:
            marker = f"fuzz-{n}"
            await ws.send(json.dumps({"type": "ping", "event_id": marker}))
            errors = await _errors_until_pong(ws, marker, message)
            assert len(errors) == 1, (message.category, str(message.data)[:200], errors)
        tally[message.category] = tally.get(message.category, 0) + 1
    await ws.close()


async def _open(url: str) -> ClientConnection:
    ws = await connect(f"{url}/v1/realtime", max_size=None)
    assert json.loads(await ws.recv())["type"] == "session.created"
    return ws


async def _errors_until_pong(ws: ClientConnection, marker: str, sent: Hostile) -> list[Any]:
    errors: list[Any] = []
    ponged = False
    while not (ponged and errors):  # voice.create answers after its pong
        try:
            raw = await asyncio.wait_for(ws.recv(), 20)
        except ConnectionClosed as e:
            raise AssertionError(f"closed by {sent.category}: {str(sent.data)[:200]}") from e
        event = json.loads(raw)
        if event["type"] == "pong" and event.get("reply_to") == marker:
            ponged = True
        elif event["type"] == "error":
            assert event["error"]["type"] == "invalid_request_error", event
            assert len(raw) < 4096, "errors stay small whatever the input"
            errors.append(event["error"])
        else:
            raise AssertionError(f"unexpected {event} for {str(sent.data)[:200]}")
    return errors


async def _expect_error_then_close(ws: ClientConnection, sent: Hostile) -> None:
    event = json.loads(await asyncio.wait_for(ws.recv(), 20))
    assert event["type"] == "error", event
    with pytest.raises(ConnectionClosed):
        await asyncio.wait_for(ws.recv(), 20)
    assert ws.close_code == sent.close_code


async def streaming_session(url: str, stop: asyncio.Event, report: dict[str, int]) -> None:
    """A client that behaves: contexts one after another, audio checked frame by frame."""
    ws = await _open(url)
    pcm = {"type": "session.update", "session": {"output": {"format": "pcm16"}}}
    await ws.send(json.dumps(pcm))
    n = 0
    while not stop.is_set():
        context_id = f"good{n}"
        for word in WORDS:
            event = {"type": "text.append", "context_id": context_id, "text": word + " "}
            await ws.send(json.dumps(event))
        await ws.send(json.dumps({"type": "context.end", "context_id": context_id}))
        seqs: list[int] = []
        while True:
            raw = await asyncio.wait_for(ws.recv(), 20)
            if isinstance(raw, bytes):
                seqs.append(unpack_audio_frame(raw).seq)
                continue
            event = json.loads(raw)
            assert event["type"] != "error", event
            if event["type"] == "context.done":
                assert event["status"] == "completed"
                break
        assert seqs == list(range(len(seqs))) and seqs, "every frame, in order"
        report["contexts"] += 1
        report["frames"] += len(seqs)
        n += 1
    await ws.close()


def http_bodies(rng: random.Random) -> Iterator[tuple[str, bytes, str]]:
    """(path, body, content type) of malformed HTTP requests."""
    paths = ["/v1/audio/speech", "/v1/voices", "/v1/tokens"]
    for i in range(HTTP_REQUESTS):
        path = paths[i % len(paths)]
        kind = rng.randrange(6)
        if kind == 0:
            body = invalid_json(rng).encode()
        elif kind == 1:
            body = deep_nesting(rng).encode()
        elif kind == 2:
            bad = rng.choice(["\\ud800", "\\udfff x"])
            field = {"/v1/audio/speech": "input", "/v1/voices": "text"}.get(path, "expires_in_s")
            body = f'{{"{field}": "{bad}", "voice": "{bad}", "audio": "AAAA"}}'.encode()
        elif kind == 3:
            body = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
        elif kind == 4:
            shapes: list[object] = [[], "x", 5, None, {"expires_in_s": "soon"}]
            if path != "/v1/tokens":  # a token request may leave every field out
                shapes += [{"input": 5}, {"input": ""}, {"audio": 5},
                           {"input": "x" * 100_000, "voice": "v" * 10_000}]  # fmt: skip
            body = json.dumps(rng.choice(shapes)).encode()
        else:
            body = lone_surrogate(rng).encode()
        if path == "/v1/tokens" and not body.strip():
            body = b"{"  # an empty token request is a valid one
        yield path, body, "application/json"
    blob = base64.b64encode(b"not audio at all").decode()
    yield "/v1/voices", json.dumps({"audio": blob, "text": "x"}).encode(), "application/json"


async def fuzz_http(url: str, rng: random.Random) -> int:
    count = 0
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        for path, body, content_type in http_bodies(rng):
            response = await http.post(path, content=body, headers={"content-type": content_type})
            assert 400 <= response.status_code < 500, (path, body[:200], response.text[:300])
            assert "error" in response.json()
            assert len(response.content) < 4096
            count += 1
    return count


async def test_hostile_messages_while_sessions_stream(server_logs: Recorder) -> None:
    engine = FakeEngine(realtime_factor=0.25, chunk_samples=960)
    app = fake_app(engine, limits={"max_message_bytes": MAX_MESSAGE_BYTES})
    messages = list(generate(SEED, MESSAGES, MAX_MESSAGE_BYTES))
    tally: dict[str, int] = {}
    report = {"contexts": 0, "frames": 0}
    stop = asyncio.Event()
    async with serve(app, ws_max_size=2 * MAX_MESSAGE_BYTES) as ws_url:
        url = ws_url.replace("ws://", "http://")
        streaming = [asyncio.create_task(streaming_session(ws_url, stop, report)) for _ in range(3)]
        try:
            await asyncio.gather(
                *(fuzz_session(ws_url, messages[i::FUZZERS], tally) for i in range(FUZZERS)),
                fuzz_http(url, random.Random(SEED)),
            )
        finally:
            stop.set()
            outcomes = await asyncio.gather(*streaming, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
    assert sum(tally.values()) == MESSAGES
    assert set(tally) == {"invalid_json", "deep_nesting", "lone_surrogate", "huge_field",
                          "wrong_shape", "binary", "oversize"}, tally  # fmt: skip
    assert report["contexts"] >= 3 and report["frames"] > 0
    problems = [r for r in server_logs.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not problems, [r.getMessage() for r in problems[:5]]
    assert not any("Traceback" in r.getMessage() for r in server_logs.records)
    print(f"fuzz: {tally}, well-behaved {report}")
