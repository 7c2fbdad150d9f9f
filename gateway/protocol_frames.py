"""Binary audio frames of protocol v1 (server to client).

Re-exported by ``gateway.protocol``; import from there.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

FRAME_VERSION = 1
FRAME_KIND_AUDIO = 1
FRAME_HEADER = struct.Struct(">BBHII")  # version, kind, stream, seq, pts_ms
FRAME_HEADER_BYTES = FRAME_HEADER.size  # 12
MAX_STREAM = 0xFFFF


@dataclass(frozen=True, slots=True)
class AudioFrame:
    stream: int
    seq: int
    pts_ms: int
    payload: bytes


def pack_audio_frame(stream: int, seq: int, pts_ms: int, payload: bytes) -> bytes:
    return FRAME_HEADER.pack(FRAME_VERSION, FRAME_KIND_AUDIO, stream, seq, pts_ms) + payload


def unpack_audio_frame(data: bytes) -> AudioFrame:
    """Parse a server binary frame; raise ``ValueError`` for anything but a v1 audio frame."""
    if len(data) < FRAME_HEADER_BYTES:
        raise ValueError(f"binary frame of {len(data)} bytes is shorter than the header")
    version, kind, stream, seq, pts_ms = FRAME_HEADER.unpack_from(data)
    if version != FRAME_VERSION or kind != FRAME_KIND_AUDIO:
        raise ValueError(f"unsupported frame version {version} kind {kind}")
    return AudioFrame(stream, seq, pts_ms, bytes(data[FRAME_HEADER_BYTES:]))
