"""Realtime speech protocol, version 1: every event, config model and constant.

One definition shared by the server, the Python SDK, the browser demo (via
the JSON schema) and the benchmark harness. Client events are strict (unknown
fields are errors, so typos surface at once); server events ignore unknown
fields so older clients keep working against newer servers.
"""

from __future__ import annotations

import itertools
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from gateway.protocol import safe_json
from gateway.protocol.config import NATIVE_SAMPLE_RATE as NATIVE_SAMPLE_RATE
from gateway.protocol.config import PRESETS as PRESETS
from gateway.protocol.config import READ_ONLY_SESSION_FIELDS as READ_ONLY_SESSION_FIELDS
from gateway.protocol.config import AudioFormat as AudioFormat
from gateway.protocol.config import Chunking as Chunking
from gateway.protocol.config import ContextId, VoiceId, _Lenient, _Strict
from gateway.protocol.config import FrameMs as FrameMs
from gateway.protocol.config import LatencyPreset as LatencyPreset
from gateway.protocol.config import Limits as Limits
from gateway.protocol.config import OutputConfig as OutputConfig
from gateway.protocol.config import SampleRate as SampleRate
from gateway.protocol.config import Sampling as Sampling
from gateway.protocol.config import SessionConfig as SessionConfig
from gateway.protocol.config import TextBuffering as TextBuffering
from gateway.protocol.config import apply_session_update as apply_session_update
from gateway.protocol.errors import ErrorCode as ErrorCode
from gateway.protocol.errors import ErrorDetail as ErrorDetail
from gateway.protocol.errors import ErrorType as ErrorType
from gateway.protocol.errors import ProtocolError as ProtocolError
from gateway.protocol.errors import invalid_request as invalid_request
from gateway.protocol.errors import validation_error_detail as validation_error_detail
from gateway.protocol.errors import voice_store_unavailable as voice_store_unavailable
from gateway.protocol.frames import FRAME_HEADER as FRAME_HEADER
from gateway.protocol.frames import FRAME_HEADER_BYTES as FRAME_HEADER_BYTES
from gateway.protocol.frames import FRAME_KIND_AUDIO as FRAME_KIND_AUDIO
from gateway.protocol.frames import FRAME_VERSION as FRAME_VERSION
from gateway.protocol.frames import MAX_STREAM as MAX_STREAM
from gateway.protocol.frames import AudioFrame as AudioFrame
from gateway.protocol.frames import pack_audio_frame as pack_audio_frame
from gateway.protocol.frames import unpack_audio_frame as unpack_audio_frame
from gateway.protocol.inline_audio import decode_audio_payload as decode_audio_payload

PROTOCOL_VERSION = 1
SUBPROTOCOL = "speech.v1"

# WebSocket close codes.
CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008
CLOSE_TOO_BIG = 1009
CLOSE_SERVER_ERROR = 1011
CLOSE_TRY_AGAIN = 1013

# --------------------------------------------------------------------------- client events


class _ClientEventBase(_Strict):
    event_id: str | None = Field(default=None, max_length=128)


class SessionUpdate(_ClientEventBase):
    type: Literal["session.update"] = "session.update"
    session: dict[str, Any]


class TextAppend(_ClientEventBase):
    type: Literal["text.append"] = "text.append"
    context_id: ContextId
    text: str


class TextFlush(_ClientEventBase):
    type: Literal["text.flush"] = "text.flush"
    context_id: ContextId
    flush_id: str | None = Field(default=None, min_length=1, max_length=64)


class ContextEnd(_ClientEventBase):
    type: Literal["context.end"] = "context.end"
    context_id: ContextId


class ContextCancel(_ClientEventBase):
    type: Literal["context.cancel"] = "context.cancel"
    context_id: ContextId


class VoiceCreate(_ClientEventBase):
    type: Literal["voice.create"] = "voice.create"
    voice_id: VoiceId | None = None
    audio: str = Field(min_length=1)  # base64 or a data: URI of wav/flac/ogg/mp3
    text: str | None = None


class Ping(_ClientEventBase):
    type: Literal["ping"] = "ping"


ClientEvent = Annotated[
    SessionUpdate | TextAppend | TextFlush | ContextEnd | ContextCancel | VoiceCreate | Ping,
    Field(discriminator="type"),
]
CLIENT_EVENT_ADAPTER: TypeAdapter[ClientEvent] = TypeAdapter(ClientEvent)
CLIENT_EVENT_TYPES = frozenset(
    m.model_fields["type"].default
    for m in (SessionUpdate, TextAppend, TextFlush, ContextEnd, ContextCancel, VoiceCreate, Ping)
)


# --------------------------------------------------------------------------- server events

