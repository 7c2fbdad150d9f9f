"""``POST /v1/audio/speech`` validation: field order, ``param`` and messages, over real HTTP."""

from __future__ import annotations

import base64
import io
import wave
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
import pytest
import pytest_asyncio
from hypothesis import given, settings
from hypothesis import strategies as st
from live_server import live_server
from starlette.applications import Starlette

from gateway.http.speech import routes
from gateway.http.speech_request import (
    KNOWN_FIELDS,
    RESPONSE_FORMATS,
    ApiError,
    parse_speech_request,
)
from gateway.settings import GatewaySettings
from gateway.state import GatewayState
from gateway.voices import VoiceLibrary
from realtime_engine.engines.fake import FakeEngine

module_loop = pytest.mark.asyncio(loop_scope="module")


def _clip_uri(seconds: float = 1.0) -> str:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(24_000)
        t = np.arange(int(seconds * 24_000)) / 24_000
        out.writeframes((3000 * np.sin(2 * np.pi * 200 * t)).astype("<i2").tobytes())
    return "data:audio/wav;base64," + base64.b64encode(buffer.getvalue()).decode()


CLIP = _clip_uri()
GARBAGE = base64.b64encode(b"\x01\x02not audio" * 200).decode()
OK = {"input": "Hello world."}

