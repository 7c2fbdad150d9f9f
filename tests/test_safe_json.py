"""The JSON boundary: depth bounded before parsing, lone surrogates named, echoes bounded."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.protocol import (
    ErrorCode,
    ErrorDetail,
    ErrorEvent,
    ProtocolError,
    parse_client_event,
    safe_json,
)


@pytest.mark.parametrize("depth", [1, 5, 31, 32])
def test_depth_at_or_under_the_limit_parses(depth: int) -> None:
    text = "[" * depth + "]" * depth
    assert safe_json.json_depth(text) == depth
    assert safe_json.loads(text) is not None


@pytest.mark.parametrize("text", ["[" * 33 + "]" * 33, "[" * 990, "{" * 5000, '{"a":' * 40])
def test_deeper_than_the_limit_is_refused_before_parsing(text: str) -> None:
    with pytest.raises(safe_json.JsonTooDeep):
        safe_json.loads(text)


def test_brackets_inside_strings_do_not_count() -> None:
    text = json.dumps({"text": "[" * 5000 + '\\"{' * 100})
    assert safe_json.json_depth(text) == 1
    assert safe_json.loads(text)["text"].startswith("[[[")


@given(st.recursive(st.none() | st.integers() | st.text(), lambda c: st.lists(c, max_size=3)))
def test_depth_matches_the_parsed_structure(value: object) -> None:
    def depth(v: object) -> int:
        return 1 + max(map(depth, v), default=0) if isinstance(v, list) else 0

    assert safe_json.json_depth(json.dumps(value)) == depth(value)


def test_lone_surrogates_are_named_by_path() -> None:
    with pytest.raises(safe_json.InvalidText) as err:
        safe_json.loads('{"session": {"voices": ["ok", "\\ud800"]}}')
    assert err.value.param == "session.voices.1"
    with pytest.raises(safe_json.InvalidText) as err:
        safe_json.loads('{"\\udfff key": 1}')
    assert err.value.param is not None and "key" in err.value.param
    # A valid pair is a real character.
    assert safe_json.loads('"\\ud83d\\ude00"') == "\U0001f600"


@given(st.text())
def test_every_string_that_passes_encodes(text: str) -> None:
    message = json.dumps({"type": "text.append", "context_id": "c", "text": text})
    try:
        event = parse_client_event(message)
    except ProtocolError as e:
        assert e.detail.code == ErrorCode.INVALID_VALUE and e.detail.param == "text"
        assert not safe_json.is_valid_text(text)
    else:
        assert event.text.encode("utf-8").decode("utf-8") == text  # type: ignore[union-attr]


def test_surrogate_event_id_gets_an_encodable_error() -> None:
    with pytest.raises(ProtocolError) as err:
        parse_client_event('{"type": "ping", "event_id": "\\ud800"}')
    detail = err.value.detail
    assert detail.param == "event_id" and detail.code == ErrorCode.INVALID_VALUE
    ErrorEvent(error=detail).model_dump_json()  # serialisable


def test_huge_event_id_is_echoed_as_a_bounded_prefix() -> None:
    huge = "x" * 5_000_000
    with pytest.raises(ProtocolError) as err:
        parse_client_event(json.dumps({"type": "ping", "event_id": huge}))
    detail = err.value.detail
    reply = ErrorEvent(reply_to=detail.reply_to, error=detail).model_dump_json()
    assert len(reply) < 2 * safe_json.MAX_ECHO_CHARS + 1024
    assert detail.reply_to is not None and huge.startswith(detail.reply_to.rstrip("…"))


def test_unknown_type_is_echoed_bounded() -> None:
    with pytest.raises(ProtocolError) as err:
        parse_client_event(json.dumps({"type": "y" * 100_000}))
    assert err.value.detail.code == ErrorCode.UNKNOWN_EVENT_TYPE
    assert len(err.value.detail.message) < 300


def test_error_detail_caps_every_echoed_field() -> None:
    detail = ErrorDetail(
        type="invalid_request_error",
        code="c" * 1000,
        message="m\ud800" * 10_000,
        param="p" * 1000,
        context_id="\udfff" * 1000,
        reply_to="r" * 1000,
    )
    assert len(detail.message) <= 1024 and len(detail.param or "") <= safe_json.MAX_ECHO_CHARS
    assert len(ErrorEvent(error=detail).model_dump_json()) < 3000
