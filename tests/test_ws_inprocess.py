"""The WebSocket route in-process (Starlette TestClient): every event and error path."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from gateway_support import fake_app
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from gateway.protocol import (
    CLOSE_NORMAL,
    CLOSE_POLICY,
    CLOSE_TOO_BIG,
    CLOSE_TRY_AGAIN,
    SUBPROTOCOL,
    AudioFrame,
    parse_server_event,
    unpack_audio_frame,
)
from gateway.state import CreatedVoice
from realtime_engine.engines.base import SegmentRequest
from realtime_engine.engines.fake import FakeEngine

Session = Any  # starlette.testclient.WebSocketTestSession


class Transcript:
    """Everything one connection received, in order."""

    def __init__(self, ws: Session) -> None:
        self.ws = ws
        self.items: list[dict[str, Any] | AudioFrame] = []
        self.close_code: int | None = None

    def send(self, **event: Any) -> None:
        self.ws.send_text(json.dumps(event))

    def next(self) -> dict[str, Any] | AudioFrame:
        message = self.ws.receive()
        if message["type"] == "websocket.close":
            self.close_code = message["code"]
            raise WebSocketDisconnect(message["code"], message.get("reason"))
        if message.get("bytes") is not None:
            item: dict[str, Any] | AudioFrame = unpack_audio_frame(message["bytes"])
        else:
            raw = json.loads(message["text"])
            parse_server_event(message["text"])  # every event conforms to the protocol
            item = raw
        self.items.append(item)
        return item

    def until(self, type_: str, **match: Any) -> dict[str, Any]:
        while True:
            item = self.next()
            if (
                isinstance(item, dict)
                and item["type"] == type_
                and all(item.get(k) == v for k, v in match.items())
            ):
                return item

    def closed(self) -> int:
        with pytest.raises(WebSocketDisconnect) as info:
            while True:
                self.next()
        return info.value.code

    def events(self, type_: str | None = None) -> list[dict[str, Any]]:
        return [i for i in self.items if isinstance(i, dict) and type_ in (None, i["type"])]

    def frames(self, stream: int | None = None) -> list[AudioFrame]:
        return [i for i in self.items if isinstance(i, AudioFrame) and stream in (None, i.stream)]


@contextmanager
def connect(client: TestClient, path: str = "/v1/realtime", **kwargs: Any) -> Iterator[Transcript]:
    with client.websocket_connect(path, **kwargs) as ws:
        yield Transcript(ws)


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def client(engine: FakeEngine) -> Iterator[TestClient]:
    with TestClient(fake_app(engine)) as c:
        yield c


def pcm16(frames: list[AudioFrame]) -> np.ndarray:
    return np.concatenate([np.frombuffer(f.payload, "<i2") for f in frames])


def expected_pcm16(engine: FakeEngine, *texts: str) -> np.ndarray:
    audio = np.concatenate([engine.render(SegmentRequest("x", t)) for t in texts])
    return np.clip(np.rint(audio * 32768.0), -32768, 32767).astype(np.int16)


def check_timeline(frames: list[AudioFrame], frame_ms: int) -> None:
    assert [f.seq for f in frames] == list(range(len(frames)))
    assert [f.pts_ms for f in frames] == [i * frame_ms for i in range(len(frames))]


def check_pcm16_timeline(frames: list[AudioFrame], rate: int = 24000) -> None:
    """pts is the duration of everything before, even after short (flushed) frames."""
    assert [f.seq for f in frames] == list(range(len(frames)))
    before = np.cumsum([0] + [len(f.payload) // 2 for f in frames[:-1]])
    assert [f.pts_ms for f in frames] == [int(n) * 1000 // rate for n in before]


def test_session_created_and_subprotocol(client: TestClient) -> None:
    with client.websocket_connect("/v1/realtime", subprotocols=[SUBPROTOCOL]) as ws:
        assert ws.accepted_subprotocol == SUBPROTOCOL
        created = Transcript(ws).until("session.created")
    session = created["session"]
    assert session["id"].startswith("sess_") and session["model"] == "fake-tone"
    assert session["output"] == {"format": "opus", "sample_rate": 24000, "frame_ms": 20}
    assert created["limits"]["max_sessions"] == 1000
    with connect(client) as t:
        assert t.until("session.created")["session"]["id"] != session["id"]


def test_stream_equals_offline_render_in_pcm16(client: TestClient, engine: FakeEngine) -> None:
    with connect(client) as t:
        t.until("session.created")
        t.send(type="session.update", session={"output": {"format": "pcm16"}})
        t.until("session.updated")
        t.send(type="text.append", context_id="a", text="Hello there. Second", event_id="e1")
        created = t.until("context.created", context_id="a")
        assert created["reply_to"] == "e1"
        t.send(type="text.append", context_id="a", text=" sentence")
        t.send(type="context.end", context_id="a", event_id="end")
        done = t.until("context.done", context_id="a")
    frames = t.frames(created["stream"])
    check_timeline(frames, 20)
    np.testing.assert_array_equal(
        pcm16(frames), expected_pcm16(engine, "Hello there.", "Second sentence")
    )
    started = t.events("segment.started")
    assert [s["text"] for s in started] == ["Hello there. ", "Second sentence"]
    seg_done = t.events("segment.done")
    assert started[0]["start_ms"] == 0 and seg_done[0]["end_ms"] == started[1]["start_ms"]
    assert seg_done[-1]["end_ms"] == round(len(pcm16(frames)) / 24)
    assert done["reply_to"] == "end" and done["status"] == "completed"
    assert done["audio_ms"] == seg_done[-1]["end_ms"]
    metrics = done["metrics"]
    assert metrics["segments"] == 2 and metrics["first_segment_chars"] == len("Hello there. ")
    assert metrics["ttfa_ms"] > 0 and metrics["queue_ms"] >= 0 and metrics["rtf"] > 0
    # Events of a segment bracket its audio.
    order = [i if isinstance(i, dict) else "audio" for i in t.items]
    first_audio = order.index("audio")
    assert order[first_audio - 1]["type"] == "segment.started"  # type: ignore[index]


@pytest.mark.parametrize(
    ("output", "frame_bytes"),
    [
        ({"format": "pcm_f32", "sample_rate": 16000, "frame_ms": 10}, 160 * 4),
        ({"format": "mulaw"}, 160),
        ({"format": "pcm16", "sample_rate": 48000, "frame_ms": 40}, 1920 * 2),
        ({"format": "opus", "sample_rate": 48000, "frame_ms": 60}, None),
    ],
)
def test_output_formats(
    client: TestClient, output: dict[str, Any], frame_bytes: int | None
) -> None:
    with connect(client) as t:
        t.until("session.created")
        t.send(type="session.update", session={"output": output})
        updated = t.until("session.updated")["session"]["output"]
        t.send(type="text.append", context_id="a", text="Format check please.")
        t.send(type="context.end", context_id="a")
        t.until("context.done")
    frames = t.frames()
    check_timeline(frames, updated["frame_ms"])
    if frame_bytes is not None:
        assert {len(f.payload) for f in frames[:-1]} == {frame_bytes}
    else:
        assert all(0 < len(f.payload) < 1500 for f in frames)


def test_base64_transport_sends_audio_delta(client: TestClient, engine: FakeEngine) -> None:
    with connect(client) as t:
        t.until("session.created")
        t.send(
            type="session.update",
            session={"audio_transport": "base64", "output": {"format": "pcm16"}},
        )
        t.until("session.updated")
        t.send(type="text.append", context_id="b", text="Base sixty four.")
        t.send(type="context.end", context_id="b")
        t.until("context.done")
    assert t.frames() == []
    deltas = t.events("audio.delta")
    assert [d["seq"] for d in deltas] == list(range(len(deltas)))
    assert [d["pts_ms"] for d in deltas] == [20 * i for i in range(len(deltas))]
    audio = np.concatenate([np.frombuffer(base64.b64decode(d["audio"]), "<i2") for d in deltas])
    np.testing.assert_array_equal(audio, expected_pcm16(engine, "Base sixty four."))


def test_manual_mode_and_flush_ids(client: TestClient, engine: FakeEngine) -> None:
    with connect(client) as t:
        t.until("session.created")
        t.send(
            type="session.update",
            session={"text_buffering": {"mode": "manual"}, "output": {"format": "pcm16"}},
        )
        t.until("session.updated")
        t.send(type="text.append", context_id="m", text="Wait for it. Really.")
        t.until("context.created")
        # The reader handles messages in order: by the pong, the append was
        # taken and (manual mode) nothing was cut; tests/test_session.py
        # checks the same rule on the state machine alone.
        t.send(type="ping", event_id="p")
        t.until("pong", reply_to="p")
        assert t.frames() == [] and t.events("segment.started") == []
        t.send(type="text.flush", context_id="m", event_id="f1")
        flushed = t.until("text.flushed", context_id="m")
        assert flushed["flush_id"] == "flush_1" and flushed["reply_to"] == "f1"
        first_part = len(t.frames())
        # Everything of the flushed text arrived before text.flushed.
        assert len(pcm16(t.frames())) == len(expected_pcm16(engine, "Wait for it.", "Really."))
        t.send(type="text.append", context_id="m", text=" More.")
        t.send(type="text.flush", context_id="m", flush_id="two")
        assert t.until("text.flushed")["flush_id"] == "two"
        t.send(type="context.end", context_id="m")
        t.until("context.done")
    frames = t.frames()
    assert len(frames) > first_part
    check_pcm16_timeline(frames)  # a flush does not break the timeline
    assert any(len(f.payload) < 960 for f in frames[:-1])  # the flush pushed a short frame


def test_cancel_stops_audio_and_aborts_engine() -> None:
    engine = FakeEngine(realtime_factor=0.2, chunk_samples=960)
    with TestClient(fake_app(engine)) as client, connect(client) as t:
        t.until("session.created")
        t.send(type="text.append", context_id="c", text="A long sentence to speak. " * 8)
        t.until("segment.started")
        t.until("segment.started")  # into the second segment
        t.send(type="context.cancel", context_id="c", event_id="x")
        cancelled = t.until("context.cancelled")
        t.send(type="ping", event_id="after")
        t.until("pong")
        after = t.items[t.items.index(cancelled) + 1 :]
    assert not any(isinstance(i, AudioFrame) for i in after)
    assert cancelled["reply_to"] == "x"
    sent = t.frames()
    assert cancelled["audio_ms_sent"] == pytest.approx(
        sum(len(f.payload) for f in sent) * 0, abs=1e9
    )
    assert cancelled["audio_ms_sent"] == 20 * len(sent)
    assert cancelled["text_spoken"].startswith("A long sentence to speak. A long")
    assert cancelled["text_spoken"] + cancelled["text_unspoken"] == "A long sentence to speak. " * 8
    assert engine.log.aborted, "the running engine request was aborted"
    assert set(engine.log.aborted) <= set(engine.log.stopped)
    assert engine.running == []


MALFORMED = [
    "not json",
    "[]",
    json.dumps({"type": "teleport"}),
    json.dumps({"context_id": "a"}),
    json.dumps({"type": "text.append", "context_id": "a", "text": 5}),
    json.dumps({"type": "text.append", "context_id": ["a"], "text": "x"}),
    json.dumps({"type": "session.update", "session": {"output": {"format": "wav"}}}),
    json.dumps({"type": "context.cancel", "context_id": "nobody"}),
]


def test_malformed_messages_each_get_an_error_and_the_session_works(client: TestClient) -> None:
    with connect(client) as t:
        t.until("session.created")
        for i, raw in enumerate(MALFORMED):
            t.ws.send_text(raw)
            error = t.until("error")
            assert error["error"]["type"] == "invalid_request_error", raw
            t.send(type="ping", event_id=f"p{i}")
            t.until("pong", reply_to=f"p{i}")
        t.send(type="text.append", context_id="ok", text="Still fine.")
        t.send(type="context.end", context_id="ok")
        assert t.until("context.done")["status"] == "completed"


def test_binary_frames_error_then_close_1008(client: TestClient) -> None:
    with connect(client) as t:
        t.until("session.created")
        t.ws.send_bytes(b"\x01\x02")
        assert t.until("error")["error"]["code"] == "binary_not_allowed"
        t.send(type="ping", event_id="alive")
        t.until("pong")
        t.ws.send_bytes(b"\x01")
        assert t.until("error")["error"]["code"] == "binary_not_allowed"
        assert t.closed() == CLOSE_POLICY


def test_oversize_messages_error_then_close_1009() -> None:
    with TestClient(fake_app(limits={"max_message_bytes": 1000})) as client, connect(client) as t:
        t.until("session.created")
        big = json.dumps({"type": "text.append", "context_id": "a", "text": "x" * 2000})
        t.ws.send_text(big)
        assert t.until("error")["error"]["code"] == "message_too_big"
        t.send(type="ping", event_id="alive")
        t.until("pong")
        t.ws.send_text(big)
        t.until("error")
        assert t.closed() == CLOSE_TOO_BIG


def test_a_failing_context_leaves_the_others_running() -> None:
    engine = FakeEngine(fail_on="explode", fail_after_chunks=1, chunk_samples=960)
    with TestClient(fake_app(engine)) as client, connect(client) as t:
        t.until("session.created")
        t.send(type="text.append", context_id="bad", text="This will explode now.")
        t.send(type="text.append", context_id="good", text="This one is fine.")
        t.send(type="context.end", context_id="good")
        t.send(type="context.end", context_id="bad")
        # The two contexts run concurrently, so either may finish first.
        done = {}
        while len(done) < 2:
            event = t.until("context.done")
            done[event["context_id"]] = event
        bad_done, good_done = done["bad"], done["good"]
        t.send(type="text.append", context_id="bad", text="more")
        late = t.until("error")
    assert bad_done["status"] == "failed" and good_done["status"] == "completed"
    error = next(e for e in t.events("error") if e["error"].get("context_id") == "bad")
    assert error["error"]["type"] == "server_error" and error["error"]["code"] == "engine_error"
    assert late["error"]["code"] == "context_ended"


class ClonableVoices:
    """A voice registry that teaches the fake engine each new voice."""

    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine

    def has(self, voice_id: str, key_id: str = "anonymous") -> bool:
        return voice_id in self.engine.config.voices

    async def refresh(self, voice_id: str, key_id: str = "anonymous") -> None:
        return None  # everything lives in this process

    async def reference(self, voice_id: str, key_id: str = "anonymous") -> None:
        if not self.has(voice_id):
            raise ValueError(f"no voice named {voice_id!r}")
        return None  # the fake engine knows the voice by name

    async def create(
        self, audio: bytes, text: str | None, voice_id: str | None, key_id: str = "anonymous"
    ) -> CreatedVoice:
        if not audio.startswith(b"RIFF"):
            raise ValueError("not a WAV file")
        name = voice_id or "clone-1"
        cached = name in self.engine.config.voices
        self.engine.config.voices = (*self.engine.config.voices, name)
        return CreatedVoice(name, duration_s=len(audio) / 48000, frames=3, cached=cached)


def test_voice_create_then_use_it() -> None:
    engine = FakeEngine()
    from gateway_support import sentence_segmenter

    from gateway.app import create_app
    from gateway.settings import GatewaySettings

    app = create_app(
        GatewaySettings(),
        engine,
        voices=ClonableVoices(engine),
        segmenter_factory=sentence_segmenter,
    )
    clip = base64.b64encode(b"RIFF" + bytes(96000)).decode()
    with TestClient(app) as client, connect(client) as t:
        t.until("session.created")
        t.send(type="voice.create", audio=clip, text="ref", voice_id="me", event_id="v1")
        created = t.until("voice.created")
        assert created == {**created, "voice_id": "me", "cached": False, "reply_to": "v1"}
        assert created["duration_s"] == 2.0 and created["frames"] == 3
        t.send(type="voice.create", audio="data:audio/wav;base64," + clip, voice_id="me")
        assert t.until("voice.created")["cached"] is True
        t.send(type="voice.create", audio=base64.b64encode(b"junk").decode())
        assert t.until("error")["error"]["code"] == "voice_invalid"
        t.send(type="session.update", session={"voice": "me"})
        assert t.until("session.updated")["session"]["voice"] == "me"
        t.send(type="text.append", context_id="v", text="In my voice.")
        t.send(type="context.end", context_id="v")
        assert t.until("context.done")["status"] == "completed"
    assert engine.log.requests[-1].voice == "me"


def test_voice_create_on_an_engine_that_cannot_clone(client: TestClient) -> None:
    with connect(client) as t:
        t.until("session.created")
        t.send(type="voice.create", audio=base64.b64encode(b"RIFF" + bytes(100)).decode())
        error = t.until("error")["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] in ("voice_unsupported", "voice_invalid")


def test_idle_sessions_are_closed() -> None:
    with TestClient(fake_app(limits={"idle_timeout_s": 0.3})) as client, connect(client) as t:
        t.until("session.created")
        start = time.perf_counter()
        t.send(type="ping")  # activity restarts the idle clock
        t.until("pong")
        assert t.closed() == CLOSE_NORMAL
        assert time.perf_counter() - start >= 0.29  # never before the idle limit


def test_max_sessions_refuses_with_1013() -> None:
    with TestClient(fake_app(limits={"max_sessions": 1})) as client, connect(client) as first:
        first.until("session.created")
        with connect(client) as second:
            error = second.until("error")["error"]
            assert error["type"] == "engine_overloaded" and error["retryable"]
            assert second.closed() == CLOSE_TRY_AGAIN
        first.send(type="ping", event_id="still")
        first.until("pong")
    with TestClient(fake_app(limits={"max_sessions": 1})) as client:
        admission = client.app.state.gateway.admission  # type: ignore[attr-defined]
        for _ in range(3):  # slots are released when sessions end
            with connect(client) as t:
                t.until("session.created")
            deadline = time.perf_counter() + 30  # generous: only a hang fails
            while admission.sessions and time.perf_counter() < deadline:
                time.sleep(0.01)
            assert admission.sessions == 0


def test_unknown_model_is_refused(client: TestClient) -> None:
    with connect(client, "/v1/realtime?model=other") as t:
        assert t.until("error")["error"]["param"] == "model"
        assert t.closed() == CLOSE_POLICY
    with connect(client, "/v1/realtime?model=fake-tone") as t:
        t.until("session.created")


def test_token_by_token_with_the_default_segmenter(engine: FakeEngine) -> None:
    from gateway.app import create_app
    from gateway.settings import GatewaySettings

    text = "Dr. Smith paid $3.14 for 1,000 apples. Then he left, smiling <|emotion:joy|> happily"
    with TestClient(create_app(GatewaySettings(), engine)) as client, connect(client) as t:
        t.until("session.created")
        for token in text.split(" "):
            t.send(type="text.append", context_id="tok", text=token + " ")
        first = t.until("segment.started")
        assert first["text"] == "Dr. Smith paid $3.14 for 1,000 apples."
        # Past max_buffer_delay_ms the rest is spoken without an end: wait for it.
        spoken = first["text"]
        while spoken.split() != text.split():
            spoken += t.until("segment.started")["text"]
        t.send(type="context.end", context_id="tok")
        t.until("context.done")
    spoken = "".join(e["text"] for e in t.events("segment.started"))
    assert spoken.split() == text.split()
    assert all(r.text == r.text.strip() for r in engine.log.requests)
