"""The session state machine, driven directly: messages in, actions out."""

from __future__ import annotations

import base64
import itertools
import json
from typing import Any

import pytest
from gateway_support import sentence_segmenter
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.protocol import (
    CLOSE_POLICY,
    CLOSE_TOO_BIG,
    ContextCreated,
    ErrorEvent,
    Limits,
    Pong,
    SessionConfig,
    SessionCreated,
    SessionUpdated,
)
from gateway.realtime.segmenting import default_segmenter_factory
from gateway.realtime.session import (
    Action,
    CancelContext,
    Close,
    CreateVoice,
    EndContext,
    Flush,
    OpenContext,
    SegmenterFactory,
    Send,
    Session,
    Speak,
    decode_audio_payload,
)


class CountingQuota:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def acquire(self) -> bool:
        if self.used >= self.limit:
            return False
        self.used += 1
        return True

    def release(self) -> None:
        self.used -= 1


def make_session(
    quota: CountingQuota | None = None,
    segmenters: SegmenterFactory = sentence_segmenter,
    **limits: Any,
) -> Session:
    config = SessionConfig(id="sess_test", model="fake-tone")
    return Session(
        config,
        Limits(**limits),
        segmenters,
        voice_exists=lambda v: v in {"default", "fake-bright"},
        quota=quota,
    )


def msg(**fields: Any) -> str:
    return json.dumps(fields)


def errors(actions: list[Action]) -> list[ErrorEvent]:
    return [a.event for a in actions if isinstance(a, Send) and isinstance(a.event, ErrorEvent)]


def only_error(actions: list[Action]) -> ErrorEvent:
    assert len(actions) == 1, actions
    errs = errors(actions)
    assert len(errs) == 1
    return errs[0]


def speaks(actions: list[Action]) -> list[Speak]:
    return [a for a in actions if isinstance(a, Speak)]


def test_start_announces_session_and_limits() -> None:
    (action,) = make_session(max_contexts=3).start()
    assert isinstance(action, Send) and isinstance(action.event, SessionCreated)
    assert action.event.session.id == "sess_test"
    assert action.event.limits.max_contexts == 3
    assert action.event.session.chunking is not None


MALFORMED = [
    ("{not json", "invalid_json", None),
    ("[1, 2]", "invalid_event", None),
    ('"text"', "invalid_event", None),
    (msg(context_id="a"), "missing_type", "type"),
    (msg(type="nope"), "unknown_event_type", "type"),
    (msg(type=5), "unknown_event_type", "type"),
    (msg(type="text.append", context_id="a"), "invalid_value", "text"),
    (msg(type="text.append", context_id=7, text="hi"), "invalid_value", "context_id"),
    (msg(type="text.append", context_id="", text="hi"), "invalid_value", "context_id"),
    (msg(type="text.append", context_id="x" * 65, text="hi"), "invalid_value", "context_id"),
    (msg(type="text.append", context_id="a", text="hi", extra=1), "invalid_value", "extra"),
    (msg(type="text.flush", context_id=None), "invalid_value", "context_id"),
    (msg(type="session.update", session=[]), "invalid_value", "session"),
    (msg(type="session.update", session={"voice": "nobody"}), "voice_not_found", "session.voice"),
    (msg(type="session.update", session={"bogus": 1}), "invalid_value", "session.bogus"),
    (msg(type="session.update", session={"id": "other"}), "read_only_field", "session.id"),
    (msg(type="session.update", session={"model": "x"}), "read_only_field", "session.model"),
    (
        msg(type="session.update", session={"output": {"format": "flac"}}),
        "invalid_value",
        "session.output.format",
    ),
    (
        msg(type="session.update", session={"output": {"format": "mulaw", "sample_rate": 24000}}),
        "invalid_value",
        "session.output",
    ),
    (
        msg(type="session.update", session={"output": {"sample_rate": 44100}}),
        "invalid_value",
        "session.output.sample_rate",
    ),
    (
        msg(type="session.update", session={"sampling": {"top_p": 0}}),
        "invalid_value",
        "session.sampling.top_p",
    ),
    (
        msg(type="session.update", session={"latency_preset": "turbo"}),
        "invalid_value",
        "session.latency_preset",
    ),
    (
        msg(type="session.update", session={"chunking": {"first_chunk_frames": 0}}),
        "invalid_value",
        "session.chunking.first_chunk_frames",
    ),
    (msg(type="voice.create", audio="/etc/passwd"), "voice_invalid", "audio"),
    (msg(type="voice.create", audio="https://example.com/a.wav"), "voice_invalid", "audio"),
    (msg(type="voice.create", audio="data:audio/wav,plain"), "voice_invalid", "audio"),
    (msg(type="text.flush", context_id="ghost"), "context_not_found", "context_id"),
    (msg(type="context.end", context_id="ghost"), "context_not_found", "context_id"),
    (msg(type="context.cancel", context_id="ghost"), "context_not_found", "context_id"),
]


