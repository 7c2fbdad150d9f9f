"""Named streaming-codec chunkings (measured in docs/presets.md).

``first_chunk_frames`` small for early audio, ``chunk_frames`` large for
fewer, larger pieces of audio, ``right_holdback_frames`` the frames of right
context a chunk waits for (exact at >= 10, the codec's receptive field;
shorter holdbacks decode the chunk's right edge speculatively). The
stateful codec always has the whole left context, so
``left_context_frames`` no longer changes the audio; it stays in the
parameters for compatibility.

Between the first chunk and ``chunk_frames`` the sizes ramp up geometrically
(``chunk_growth``): a chunk is never longer than what the talker, running at
``chunk_growth`` times real time, can generate while the client plays the
audio it already holds. With F first frames and S frames already emitted,
the next chunk takes n/g frame durations to generate at g times real time,
and the client still holds S - (S - F)/g frames, so

    n <= F + (g - 1) * S,

which makes consecutive sizes grow by the ratio g (2, 4, 8, ... for F = 2,
g = 2). At exactly real time (g = 1) no schedule can grow without a stall:
the buffer stays at F frames forever.
"""

from __future__ import annotations

import math

from realtime_engine.codec.errors import InvalidChunkingError
from realtime_engine.format import DEFAULT_PRESET as DEFAULT_PRESET
from realtime_engine.format import (
    MAX_CHUNK_FRAMES,
    MAX_FIRST_CHUNK_FRAMES,
    MAX_HOLDBACK_FRAMES,
    ChunkingParams,
    rows_for_frames,
)
from realtime_engine.format import PRESETS as PRESETS

# The codec's receptive field, in frames on each side.
RECEPTIVE_FIELD_FRAMES = 10


def validate_chunking(params: ChunkingParams) -> ChunkingParams:
    if params.first_chunk_frames < 1 or params.chunk_frames < 1:
        raise InvalidChunkingError(
            f"first_chunk_frames and chunk_frames must be >= 1; got {params}"
        )
    if params.left_context_frames < 0 or params.right_holdback_frames < 0:
        raise InvalidChunkingError(f"context and holdback must be >= 0; got {params}")
    if (
        params.first_chunk_frames > MAX_FIRST_CHUNK_FRAMES
        or params.chunk_frames > MAX_CHUNK_FRAMES
        or params.right_holdback_frames > MAX_HOLDBACK_FRAMES
    ):
        raise InvalidChunkingError(
            f"at most {MAX_FIRST_CHUNK_FRAMES} first-chunk frames, {MAX_CHUNK_FRAMES} chunk "
            f"frames and {MAX_HOLDBACK_FRAMES} holdback frames; got {params}"
        )
    growth = params.chunk_growth
    if growth is not None and not (math.isfinite(growth) and growth >= 1.0):
        raise InvalidChunkingError(
            f"chunk_growth must be None or a finite ratio >= 1; got {params}"
        )
    return params


def next_chunk_frames(params: ChunkingParams, emitted_frames: int) -> int:
    """Size of the chunk that follows ``emitted_frames`` frames of audio."""
    if emitted_frames <= 0:
        return params.first_chunk_frames
    if params.chunk_growth is None:
        return params.chunk_frames
    # floor: rounding up could exceed what the client's buffer covers.
    ramp = math.floor(params.first_chunk_frames + (params.chunk_growth - 1.0) * emitted_frames)
    return min(params.chunk_frames, ramp)


def chunk_schedule(params: ChunkingParams, max_chunks: int = 64) -> list[int]:
    """Chunk sizes from the first chunk up to the first steady-size one
    (the final chunk of an utterance may be shorter, or longer by its
    released holdback)."""
    sizes: list[int] = []
    emitted = 0
    while len(sizes) < max_chunks:
        size = next_chunk_frames(params, emitted)
        sizes.append(size)
        emitted += size
        if emitted > 0 and size >= params.chunk_frames:
            break
    return sizes


def get_preset(name: str) -> ChunkingParams:
    try:
        return PRESETS[name]
    except KeyError as e:
        raise InvalidChunkingError(
            f"unknown latency preset {name!r}; choose one of {sorted(PRESETS)}"
        ) from e


def is_exact(params: ChunkingParams) -> bool:
    """Chunked output equals whole-utterance decoding. The stateful codec
    needs only the holdback; the window decoder still serving beside the
    talker (``talker.slot_codec``) also needs the left context."""
    return (
        params.left_context_frames >= RECEPTIVE_FIELD_FRAMES
        and params.right_holdback_frames >= RECEPTIVE_FIELD_FRAMES
    )


def first_chunk_rows(params: ChunkingParams) -> int:
    """Talker rows needed before the first chunk can be decoded."""
    return rows_for_frames(params.first_chunk_frames + params.right_holdback_frames)
