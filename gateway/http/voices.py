"""``GET|POST /v1/voices`` and ``DELETE /v1/voices/{voice_id}``.

``POST`` takes multipart (``audio`` file or base64 field, ``text``,
``voice_id``) or JSON ``{audio, text?, voice_id?}`` with ``audio`` as base64 or
a ``data:`` URI. The clip is decoded and checked first; engines that cannot
clone then refuse clearly. Voices belong to the caller's API key: other keys
neither list, use nor delete them.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from gateway.http.errors import (
    ApiError,
    authenticate,
    bad_request,
    error_response,
    parse_json_body,
    store_unavailable,
)
from gateway.protocol import ErrorCode, ErrorDetail
from gateway.state import GatewayState
from gateway.voices import (
    ReferenceAudioError,
    VoiceConflictError,
    VoiceEntry,
    VoiceError,
    VoiceLibrary,
    VoiceNotFoundError,
    VoiceStoreError,
    decode_clip,
    reference_bytes,
)
from realtime_engine.engines.base import UnsupportedVoiceError


def _voice_error(error: VoiceError) -> ApiError:
    if isinstance(error, VoiceNotFoundError):
        return ApiError(
            404,
            ErrorDetail(
                type="invalid_request_error",
                code=ErrorCode.VOICE_NOT_FOUND,
                message=str(error),
                param=error.param,
            ),
        )
    if isinstance(error, VoiceConflictError):
        return ApiError(
            409,
            ErrorDetail(
                type="invalid_request_error",
                code="voice_conflict",
                message=str(error),
                param=error.param,
            ),
        )
    code = ErrorCode.VOICE_INVALID if isinstance(error, ReferenceAudioError) else "invalid_value"
    return bad_request(str(error), error.param, code)


def _optional_str(value: object, name: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise bad_request(f"'{name}' must be a string", name)
    return value


async def _read_create_body(
    request: Request, max_bytes: int
) -> tuple[bytes, str | None, str | None]:
    """``(audio bytes, text, voice_id)`` from a multipart or JSON body."""
    content_type = request.headers.get("content-type", "")
    fields: dict[str, Any]
    if content_type.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        form = await request.form(max_files=1, max_fields=8, max_part_size=max_bytes)
        fields = dict(form)
        upload = fields.get("audio")
        if isinstance(upload, UploadFile):
            audio = await upload.read(max_bytes + 1)
            if len(audio) > max_bytes:
                raise bad_request(f"'audio' is larger than {max_bytes} bytes", "audio")
            if not audio:
                raise bad_request("'audio' is empty", "audio", ErrorCode.VOICE_INVALID)
            fields["audio"] = audio
    else:
        raw = await request.body()
        if len(raw) > max_bytes:
            raise bad_request(f"the body is larger than {max_bytes} bytes", None)
        fields = parse_json_body(raw)
        if not isinstance(fields, dict):
            raise bad_request("the body must be a JSON object", None, ErrorCode.INVALID_JSON)
    audio_field = fields.get("audio")
    if audio_field is None:
        raise bad_request("'audio' is required", "audio")
    if isinstance(audio_field, bytes):
        audio = audio_field
    elif isinstance(audio_field, str):
        audio = reference_bytes(audio_field, "audio")
    else:
        raise bad_request("'audio' must be a file, base64 or a data: URI", "audio")
    return (
        audio,
        _optional_str(fields.get("text"), "text"),
        _optional_str(fields.get("voice_id"), "voice_id"),
    )


def voice_routes(state: GatewayState) -> list[BaseRoute]:
    """Routes of the voices API over ``state.voices``."""

    async def entries(key_id: str) -> list[VoiceEntry]:
        if isinstance(state.voices, VoiceLibrary):
            return await state.voices.list(key_id)
        entries = [VoiceEntry(v.voice_id, v.description) for v in state.engine.voices()]
        if not any(e.voice_id == "default" for e in entries):
            entries.insert(0, VoiceEntry("default", "the engine's default voice"))
        return entries

    async def list_voices(request: Request) -> Response:
        try:
            key_id = authenticate(request, state)
            listed = await entries(key_id)
        except ApiError as e:
            return error_response(e, state)
        except VoiceStoreError as e:
            return error_response(store_unavailable(e), state)
        return JSONResponse({"object": "list", "data": [e.as_json() for e in listed]})

    async def create_voice(request: Request) -> Response:
        limits = state.settings.limits
        try:
            key_id = authenticate(request, state)
            audio, text, voice_id = await _read_create_body(request, limits.max_message_bytes)
            if not isinstance(state.voices, VoiceLibrary):
                # A registry without its own clip checks: validate here first.
                await asyncio.to_thread(decode_clip, audio, limits.max_reference_seconds)
            created = await state.voices.create(audio, text, voice_id, key_id)
        except ApiError as e:
            return error_response(e, state)
        except VoiceError as e:
            return error_response(_voice_error(e), state)
        except VoiceStoreError as e:
            return error_response(store_unavailable(e), state)
        except UnsupportedVoiceError as e:
            return error_response(bad_request(str(e), "audio", ErrorCode.VOICE_UNSUPPORTED), state)
        except ValueError as e:
            return error_response(bad_request(str(e), "audio", ErrorCode.VOICE_INVALID), state)
        return JSONResponse(
            {
                "object": "voice",
                "voice_id": created.voice_id,
                "duration_s": round(created.duration_s, 3),
                "frames": created.frames,
                "cached": created.cached,
            },
            status_code=200 if created.cached else 201,
        )

    async def delete_voice(request: Request) -> Response:
        voice_id = request.path_params["voice_id"]
        try:
            key_id = authenticate(request, state)
            if not isinstance(state.voices, VoiceLibrary):
                if state.voices.has(voice_id, key_id):
                    raise VoiceConflictError(f"{voice_id!r} is a built-in voice", "voice_id")
                raise VoiceNotFoundError(f"no voice named {voice_id!r}", "voice_id")
            await state.voices.delete(voice_id, key_id)
        except ApiError as e:
            return error_response(e, state)
        except VoiceError as e:
            return error_response(_voice_error(e), state)
        except VoiceStoreError as e:
            return error_response(store_unavailable(e), state)
        return JSONResponse({"object": "voice.deleted", "voice_id": voice_id, "deleted": True})

    return [
        Route("/v1/voices", list_voices, methods=["GET"]),
        Route("/v1/voices", create_voice, methods=["POST"]),
        Route("/v1/voices/{voice_id}", delete_voice, methods=["DELETE"]),
    ]