@pytest.mark.parametrize(("message", "code", "param"), MALFORMED)
def test_every_malformed_message_gets_one_error_and_the_session_goes_on(
    message: str, code: str, param: str | None
) -> None:
    session = make_session()
    before = session.config
    error = only_error(session.receive_text(message, now=0.0))
    assert error.error.type == "invalid_request_error"
    assert error.error.code == code
    assert error.error.param == param
    assert session.config == before  # an invalid update changes nothing
    (pong,) = session.receive_text(msg(type="ping", event_id="p1"), now=0.0)
    assert isinstance(pong, Send) and isinstance(pong.event, Pong)
    assert pong.event.reply_to == "p1"


def test_errors_echo_the_event_id() -> None:
    session = make_session()
    error = only_error(session.receive_text(msg(type="nope", event_id="e9"), now=0))
    assert error.reply_to == "e9" and error.error.reply_to == "e9"
    error = only_error(
        session.receive_text(msg(type="context.end", context_id="zz", event_id="e10"), now=0)
    )
    assert error.error.reply_to == "e10" and error.error.context_id == "zz"


def test_first_append_opens_a_context_then_speaks_sentences() -> None:
    session = make_session()
    actions = session.receive_text(
        msg(type="text.append", context_id="c1", text="Hello there. How", event_id="a1"), now=1.0
    )
    assert isinstance(actions[0], OpenContext) and actions[0].context_id == "c1"
    created = actions[1]
    assert isinstance(created, Send) and isinstance(created.event, ContextCreated)
    assert (created.event.context_id, created.event.stream) == ("c1", 0)
    assert created.event.reply_to == "a1"
    assert speaks(actions) == [Speak(actions[0].key, 0, "Hello there. ", 1.0)]
    more = session.receive_text(msg(type="text.append", context_id="c1", text=" are you? Bye"), 2)
    assert [s.text for s in speaks(more)] == ["How are you? "]
    assert [s.index for s in speaks(more)] == [1]
    end = session.receive_text(msg(type="context.end", context_id="c1", event_id="e"), 3)
    assert [type(a) for a in end] == [Speak, EndContext]
    assert end[0].text == "Bye" and end[1] == EndContext(actions[0].key, "e")  # type: ignore[union-attr]


def test_contexts_get_distinct_streams_and_keys() -> None:
    session = make_session()
    opened = [
        session.receive_text(msg(type="text.append", context_id=f"c{i}", text="x"), 0)[0]
        for i in range(3)
    ]
    assert all(isinstance(o, OpenContext) for o in opened)
    assert [o.stream for o in opened] == [0, 1, 2]  # type: ignore[union-attr]
    assert len({o.key for o in opened}) == 3  # type: ignore[union-attr]
    assert session.open_contexts == ["c0", "c1", "c2"]


def test_manual_mode_speaks_only_on_flush() -> None:
    session = make_session()
    session.receive_text(
        msg(type="session.update", session={"text_buffering": {"mode": "manual"}}), 0
    )
    actions = session.receive_text(msg(type="text.append", context_id="m", text="One. Two. "), 0)
    assert speaks(actions) == []
    assert session.poll(100.0) == [] and session.next_deadline() is None
    flushed = session.receive_text(msg(type="text.flush", context_id="m", event_id="f"), 5)
    assert [s.text for s in speaks(flushed)] == ["One. ", "Two. "]
    assert flushed[-1] == Flush(actions[0].key, "flush_1", "f")  # type: ignore[union-attr]
    again = session.receive_text(msg(type="text.flush", context_id="m", flush_id="mine"), 6)
    assert again == [Flush(actions[0].key, "mine", None)]  # type: ignore[union-attr]


def test_auto_mode_buffer_delay_fires_through_poll() -> None:
    session = make_session()
    session.receive_text(msg(type="text.append", context_id="a", text="no sentence end yet"), 10.0)
    deadline = session.next_deadline()
    assert deadline == pytest.approx(10.25)
    assert session.poll(10.1) == []
    (speak,) = session.poll(10.3)
    assert isinstance(speak, Speak) and speak.text == "no sentence end " and speak.ready_at == 10.3


