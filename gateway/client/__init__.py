"""Python SDK for the realtime speech gateway.

    async with connect("ws://localhost:8000", api_key=KEY) as conn:
        await conn.session.update(voice="default", output={"format": "pcm16"})
        ctx = conn.context("c1")
        await ctx.append("Hello there.")
        await ctx.end()
        async for chunk in ctx.audio():
            play(chunk.pcm)

For scripts: ``wav_bytes = speak("Hello", url="ws://localhost:8000")``.
"""

from gateway.client.audio import (
    MULAW_TO_PCM16,
    OpusDecoder,
    PcmDecoder,
    make_decoder,
    mulaw_to_float,
    opus_packet_duration_ms,
    payload_duration_ms,
    pcm16_to_float,
    read_wav,
    to_wav,
)
from gateway.client.connection import Connection
from gateway.client.context import AudioChunk, Context, Utterance
from gateway.client.errors import (
    AuthenticationError,
    ClientError,
    ConnectionClosedError,
    ContextCancelledError,
    EngineOverloadedError,
    HandshakeError,
    InternalServerError,
    InvalidRequestError,
    MessageTooBigError,
    PolicyViolationError,
    ProtocolViolationError,
    RateLimitError,
    ServerClosedError,
    ServerError,
    TryAgainLaterError,
)
from gateway.client.handshake import connect, realtime_url
from gateway.client.sync import speak, speak_async

__all__ = [
    "MULAW_TO_PCM16",
    "AudioChunk",
    "AuthenticationError",
    "ClientError",
    "Connection",
    "ConnectionClosedError",
    "Context",
    "ContextCancelledError",
    "EngineOverloadedError",
    "HandshakeError",
    "InternalServerError",
    "InvalidRequestError",
    "MessageTooBigError",
    "OpusDecoder",
    "PcmDecoder",
    "PolicyViolationError",
    "ProtocolViolationError",
    "RateLimitError",
    "ServerClosedError",
    "ServerError",
    "TryAgainLaterError",
    "Utterance",
    "connect",
    "make_decoder",
    "mulaw_to_float",
    "opus_packet_duration_ms",
    "payload_duration_ms",
    "pcm16_to_float",
    "read_wav",
    "realtime_url",
    "speak",
    "speak_async",
    "to_wav",
]