_event_counter = itertools.count(1)


def new_event_id() -> str:
    return f"evt_{next(_event_counter):x}"


class _ServerEventBase(_Lenient):
    event_id: str = Field(default_factory=new_event_id)
    reply_to: str | None = None


class SessionCreated(_ServerEventBase):
    type: Literal["session.created"] = "session.created"
    session: SessionConfig
    limits: Limits


class SessionUpdated(_ServerEventBase):
    type: Literal["session.updated"] = "session.updated"
    session: SessionConfig


class ContextCreated(_ServerEventBase):
    type: Literal["context.created"] = "context.created"
    context_id: str
    stream: int


class TextFlushed(_ServerEventBase):
    type: Literal["text.flushed"] = "text.flushed"
    context_id: str
    flush_id: str


class SegmentStarted(_ServerEventBase):
    type: Literal["segment.started"] = "segment.started"
    context_id: str
    segment: int
    text: str
    start_ms: int


class SegmentDone(_ServerEventBase):
    type: Literal["segment.done"] = "segment.done"
    context_id: str
    segment: int
    end_ms: int


class ContextMetrics(_Lenient):
    # First-audio stages: ms after the first segment became speakable (null: not reported).
    ttfa_ms: float | None = None
    queue_ms: float | None = None
    prefill_ms: float | None = None
    first_row_ms: float | None = None
    first_frame_row_ms: float | None = None
    first_chunk_ms: float | None = None
    encoded_ms: float | None = None
    rtf: float | None = None
    first_segment_chars: int = 0
    segments: int = 0


class ContextDone(_ServerEventBase):
    type: Literal["context.done"] = "context.done"
    context_id: str
    status: Literal["completed", "failed"] = "completed"
    audio_ms: int
    metrics: ContextMetrics


class ContextCancelled(_ServerEventBase):
    type: Literal["context.cancelled"] = "context.cancelled"
    context_id: str
    audio_ms_sent: int
    text_spoken: str
    text_unspoken: str


class AudioDelta(_ServerEventBase):
    type: Literal["audio.delta"] = "audio.delta"
    context_id: str
    seq: int
    pts_ms: int
    audio: str  # base64 of the same payload a binary frame carries


class VoiceCreated(_ServerEventBase):
    type: Literal["voice.created"] = "voice.created"
    voice_id: str
    duration_s: float
    frames: int
    cached: bool


class Pong(_ServerEventBase):
    type: Literal["pong"] = "pong"


class ErrorEvent(_ServerEventBase):
    type: Literal["error"] = "error"
    error: ErrorDetail


ServerEvent = Annotated[
    SessionCreated
    | SessionUpdated
    | ContextCreated
    | TextFlushed
    | SegmentStarted
    | SegmentDone
    | ContextDone
    | ContextCancelled
    | AudioDelta
    | VoiceCreated
    | Pong
    | ErrorEvent,
    Field(discriminator="type"),
]
SERVER_EVENT_ADAPTER: TypeAdapter[ServerEvent] = TypeAdapter(ServerEvent)


# --------------------------------------------------------------------------- parsing


def parse_client_event(data: str | bytes) -> ClientEvent:
    """Parse one JSON text frame; raise ``ProtocolError`` with the error to send.

    Depth and text validity are checked before validation (``gateway.safe_json``),
    so nothing a client sends reaches an engine or a serializer unchecked.
    """
    try:
        raw = safe_json.loads(data)
    except safe_json.JsonRejected as e:
        code = ErrorCode.INVALID_VALUE if e.param else ErrorCode.INVALID_JSON
        raise ProtocolError(invalid_request(code, str(e), param=e.param)) from e
    except ValueError as e:
        raise ProtocolError(
            invalid_request(ErrorCode.INVALID_JSON, f"message is not valid JSON: {e}")
        ) from e
    if not isinstance(raw, dict):
        raise ProtocolError(
            invalid_request(ErrorCode.INVALID_EVENT, "an event must be a JSON object")
        )
    # Echoed as reply_to even when invalid, but only as a bounded prefix.
    event_id = safe_json.echo(raw["event_id"]) if isinstance(raw.get("event_id"), str) else None
    try:
        return CLIENT_EVENT_ADAPTER.validate_python(raw)
    except ValidationError as e:
        raise ProtocolError(validation_error_detail(e, reply_to=event_id, skip_tag=True)) from e


def parse_server_event(data: str | bytes) -> ServerEvent:
    """Parse one server JSON frame (SDK side); raises ``ValidationError`` / ``ValueError``."""
    return SERVER_EVENT_ADAPTER.validate_json(data)


def dump_event(event: BaseModel) -> str:
    return event.model_dump_json()
