"""Binary audio frame header: round trip, byte layout, rejects."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.protocol.frame_header import HEADER_SIZE, pack_frame, parse_frame
from realtime_engine.audio.errors import FrameFormatError

u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)


@given(stream=u16, seq=u32, pts=u32, payload=st.binary(max_size=300))
def test_pack_parse_round_trip(stream: int, seq: int, pts: int, payload: bytes) -> None:
    data = pack_frame(stream, seq, pts, payload)
    assert len(data) == HEADER_SIZE + len(payload)
    frame = parse_frame(data)
    assert (frame.version, frame.kind) == (1, 1)
    assert (frame.stream, frame.seq, frame.pts_ms, frame.payload) == (stream, seq, pts, payload)


def test_byte_layout_is_big_endian() -> None:
    data = pack_frame(0x0102, 0x03040506, 0x0708090A, b"\xff")
    assert data == bytes([1, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0xFF])


def test_parse_accepts_memoryview_and_bytearray() -> None:
    data = pack_frame(3, 4, 5, b"abc")
    assert parse_frame(memoryview(data)) == parse_frame(bytearray(data)) == parse_frame(data)


@pytest.mark.parametrize(
    ("stream", "seq", "pts"),
    [(-1, 0, 0), (0x10000, 0, 0), (0, -1, 0), (0, 1 << 32, 0), (0, 0, -5), (0, 0, 1 << 32)],
)
def test_pack_rejects_out_of_range_fields(stream: int, seq: int, pts: int) -> None:
    with pytest.raises(FrameFormatError):
        pack_frame(stream, seq, pts, b"")


def test_pack_rejects_wrong_types_and_kinds() -> None:
    with pytest.raises(FrameFormatError):
        pack_frame(True, 0, 0, b"")
    with pytest.raises(FrameFormatError):
        pack_frame(0, 1.0, 0, b"")  # type: ignore[arg-type]
    with pytest.raises(FrameFormatError):
        pack_frame(0, 0, 0, "text")  # type: ignore[arg-type]
    with pytest.raises(FrameFormatError):
        pack_frame(0, 0, 0, b"", kind=2)


@given(data=st.binary(max_size=HEADER_SIZE - 1))
def test_parse_rejects_short_frames(data: bytes) -> None:
    with pytest.raises(FrameFormatError):
        parse_frame(data)


@pytest.mark.parametrize(("version", "kind"), [(0, 1), (2, 1), (255, 1), (1, 0), (1, 2)])
def test_parse_rejects_unknown_version_or_kind(version: int, kind: int) -> None:
    data = struct.pack(">BBHII", version, kind, 0, 0, 0) + b"x"
    with pytest.raises(FrameFormatError):
        parse_frame(data)


def test_parse_rejects_non_bytes() -> None:
    with pytest.raises(FrameFormatError):
        parse_frame("not bytes")  # type: ignore[arg-type]
