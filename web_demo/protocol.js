// Generated from gateway/protocol/ by `python -m gateway.protocol.export web_demo/protocol.js`.
// Do not edit: regenerate it when the protocol changes.

export const PROTOCOL_VERSION = 1;

export const SUBPROTOCOL = "speech.v1";

export const CLIENT_EVENTS = Object.freeze({
  "SESSION_UPDATE": "session.update",
  "TEXT_APPEND": "text.append",
  "TEXT_FLUSH": "text.flush",
  "CONTEXT_END": "context.end",
  "CONTEXT_CANCEL": "context.cancel",
  "VOICE_CREATE": "voice.create",
  "PING": "ping"
});

export const SERVER_EVENTS = Object.freeze({
  "SESSION_CREATED": "session.created",
  "SESSION_UPDATED": "session.updated",
  "CONTEXT_CREATED": "context.created",
  "TEXT_FLUSHED": "text.flushed",
  "SEGMENT_STARTED": "segment.started",
  "SEGMENT_DONE": "segment.done",
  "CONTEXT_DONE": "context.done",
  "CONTEXT_CANCELLED": "context.cancelled",
  "AUDIO_DELTA": "audio.delta",
  "VOICE_CREATED": "voice.created",
  "PONG": "pong",
  "ERROR": "error"
});

export const AUDIO_FORMATS = Object.freeze([
  "opus",
  "pcm16",
  "pcm_f32",
  "mulaw"
]);

export const SAMPLE_RATES = Object.freeze([
  8000,
  16000,
  24000,
  48000
]);

export const FRAME_MS = Object.freeze([
  10,
  20,
  40,
  60
]);

export const NATIVE_SAMPLE_RATE = 24000;

export const LATENCY_PRESETS = Object.freeze([
  "latency",
  "balanced",
  "exact",
  "custom"
]);

export const AUDIO_TRANSPORTS = Object.freeze([
  "binary",
  "base64"
]);

export const TEXT_BUFFERING_MODES = Object.freeze([
  "auto",
  "manual"
]);

export const PRESETS = Object.freeze({
  "latency": {
    "first_chunk_frames": 1,
    "chunk_frames": 10,
    "left_context_frames": 10,
    "right_holdback_frames": 2,
    "chunk_growth": 1.5
  },
  "balanced": {
    "first_chunk_frames": 2,
    "chunk_frames": 15,
    "left_context_frames": 12,
    "right_holdback_frames": 4,
    "chunk_growth": 1.5
  },
  "exact": {
    "first_chunk_frames": 4,
    "chunk_frames": 25,
    "left_context_frames": 12,
    "right_holdback_frames": 10,
    "chunk_growth": 1.5
  }
});

export const SESSION_DEFAULTS = Object.freeze({
  "id": "",
  "model": "",
  "voice": "default",
  "output": {
    "format": "opus",
    "sample_rate": 24000,
    "frame_ms": 20
  },
  "audio_transport": "binary",
  "text_buffering": {
    "mode": "auto",
    "max_buffer_delay_ms": 250
  },
  "latency_preset": "exact",
  "chunking": {
    "first_chunk_frames": 4,
    "chunk_frames": 25,
    "left_context_frames": 12,
    "right_holdback_frames": 10,
    "chunk_growth": 1.5
  },
  "sampling": {
    "temperature": 1.0,
    "top_k": 50,
    "top_p": 0.95,
    "seed": null
  },
  "max_audio_seconds": 120.0
});

export const READ_ONLY_SESSION_FIELDS = Object.freeze([
  "id",
  "model"
]);

export const LIMIT_DEFAULTS = Object.freeze({
  "max_sessions": 1000,
  "max_contexts": 8,
  "max_text_chars_per_context": 20000,
  "max_message_bytes": 16777216,
  "idle_timeout_s": 120.0,
  "max_reference_seconds": 30.0,
  "max_lead_s": 10.0
});

