"""The shared protocol models: parsing, validation, round trips, frame header."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from gateway.protocol import (
    CLIENT_EVENT_ADAPTER,
    CLIENT_EVENT_TYPES,
    FRAME_HEADER_BYTES,
    PRESETS,
    SERVER_EVENT_ADAPTER,
    AudioDelta,
    Chunking,
    ContextCancelled,
    ContextCreated,
    ContextDone,
    ContextMetrics,
    ErrorDetail,
    ErrorEvent,
    Limits,
    OutputConfig,
    Pong,
    ProtocolError,
    SegmentDone,
    SegmentStarted,
    SessionConfig,
    SessionCreated,
    SessionUpdated,
    TextAppend,
    TextFlushed,
    VoiceCreated,
    apply_session_update,
    dump_event,
    pack_audio_frame,
    parse_client_event,
    parse_server_event,
    unpack_audio_frame,
)
from gateway.protocol.frame_header import pack_frame, parse_frame

SESSION = SessionConfig(id="sess_1", model="m")

SERVER_EVENTS: list[BaseModel] = [
    SessionCreated(session=SESSION, limits=Limits()),
    SessionUpdated(session=SESSION, reply_to="e1"),
    ContextCreated(context_id="c", stream=3),
    TextFlushed(context_id="c", flush_id="flush_1"),
    SegmentStarted(context_id="c", segment=0, text="Hi.", start_ms=0),
    SegmentDone(context_id="c", segment=0, end_ms=480),
    ContextDone(context_id="c", audio_ms=480, metrics=ContextMetrics(ttfa_ms=80.5, segments=1)),
    ContextDone(context_id="c", status="failed", audio_ms=0, metrics=ContextMetrics()),
    ContextCancelled(context_id="c", audio_ms_sent=20, text_spoken="a", text_unspoken="b"),
    AudioDelta(context_id="c", seq=0, pts_ms=0, audio="AAAA"),
    VoiceCreated(voice_id="v", duration_s=1.5, frames=38, cached=False),
    Pong(reply_to="p"),
    ErrorEvent(
        error=ErrorDetail(
            type="rate_limit_error", code="too_many_contexts", message="x", retry_after_ms=250
        )
    ),
]


@pytest.mark.parametrize("event", SERVER_EVENTS, ids=lambda e: getattr(e, "type", "?"))
def test_every_server_event_round_trips(event: BaseModel) -> None:
    wire = dump_event(event)
    assert parse_server_event(wire) == event
    assert json.loads(wire)["event_id"].startswith("evt_")


def test_server_events_tolerate_unknown_fields() -> None:
    wire = json.dumps({"type": "pong", "event_id": "e", "new_field": 1})
    assert parse_server_event(wire) == Pong(event_id="e")


CLIENT_EXAMPLES: list[dict[str, Any]] = [
    {"type": "session.update", "session": {"voice": "x"}, "event_id": "1"},
    {"type": "text.append", "context_id": "c", "text": "Hello"},
    {"type": "text.flush", "context_id": "c"},
    {"type": "text.flush", "context_id": "c", "flush_id": "f"},
    {"type": "context.end", "context_id": "c"},
    {"type": "context.cancel", "context_id": "c"},
    {"type": "voice.create", "audio": "UklGRg==", "text": "hi", "voice_id": "me"},
    {"type": "ping"},
]


def test_every_client_event_type_parses() -> None:
    parsed = [parse_client_event(json.dumps(example)) for example in CLIENT_EXAMPLES]
    assert {p.type for p in parsed} == CLIENT_EVENT_TYPES
    assert parsed[1] == TextAppend(context_id="c", text="Hello")
    for example, event in zip(CLIENT_EXAMPLES, parsed, strict=True):
        assert event.model_dump(exclude_none=True) == example | (
            {"event_id": "1"} if "event_id" in example else {}
        )


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None)
@given(
    type_=st.sampled_from([*sorted(CLIENT_EVENT_TYPES), "", "x"]),
    fields=st.dictionaries(
        st.sampled_from(["context_id", "text", "session", "audio", "flush_id", "event_id", "z"]),
        json_values,
        max_size=4,
    ),
)
def test_any_json_object_either_parses_or_gives_a_typed_error(
    type_: str, fields: dict[str, Any]
) -> None:
    raw = json.dumps({"type": type_, **fields})
    try:
        event = parse_client_event(raw)
    except ProtocolError as e:
        assert e.detail.type == "invalid_request_error"
        assert e.detail.code and e.detail.message
        event_id = fields.get("event_id")
        assert e.detail.reply_to == (event_id if isinstance(event_id, str) else None)
    else:
        assert event.type == type_


@given(st.binary(max_size=64))
def test_arbitrary_bytes_never_crash_the_parser(data: bytes) -> None:
    try:
        parse_client_event(data)
    except ProtocolError as e:
        assert e.detail.code in {
            "invalid_json",
            "invalid_event",
            "missing_type",
            "unknown_event_type",
            "invalid_value",
        }


@pytest.mark.parametrize("fmt", ["opus", "pcm16", "pcm_f32", "mulaw"])
@pytest.mark.parametrize("rate", [8000, 16000, 22050, 24000, 44100, 48000])
def test_format_and_rate_rules(fmt: str, rate: int) -> None:
    valid = rate in (8000, 16000, 24000, 48000) and (fmt != "mulaw" or rate == 8000)
    if valid:
        assert OutputConfig(format=fmt, sample_rate=rate).sample_rate == rate  # type: ignore[arg-type]
    else:
        with pytest.raises(ValidationError):
            OutputConfig(format=fmt, sample_rate=rate)  # type: ignore[arg-type]


@pytest.mark.parametrize("frame_ms", [5, 10, 20, 40, 60, 80])
def test_frame_durations(frame_ms: int) -> None:
    if frame_ms in (10, 20, 40, 60):
        assert OutputConfig(frame_ms=frame_ms).frame_ms == frame_ms  # type: ignore[arg-type]
    else:
        with pytest.raises(ValidationError):
            OutputConfig(frame_ms=frame_ms)  # type: ignore[arg-type]


def test_defaults_match_the_published_session_and_limits() -> None:
    dumped = SESSION.model_dump()
    assert dumped["output"] == {"format": "opus", "sample_rate": 24000, "frame_ms": 20}
    assert dumped["text_buffering"] == {"mode": "auto", "max_buffer_delay_ms": 250}
    assert dumped["sampling"] == {"temperature": 1.0, "top_k": 50, "top_p": 0.95, "seed": None}
    # the default preset was chosen from measurements (docs/presets.md), not the example's
    assert (dumped["latency_preset"], dumped["max_audio_seconds"]) == ("exact", 120)
    assert dumped["chunking"] == PRESETS["exact"].model_dump()
    limits = Limits().model_dump()
    assert limits == limits | {
        "max_sessions": 1000,
        "max_contexts": 8,
        "max_text_chars_per_context": 20000,
        "max_message_bytes": 16777216,
        "idle_timeout_s": 120,
    }


@pytest.mark.parametrize(
    ("name", "values"),
    [
        ("latency", (1, 10, 10, 2)),
        ("balanced", (2, 15, 12, 4)),
        ("exact", (4, 25, 12, 10)),
    ],
)
def test_presets_table(name: str, values: tuple[int, int, int, int]) -> None:
    preset = PRESETS[name]
    assert (
        preset.first_chunk_frames,
        preset.chunk_frames,
        preset.left_context_frames,
        preset.right_holdback_frames,
    ) == values


def test_session_update_merging_rules() -> None:
    s = apply_session_update(SESSION, {"output": {"format": "mulaw"}})
    assert (s.output.format, s.output.sample_rate, s.output.frame_ms) == ("mulaw", 8000, 20)
    s = apply_session_update(s, {"output": {"format": "pcm16"}})
    assert s.output.sample_rate == 24000  # back to the native rate
    s = apply_session_update(s, {"output": {"sample_rate": 16000}})
    assert (s.output.format, s.output.sample_rate) == ("pcm16", 16000)
    s = apply_session_update(s, {"sampling": {"seed": 7}})
    assert (s.sampling.seed, s.sampling.top_k) == (7, 50)
    s = apply_session_update(s, {"chunking": {"right_holdback_frames": 4}})
    assert s.latency_preset == "custom" and s.chunking is not None
    # the other fields keep the default preset's (exact: 4 first frames)
    assert s.chunking.first_chunk_frames == 4 and s.chunking.right_holdback_frames == 4
    # docs/presets.md's recipe for exact audio with a one-frame first chunk
    early = apply_session_update(SESSION, {"chunking": {"first_chunk_frames": 1}}).chunking
    assert early == PRESETS["exact"].model_copy(update={"first_chunk_frames": 1})
    s = apply_session_update(s, {"latency_preset": "latency"})
    assert s.chunking == PRESETS["latency"]
    both = {"latency_preset": "exact", "chunking": PRESETS["exact"].model_dump()}
    assert apply_session_update(s, both).latency_preset == "exact"
    with pytest.raises(ValidationError):
        apply_session_update(
            s, {"latency_preset": "exact", "chunking": PRESETS["latency"].model_dump()}
        )
    with pytest.raises(ValidationError):
        apply_session_update(s, {"latency_preset": "custom", "chunking": None})
    with pytest.raises(ValidationError):
        Chunking(
            first_chunk_frames=0, chunk_frames=1, left_context_frames=0, right_holdback_frames=0
        )


@given(
    stream=st.integers(0, 0xFFFF),
    seq=st.integers(0, 0xFFFFFFFF),
    pts=st.integers(0, 0xFFFFFFFF),
    payload=st.binary(max_size=40),
)
def test_frame_header_round_trip_and_agrees_with_the_header_codec(
    stream: int, seq: int, pts: int, payload: bytes
) -> None:
    data = pack_audio_frame(stream, seq, pts, payload)
    assert data == pack_frame(stream, seq, pts, payload)
    frame = unpack_audio_frame(data)
    assert (frame.stream, frame.seq, frame.pts_ms, frame.payload) == (stream, seq, pts, payload)
    other = parse_frame(data)
    assert (other.stream, other.seq, other.pts_ms) == (stream, seq, pts)
    assert data[:2] == b"\x01\x01" and len(data) == FRAME_HEADER_BYTES + len(payload)


@pytest.mark.parametrize(
    "bad", [b"", b"\x01\x01\x00", b"\x02\x01" + bytes(10), b"\x01\x07" + bytes(10)]
)
def test_frame_header_rejects_bad_frames(bad: bytes) -> None:
    with pytest.raises(ValueError):
        unpack_audio_frame(bad)


def test_json_schemas_exist_for_clients() -> None:
    client_schema = CLIENT_EVENT_ADAPTER.json_schema()
    server_schema = SERVER_EVENT_ADAPTER.json_schema()
    assert "discriminator" in json.dumps(client_schema)
    assert "session.created" in json.dumps(server_schema)
