"""Binary audio frames of protocol v1 (server to client).

Re-exported by ``gateway.protocol``; import from there. The header codec
itself is ``gateway.protocol.frame_header``, one implementation for the
server, the SDK and the bench.
"""

from __future__ import annotations

from gateway.protocol.frame_header import (
    FRAME_VERSION,
    HEADER_SIZE,
    KIND_AUDIO,
    AudioFrame,
    pack_frame,
    parse_frame,
)
from gateway.protocol.frame_header import HEADER_STRUCT as FRAME_HEADER

FRAME_KIND_AUDIO = KIND_AUDIO
FRAME_HEADER_BYTES = HEADER_SIZE  # 12
MAX_STREAM = 0xFFFF

__all__ = [
    "FRAME_HEADER",
    "FRAME_HEADER_BYTES",
    "FRAME_KIND_AUDIO",
    "FRAME_VERSION",
    "MAX_STREAM",
    "AudioFrame",
    "pack_audio_frame",
    "unpack_audio_frame",
]


def pack_audio_frame(stream: int, seq: int, pts_ms: int, payload: bytes) -> bytes:
    return pack_frame(stream, seq, pts_ms, payload)


def unpack_audio_frame(data: bytes) -> AudioFrame:
    """Parse a server binary frame; raise ``ValueError`` for anything but a v1 audio frame."""
    return parse_frame(data)
