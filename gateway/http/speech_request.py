"""Validation of OpenAI-style ``POST /v1/audio/speech`` bodies (sans-I/O).

Fields are checked in a fixed order so the error a client sees is stable and
names its field (``param``): ``input``; the voice fields (``voice``,
``ref_audio``, ``ref_text``, ``references``); ``response_format``; then the
rest. Errors carry the protocol's error model and render like OpenAI's
``{"error": {...}}``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

__all__ = ["ApiError", "SpeechParams", "bad_request", "parse_speech_request"]

from pydantic import ValidationError

from gateway.http.errors import ApiError, bad_request
from gateway.protocol import ErrorCode, Sampling
from gateway.voices import MAX_TRANSCRIPT_CHARS, reference_bytes

ResponseFormat = Literal["wav", "pcm", "opus", "flac", "mp3", "aac"]
RESPONSE_FORMATS: Final = ("wav", "pcm", "opus", "flac", "mp3", "aac")
STREAM_FORMATS: Final = ("audio", "sse")
# OpenAI's own model and voice names, accepted so that stock OpenAI clients work.
OPENAI_MODELS: Final = frozenset({"tts-1", "tts-1-hd", "gpt-4o-mini-tts"})
OPENAI_VOICES: Final = frozenset(
    {"alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer",
     "verse", "marin", "cedar"}
)  # fmt: skip
MAX_INSTRUCTIONS_CHARS = 4096
MAX_NEW_TOKENS_LIMIT = 65_536
KNOWN_FIELDS: Final = frozenset(
    {"model", "input", "voice", "response_format", "speed", "instructions", "stream_format",
     "stream", "ref_audio", "ref_text", "references", "max_new_tokens", "seed", "temperature",
     "top_k", "top_p"}
)  # fmt: skip


@dataclass(frozen=True)
class SpeechParams:
    """A validated speech request."""

    input: str
    voice: str
    ref_audio: bytes | None
    ref_text: str | None
    response_format: ResponseFormat
    stream_format: Literal["audio", "sse"]
    stream: bool
    speed: float
    instructions: str | None
    max_new_tokens: int | None
    sampling: Sampling
    model: str | None
    ref_param: str = "ref_audio"  # the field the reference clip came from


def _string(body: Mapping[str, Any], name: str, max_chars: int | None = None) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad_request(f"'{name}' must be a string", name)
    if max_chars is not None and len(value) > max_chars:
        raise bad_request(f"'{name}' is longer than {max_chars} characters", name)
    return value


def _number(body: Mapping[str, Any], name: str, lo: float, hi: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise bad_request(f"'{name}' must be a number", name)
    if not lo <= value <= hi:
        raise bad_request(f"'{name}' must be between {lo:g} and {hi:g}", name)
    return float(value)


def _integer(body: Mapping[str, Any], name: str, lo: int, hi: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"'{name}' must be an integer", name)
    if not lo <= value <= hi:
        raise bad_request(f"'{name}' must be between {lo} and {hi}", name)
    return value


def _check_input(body: Mapping[str, Any], max_chars: int) -> str:
    if "input" not in body or body["input"] is None:
        raise bad_request("'input' is required", "input")
    text = body["input"]
    if not isinstance(text, str):
        raise bad_request("'input' must be a string", "input")
    if not text.strip():
        raise bad_request("'input' must not be empty", "input")
    if len(text) > max_chars:
        raise bad_request(f"'input' is longer than {max_chars} characters", "input")
    return text


def _check_voice(body: Mapping[str, Any], has_voice: Callable[[str], bool]) -> str:
    value = body.get("voice")
    if value is None:
        return "default"
    if isinstance(value, dict):  # OpenAI's custom-voice form: {"id": "..."}
        value = value.get("id")
    if not isinstance(value, str) or not value:
        raise bad_request("'voice' must be a voice id string (or {\"id\": ...})", "voice")
    if has_voice(value):
        return value
    if value.lower() in OPENAI_VOICES:
        return "default"
    raise bad_request(
        f"voice {value!r} does not exist (see GET /v1/voices)", "voice", ErrorCode.VOICE_NOT_FOUND
    )


def _check_references(body: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """``references: [{audio, text}]`` folded into ``(ref_audio, ref_text)``."""
    ref_audio = _string(body, "ref_audio")
    ref_text = _string(body, "ref_text", MAX_TRANSCRIPT_CHARS)
    refs = body.get("references")
    if refs is None:
        return ref_audio, ref_text
    if not isinstance(refs, list) or not refs:
        raise bad_request("'references' must be a non-empty array of {audio, text}", "references")
    if len(refs) > 1:
        raise bad_request(
            "'references' takes a single reference; several references are not supported",
            "references",
        )
    first = refs[0]
    if not isinstance(first, dict):
        raise bad_request("'references[0]' must be an object {audio, text}", "references")
    audio = first.get("audio", first.get("audio_path"))
    if not isinstance(audio, str) or not audio:
        raise bad_request("'references[0].audio' is required and must be a string", "references")
    if ref_audio and ref_audio != audio:
        raise bad_request("'references' and 'ref_audio' are mutually exclusive", "references")
    text = first.get("text")
    if text is not None and not isinstance(text, str):
        raise bad_request("'references[0].text' must be a string", "references")
    if text and ref_text and text != ref_text:
        raise bad_request("'references[0].text' and 'ref_text' conflict; give one", "references")
    if text and len(text) > MAX_TRANSCRIPT_CHARS:
        raise bad_request(
            f"'references[0].text' is longer than {MAX_TRANSCRIPT_CHARS} characters", "references"
        )
    return audio, text or ref_text


def parse_speech_request(
    body: object,
    *,
    has_voice: Callable[[str], bool],
    model_names: frozenset[str],
    max_input_chars: int,
    check_clip: Callable[[bytes, str], object] | None = None,
) -> SpeechParams:
    """Validate a decoded JSON body; raise ``ApiError`` naming the first bad field.

    ``check_clip(audio, param)`` decodes a reference clip in its place in the
    order (it raises ``ValueError`` for a bad clip); it blocks, so callers with
    a reference clip run this whole function on a worker thread.
    """
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object", None, ErrorCode.INVALID_JSON)
    text = _check_input(body, max_input_chars)

    voice = _check_voice(body, has_voice)
    ref_source, ref_text = _check_references(body)
    ref_param = "references" if body.get("references") is not None else "ref_audio"
    ref_audio = None
    if ref_source is not None:
        try:
            ref_audio = reference_bytes(ref_source, ref_param)
            if check_clip is not None:
                check_clip(ref_audio, ref_param)
        except ValueError as e:
            raise bad_request(str(e), ref_param, ErrorCode.VOICE_INVALID) from e

    response_format = body.get("response_format", "mp3")
    if response_format not in RESPONSE_FORMATS:
        raise bad_request(
            f"'response_format' must be one of {', '.join(RESPONSE_FORMATS)}", "response_format"
        )

    unknown = sorted(set(body) - KNOWN_FIELDS)
    if unknown:
        raise bad_request(f"unrecognized request argument {unknown[0]!r}", unknown[0])
    model = _string(body, "model")
    if model is not None and model not in model_names and model not in OPENAI_MODELS:
        raise bad_request(
            f"model {model!r} is not served here (see GET /v1/models)", "model", "model_not_found"
        )
    stream_format = body.get("stream_format", "audio")
    if stream_format not in STREAM_FORMATS:
        raise bad_request("'stream_format' must be 'audio' or 'sse'", "stream_format")
    stream = body.get("stream", True)
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean", "stream")
    if stream_format == "sse" and not stream:
        raise bad_request("'stream_format' 'sse' needs 'stream' true", "stream")
    speed = _number(body, "speed", 0.25, 4.0)
    instructions = _string(body, "instructions", MAX_INSTRUCTIONS_CHARS)
    max_new_tokens = _integer(body, "max_new_tokens", 1, MAX_NEW_TOKENS_LIMIT)
    sampling_fields = {k: body[k] for k in ("temperature", "top_k", "top_p", "seed") if k in body}
    for key, value in sampling_fields.items():
        if isinstance(value, bool) or (value is not None and not isinstance(value, int | float)):
            raise bad_request(f"'{key}' must be a number", key)
    try:
        sampling = Sampling.model_validate(
            {k: v for k, v in sampling_fields.items() if v is not None}
        )
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        param = str(first["loc"][0]) if first["loc"] else None
        raise bad_request(f"'{param}': {first['msg']}", param) from e
    return SpeechParams(
        input=text,
        voice=voice,
        ref_audio=ref_audio,
        ref_text=ref_text,
        response_format=response_format,
        stream_format=stream_format,
        stream=stream,
        speed=speed if speed is not None else 1.0,
        instructions=instructions,
        max_new_tokens=max_new_tokens,
        sampling=sampling,
        model=model,
        ref_param=ref_param,
    )