def test_end_then_append_or_end_again_is_an_error() -> None:
    session = make_session()
    session.receive_text(msg(type="text.append", context_id="c", text="Hi"), 0)
    session.receive_text(msg(type="context.end", context_id="c"), 0)
    assert (
        only_error(
            session.receive_text(msg(type="text.append", context_id="c", text="x"), 0)
        ).error.code
        == "context_ended"
    )
    assert (
        only_error(session.receive_text(msg(type="context.end", context_id="c"), 0)).error.code
        == "context_ended"
    )
    assert (
        only_error(session.receive_text(msg(type="text.flush", context_id="c"), 0)).error.code
        == "context_ended"
    )


def test_finished_context_ids_are_not_reused() -> None:
    session = make_session()
    key = session.receive_text(msg(type="text.append", context_id="c", text="Hi"), 0)[0].key  # type: ignore[union-attr]
    session.receive_text(msg(type="context.end", context_id="c"), 0)
    session.context_closed(key, "completed")
    assert session.open_contexts == []
    for message in (
        msg(type="text.append", context_id="c", text="more"),
        msg(type="text.flush", context_id="c"),
        msg(type="context.cancel", context_id="c"),
    ):
        assert only_error(session.receive_text(message, 0)).error.code == "context_ended"


def test_cancel_reports_unspoken_text_and_ignores_late_traffic() -> None:
    session = make_session()
    opened = session.receive_text(msg(type="text.append", context_id="c", text="Said. Not yet"), 0)
    key = opened[0].key  # type: ignore[union-attr]
    actions = session.receive_text(msg(type="context.cancel", context_id="c", event_id="x"), 1)
    assert actions == [CancelContext(key, "x", "Not yet")]
    assert session.open_contexts == []
    # Tokens still streaming from an LLM after a barge-in are dropped quietly.
    for message in (
        msg(type="text.append", context_id="c", text="late"),
        msg(type="text.flush", context_id="c"),
        msg(type="context.end", context_id="c"),
        msg(type="context.cancel", context_id="c"),
    ):
        assert session.receive_text(message, 2) == []
    session.context_closed(key, "cancelled")  # the pipeline's report is idempotent


def test_max_contexts_is_a_retryable_rate_limit() -> None:
    session = make_session(max_contexts=2)
    keys = [
        session.receive_text(msg(type="text.append", context_id=c, text="x"), 0)[0].key  # type: ignore[union-attr]
        for c in ("a", "b")
    ]
    error = only_error(session.receive_text(msg(type="text.append", context_id="c", text="x"), 0))
    assert error.error.type == "rate_limit_error" and error.error.code == "too_many_contexts"
    assert error.error.retryable and error.error.retry_after_ms
    assert error.error.context_id == "c"
    session.context_closed(keys[0], "completed")
    assert isinstance(
        session.receive_text(msg(type="text.append", context_id="c", text="x"), 0)[0], OpenContext
    )


def test_key_quota_is_acquired_and_released() -> None:
    quota = CountingQuota(1)
    session = make_session(quota=quota)
    key = session.receive_text(msg(type="text.append", context_id="a", text="x"), 0)[0].key  # type: ignore[union-attr]
    assert quota.used == 1
    error = only_error(session.receive_text(msg(type="text.append", context_id="b", text="x"), 0))
    assert error.error.code == "key_context_limit" and error.error.type == "rate_limit_error"
    session.receive_text(msg(type="context.cancel", context_id="a"), 0)
    assert quota.used == 0
    session.context_closed(key, "cancelled")
    assert quota.used == 0


def test_text_limit_rejects_the_append_and_keeps_the_context() -> None:
    session = make_session(max_text_chars_per_context=10)
    session.receive_text(msg(type="text.append", context_id="a", text="12345"), 0)
    error = only_error(
        session.receive_text(msg(type="text.append", context_id="a", text="123456"), 0)
    )
    assert error.error.code == "text_too_long" and error.error.param == "text"
    assert session.receive_text(msg(type="text.append", context_id="a", text="12345"), 0) == []


def test_oversize_twice_closes_with_1009() -> None:
    session = make_session(max_message_bytes=100)
    big = msg(type="text.append", context_id="a", text="x" * 100)
    assert only_error(session.receive_text(big, 0)).error.code == "message_too_big"
    # Multi-byte characters count as bytes, not characters.
    wide = json.dumps(
        {"type": "text.append", "context_id": "a", "text": "é" * 40}, ensure_ascii=False
    )
    assert len(wide) <= 100 < len(wide.encode())
    actions = session.receive_text(wide, 0)
    assert errors(actions)[0].error.code == "message_too_big"
    assert actions[-1] == Close(CLOSE_TOO_BIG, "messages over max_message_bytes")
    assert session.receive_text(msg(type="ping"), 0) == []  # closed