export const FIELD_LIMITS = Object.freeze({
  "event_id": {
    "maxLength": 128
  },
  "context_id": {
    "minLength": 1,
    "maxLength": 64
  },
  "flush_id": {
    "minLength": 1,
    "maxLength": 64
  },
  "voice_id": {
    "minLength": 1,
    "maxLength": 64,
    "pattern": "^[A-Za-z0-9_.:-]+$"
  },
  "audio": {
    "minLength": 1
  },
  "sampling.temperature": {
    "minimum": 0.0,
    "maximum": 2.0
  },
  "sampling.top_k": {
    "minimum": 0,
    "maximum": 1024
  },
  "sampling.top_p": {
    "maximum": 1.0,
    "exclusiveMinimum": 0.0
  },
  "sampling.seed": {
    "minimum": 0,
    "maximum": 9223372036854775807
  },
  "text_buffering.max_buffer_delay_ms": {
    "minimum": 0,
    "maximum": 10000
  },
  "chunking.first_chunk_frames": {
    "minimum": 1,
    "maximum": 100
  },
  "chunking.chunk_frames": {
    "minimum": 1,
    "maximum": 200
  },
  "chunking.left_context_frames": {
    "minimum": 0,
    "maximum": 64
  },
  "chunking.right_holdback_frames": {
    "minimum": 0,
    "maximum": 64
  },
  "chunking.chunk_growth": {
    "minimum": 1.0,
    "maximum": 8.0
  },
  "max_audio_seconds": {
    "maximum": 3600.0,
    "exclusiveMinimum": 0.0
  }
});

export const CONTEXT_METRICS = Object.freeze([
  "ttfa_ms",
  "queue_ms",
  "prefill_ms",
  "first_row_ms",
  "first_frame_row_ms",
  "first_chunk_ms",
  "encoded_ms",
  "rtf",
  "first_segment_chars",
  "segments"
]);

export const ERROR_TYPES = Object.freeze([
  "invalid_request_error",
  "authentication_error",
  "rate_limit_error",
  "server_error",
  "engine_overloaded"
]);

export const ERROR_CODES = Object.freeze({
  "INVALID_JSON": "invalid_json",
  "INVALID_EVENT": "invalid_event",
  "MISSING_TYPE": "missing_type",
  "UNKNOWN_EVENT_TYPE": "unknown_event_type",
  "INVALID_VALUE": "invalid_value",
  "READ_ONLY_FIELD": "read_only_field",
  "MESSAGE_TOO_BIG": "message_too_big",
  "BINARY_NOT_ALLOWED": "binary_not_allowed",
  "CONTEXT_NOT_FOUND": "context_not_found",
  "CONTEXT_ENDED": "context_ended",
  "TOO_MANY_CONTEXTS": "too_many_contexts",
  "TEXT_TOO_LONG": "text_too_long",
  "VOICE_NOT_FOUND": "voice_not_found",
  "VOICE_INVALID": "voice_invalid",
  "VOICE_UNSUPPORTED": "voice_unsupported",
  "AUTH_REQUIRED": "auth_required",
  "AUTH_INVALID": "auth_invalid",
  "TOKEN_EXPIRED": "token_expired",
  "SESSION_LIMIT": "session_limit",
  "KEY_SESSION_LIMIT": "key_session_limit",
  "KEY_CONTEXT_LIMIT": "key_context_limit",
  "ENGINE_ERROR": "engine_error",
  "ENGINE_OVERLOADED": "engine_overloaded",
  "ENGINE_UNAVAILABLE": "engine_unavailable",
  "VOICE_STORE_UNAVAILABLE": "voice_store_unavailable",
  "SERVER_SHUTTING_DOWN": "server_shutting_down",
  "INTERNAL_ERROR": "internal_error",
  "IDLE_TIMEOUT": "idle_timeout"
});

export const CLOSE_CODES = Object.freeze({
  "NORMAL": 1000,
  "GOING_AWAY": 1001,
  "POLICY": 1008,
  "TOO_BIG": 1009,
  "SERVER_ERROR": 1011,
  "TRY_AGAIN": 1013
});

export const FRAME_HEADER = Object.freeze({
  "bytes": 12,
  "version": 1,
  "kind_audio": 1,
  "big_endian": true,
  "fields": [
    {
      "name": "version",
      "offset": 0,
      "bytes": 1
    },
    {
      "name": "kind",
      "offset": 1,
      "bytes": 1
    },
    {
      "name": "stream",
      "offset": 2,
      "bytes": 2
    },
    {
      "name": "seq",
      "offset": 4,
      "bytes": 4
    },
    {
      "name": "pts_ms",
      "offset": 8,
      "bytes": 4
    }
  ]
});