# (body, param, words the message must contain)
INVALID: list[tuple[dict[str, Any], str | None, tuple[str, ...]]] = [
    ({}, "input", ("input", "required")),
    ({"input": ""}, "input", ("input", "empty")),
    ({"input": "  \n "}, "input", ("input", "empty")),
    ({"input": 5}, "input", ("input", "string")),
    ({"input": "x" * 20_001}, "input", ("input", "longer")),
    # input is checked before every other field
    ({"input": "", "voice": "nobody", "response_format": "ogg", "speed": 9}, "input", ("input",)),
    # then the voice fields, before response_format
    ({**OK, "voice": "nobody", "response_format": "ogg"}, "voice", ("nobody",)),
    ({**OK, "voice": 3}, "voice", ("voice",)),
    ({**OK, "voice": {"name": "x"}}, "voice", ("voice",)),
    ({**OK, "ref_audio": "/etc/passwd", "response_format": "ogg"}, "ref_audio", ("paths",)),
    ({**OK, "ref_audio": "./clip.wav"}, "ref_audio", ("paths are not read",)),
    ({**OK, "ref_audio": "https://example.com/a.wav"}, "ref_audio", ("URLs are not fetched",)),
    ({**OK, "ref_audio": "file:///etc/passwd"}, "ref_audio", ("URLs are not fetched",)),
    ({**OK, "ref_audio": 12}, "ref_audio", ("ref_audio", "string")),
    ({**OK, "ref_audio": GARBAGE, "response_format": "ogg"}, "ref_audio", ("decoded",)),
    ({**OK, "ref_text": ["a"]}, "ref_text", ("ref_text",)),
    (
        {**OK, "references": [{"audio": CLIP, "text": "a"}, {"audio": CLIP, "text": "b"}]},
        "references",
        ("references",),
    ),
    ({**OK, "references": []}, "references", ("references",)),
    ({**OK, "references": "clip"}, "references", ("references",)),
    ({**OK, "references": [{"text": "no audio"}]}, "references", ("references[0].audio",)),
    (
        {**OK, "ref_audio": CLIP, "references": [{"audio_path": "https://example.com/o.wav"}]},
        "references",
        ("mutually exclusive",),
    ),
    (
        {**OK, "ref_text": "one", "references": [{"audio": CLIP, "text": "two"}]},
        "references",
        ("conflict",),
    ),
    ({**OK, "references": [{"audio_path": "/srv/voices/a.wav"}]}, "references", ("paths",)),
    # then response_format, before the rest
    ({**OK, "response_format": "ogg", "speed": 100, "foo": 1}, "response_format", ("mp3",)),
    ({**OK, "response_format": None}, "response_format", ("response_format",)),
    # the rest
    ({**OK, "foo": 1}, "foo", ("unrecognized", "foo")),
    ({**OK, "model": "gpt-9-tts"}, "model", ("gpt-9-tts",)),
    ({**OK, "speed": 100}, "speed", ("speed", "0.25", "4")),
    ({**OK, "speed": "fast"}, "speed", ("number",)),
    ({**OK, "speed": True}, "speed", ("number",)),
    ({**OK, "stream_format": "websocket"}, "stream_format", ("sse",)),
    ({**OK, "stream": "yes"}, "stream", ("boolean",)),
    ({**OK, "stream_format": "sse", "stream": False}, "stream", ("sse",)),
    ({**OK, "instructions": 7}, "instructions", ("instructions",)),
    ({**OK, "max_new_tokens": 0}, "max_new_tokens", ("max_new_tokens",)),
    ({**OK, "max_new_tokens": 2.5}, "max_new_tokens", ("integer",)),
    ({**OK, "temperature": 3}, "temperature", ("temperature",)),
    ({**OK, "top_k": -1}, "top_k", ("top_k",)),
    ({**OK, "top_p": 0}, "top_p", ("top_p",)),
    ({**OK, "seed": -5}, "seed", ("seed",)),
    ({**OK, "seed": "42"}, "seed", ("seed",)),
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server() -> AsyncIterator[httpx.AsyncClient]:
    engine = FakeEngine()
    state = GatewayState.create(GatewaySettings(), engine, voices=VoiceLibrary(engine))
    async with (
        live_server(Starlette(routes=routes(state))) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        yield client


@module_loop
@pytest.mark.parametrize(("body", "param", "words"), INVALID)
async def test_invalid_requests_name_their_field(
    server: httpx.AsyncClient, body: dict[str, Any], param: str | None, words: tuple[str, ...]
) -> None:
    response = await server.post("/v1/audio/speech", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    for word in words:
        assert word in error["message"]
    assert set(error) >= {"type", "code", "message", "param"}


@module_loop
async def test_body_that_is_not_a_json_object(server: httpx.AsyncClient) -> None:
    broken = await server.post("/v1/audio/speech", content=b"{not json")
    listed = await server.post("/v1/audio/speech", json=["input"])
    for response in (broken, listed):
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "invalid_json"


@module_loop
async def test_reference_audio_is_validated_then_refused_by_the_engine(
    server: httpx.AsyncClient,
) -> None:
    # A valid clip with a bad later field: the validation error wins.
    late = await server.post(
        "/v1/audio/speech", json={**OK, "ref_audio": CLIP, "response_format": "ogg"}
    )
    assert late.json()["error"]["param"] == "response_format"
    for body in (
        {**OK, "ref_audio": CLIP, "ref_text": "a tone"},
        {**OK, "references": [{"audio": CLIP, "text": "a tone"}]},
        {**OK, "references": [{"audio_path": CLIP}]},
    ):
        response = await server.post("/v1/audio/speech", json=body)
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["code"] == "voice_unsupported"
        assert "fake engine cannot clone" in error["message"]
        assert error["param"] in ("ref_audio", "references")


def _parse(body: dict[str, Any]) -> Any:
    return parse_speech_request(
        body,
        has_voice=lambda v: v in ("default", "fake-bright"),
        model_names=frozenset({"fake-tone"}),
        max_input_chars=100,
    )


def test_defaults_follow_openai() -> None:
    params = _parse({"input": "Hi."})
    assert params.response_format == "mp3"
    assert params.stream_format == "audio" and params.stream is True
    assert params.voice == "default" and params.speed == 1.0
    assert params.ref_audio is None and params.model is None


def test_openai_names_and_extensions_are_accepted() -> None:
    params = _parse(
        {
            "input": "Hi.",
            "model": "tts-1",
            "voice": "alloy",
            "speed": 1.5,
            "instructions": "Speak warmly.",
            "max_new_tokens": 500,
            "seed": 7,
            "temperature": 0.7,
            "top_k": 20,
            "top_p": 0.9,
            "references": [{"audio_path": CLIP, "text": "a tone"}],
        }
    )
    assert params.voice == "default" and params.speed == 1.5
    assert params.sampling.seed == 7 and params.sampling.top_k == 20
    assert params.ref_audio is not None and params.ref_audio.startswith(b"RIFF")
    assert params.ref_text == "a tone" and params.ref_param == "references"
    assert _parse({"input": "Hi.", "voice": {"id": "fake-bright"}}).voice == "fake-bright"
    same = _parse({"input": "Hi.", "ref_audio": CLIP, "references": [{"audio": CLIP}]})
    assert same.ref_audio == params.ref_audio


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
field_names = st.sampled_from(sorted(KNOWN_FIELDS)) | st.text(max_size=10)


@settings(max_examples=120, deadline=None)
@given(st.dictionaries(field_names, json_values, max_size=6), st.booleans())
def test_any_json_body_is_accepted_or_refused_with_a_field(
    body: dict[str, Any], with_input: bool
) -> None:
    if with_input:
        body = {**body, "input": "Hello."}
    try:
        params = _parse(body)
    except ApiError as e:
        assert e.status == 400
        assert e.detail.type == "invalid_request_error" and e.detail.message
        assert e.detail.param is None or e.detail.param in body or e.detail.param == "input"
    else:
        assert params.input.strip() and params.response_format in RESPONSE_FORMATS
        assert 0.25 <= params.speed <= 4.0