def test_binary_frames_error_then_close_with_1008() -> None:
    session = make_session()
    assert only_error(session.receive_bytes(b"\x00\x01", 0)).error.code == "binary_not_allowed"
    assert session.receive_text(msg(type="ping"), 0) != []
    actions = session.receive_bytes(b"x", 0)
    assert errors(actions) and isinstance(actions[-1], Close)
    assert actions[-1].code == CLOSE_POLICY
    assert session.receive_bytes(b"x", 0) == [] and session.receive_text(msg(type="ping"), 0) == []


def test_session_update_applies_to_later_contexts_only() -> None:
    session = make_session()
    first = session.receive_text(msg(type="text.append", context_id="a", text="x"), 0)[0]
    (reply,) = session.receive_text(
        msg(
            type="session.update",
            event_id="u",
            session={
                "voice": "fake-bright",
                "output": {"format": "mulaw"},
                "latency_preset": "exact",
            },
        ),
        0,
    )
    assert isinstance(reply, Send) and isinstance(reply.event, SessionUpdated)
    assert reply.event.reply_to == "u"
    new = reply.event.session
    assert (new.voice, new.output.format, new.output.sample_rate) == ("fake-bright", "mulaw", 8000)
    assert new.chunking is not None and new.chunking.right_holdback_frames == 10
    second = session.receive_text(msg(type="text.append", context_id="b", text="x"), 0)[0]
    assert isinstance(first, OpenContext) and isinstance(second, OpenContext)
    assert first.config.voice == "default" and second.config.voice == "fake-bright"
    custom = {
        "first_chunk_frames": 1,
        "chunk_frames": 5,
        "left_context_frames": 10,
        "right_holdback_frames": 10,
    }
    (reply,) = session.receive_text(msg(type="session.update", session={"chunking": custom}), 0)
    assert reply.event.session.latency_preset == "custom"  # type: ignore[union-attr]


def test_voice_create_decodes_base64_and_data_uris() -> None:
    session = make_session()
    raw = b"RIFF....WAVEfmt "
    (action,) = session.receive_text(
        msg(type="voice.create", audio=base64.b64encode(raw).decode(), text="hi", event_id="v"), 0
    )
    assert action == CreateVoice(raw, "hi", None, "v")
    uri = "data:audio/wav;base64," + base64.b64encode(raw).decode()
    assert decode_audio_payload(uri) == raw


def test_stream_ids_skip_streams_in_use_when_wrapping() -> None:
    session = make_session(max_contexts=4)
    session._next_stream = 65535
    a = session.receive_text(msg(type="text.append", context_id="a", text="x"), 0)[0]
    b = session.receive_text(msg(type="text.append", context_id="b", text="x"), 0)[0]
    assert (a.stream, b.stream) == (65535, 0)  # type: ignore[union-attr]
    session._next_stream = 65535
    c = session.receive_text(msg(type="text.append", context_id="c", text="x"), 0)[0]
    assert c.stream == 1  # type: ignore[union-attr]


@settings(max_examples=40, deadline=None)
@given(
    text=st.text(st.sampled_from(list("abc .!?,\n3")), max_size=80),
    cuts=st.lists(st.integers(0, 80), max_size=10),
    manual=st.booleans(),
    real_segmenter=st.booleans(),
)
def test_appended_text_is_spoken_exactly_once_in_order(
    text: str, cuts: list[int], manual: bool, real_segmenter: bool
) -> None:
    factory = default_segmenter_factory if real_segmenter else sentence_segmenter
    session = make_session(segmenters=factory)
    if manual:
        session.receive_text(
            msg(type="session.update", session={"text_buffering": {"mode": "manual"}}), 0
        )
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    spoken: list[Speak] = []
    for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        spoken += speaks(
            session.receive_text(msg(type="text.append", context_id="p", text=text[lo:hi]), i)
        )
        spoken += speaks(session.poll(i + 0.5))
    if len(bounds) > 1:
        spoken += speaks(session.receive_text(msg(type="context.end", context_id="p"), 99))
    assert "".join(s.text for s in spoken).split() == text.split()
    assert [s.index for s in spoken] == list(range(len(spoken)))
    assert all(s.text.strip() for s in spoken)
