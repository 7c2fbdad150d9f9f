"""The binary audio frame sent from server to client (protocol version 1).

Layout, 12 bytes of header then the payload::

    byte 0     version = 1
    byte 1     kind: 1 = audio
    bytes 2-3  stream (uint16, big-endian)
    bytes 4-7  seq (uint32, big-endian), per stream, from 0, no gaps
    bytes 8-11 pts_ms (uint32, big-endian), start of the frame on the context timeline
    bytes 12-  payload: one Opus packet, or PCM / mu-law samples
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from realtime_engine.audio.errors import FrameFormatError

FRAME_VERSION = 1
KIND_AUDIO = 1
KNOWN_KINDS = frozenset({KIND_AUDIO})
HEADER_SIZE = 12

HEADER_STRUCT = struct.Struct(">BBHII")
_U16_MAX = 0xFFFF
_U32_MAX = 0xFFFFFFFF


@dataclass(frozen=True)
class AudioFrame:
    stream: int
    seq: int
    pts_ms: int
    payload: bytes
    kind: int = KIND_AUDIO
    version: int = FRAME_VERSION


def _check_uint(name: str, value: int, maximum: int) -> None:
    # bool is an int subclass; a True stream id is a caller bug, not 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise FrameFormatError(f"{name} must be an int, got {type(value).__name__}")
    if not 0 <= value <= maximum:
        raise FrameFormatError(f"{name}={value} is outside 0..{maximum}")


def pack_frame(stream: int, seq: int, pts_ms: int, payload: bytes, kind: int = KIND_AUDIO) -> bytes:
    """Header + payload as one binary WebSocket message."""
    # Runs once per audio frame: the common, valid case is checked in one
    # expression; anything else takes the checks below, which name the problem.
    if (
        type(stream) is int
        and type(seq) is int
        and type(pts_ms) is int
        and type(payload) is bytes
        and kind == KIND_AUDIO
        and 0 <= stream <= _U16_MAX
        and 0 <= seq <= _U32_MAX
        and 0 <= pts_ms <= _U32_MAX
    ):
        return HEADER_STRUCT.pack(FRAME_VERSION, kind, stream, seq, pts_ms) + payload
    _check_uint("stream", stream, _U16_MAX)
    _check_uint("seq", seq, _U32_MAX)
    _check_uint("pts_ms", pts_ms, _U32_MAX)
    if kind not in KNOWN_KINDS:
        raise FrameFormatError(f"unknown frame kind {kind!r}")
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise FrameFormatError(f"payload must be bytes, got {type(payload).__name__}")
    return HEADER_STRUCT.pack(FRAME_VERSION, kind, stream, seq, pts_ms) + bytes(payload)


def parse_frame(data: bytes | bytearray | memoryview) -> AudioFrame:
    """Inverse of :func:`pack_frame`; rejects short, unversioned or unknown frames."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise FrameFormatError(f"frame must be bytes, got {type(data).__name__}")
    raw = bytes(data)
    if len(raw) < HEADER_SIZE:
        raise FrameFormatError(f"frame of {len(raw)} bytes is shorter than the header")
    version, kind, stream, seq, pts_ms = HEADER_STRUCT.unpack_from(raw)
    if version != FRAME_VERSION:
        raise FrameFormatError(f"unsupported frame version {version}")
    if kind not in KNOWN_KINDS:
        raise FrameFormatError(f"unknown frame kind {kind}")
    return AudioFrame(
        stream=stream,
        seq=seq,
        pts_ms=pts_ms,
        payload=raw[HEADER_SIZE:],
        kind=kind,
        version=version,
    )
