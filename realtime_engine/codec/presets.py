"""Named streaming-codec chunkings (measured in docs/presets.md).

``first_chunk_frames`` small for early audio, ``chunk_frames`` large for
efficiency, ``left_context_frames`` / ``right_holdback_frames`` the codec
context on each side of the emitted frames (exact at >= 10 each).
"""

from __future__ import annotations

from realtime_engine.codec.errors import InvalidChunkingError
from realtime_engine.engines.base import ChunkingParams

# Frames of the delay pattern: raw frame t needs row t + DELAY_ROWS.
DELAY_ROWS = 7
# The codec's receptive field, in frames on each side.
RECEPTIVE_FIELD_FRAMES = 10
FRAMES_PER_SECOND = 25

PRESETS: dict[str, ChunkingParams] = {
    # First audio after 1 frame + 2 holdback; small edge error.
    "latency": ChunkingParams(
        first_chunk_frames=1, chunk_frames=10, left_context_frames=10, right_holdback_frames=2
    ),
    "balanced": ChunkingParams(
        first_chunk_frames=2, chunk_frames=15, left_context_frames=12, right_holdback_frames=4
    ),
    # Holdback covers the receptive field: identical to whole decoding.
    "exact": ChunkingParams(
        first_chunk_frames=4, chunk_frames=25, left_context_frames=12, right_holdback_frames=10
    ),
}
DEFAULT_PRESET = "balanced"


def validate_chunking(params: ChunkingParams) -> ChunkingParams:
    if params.first_chunk_frames < 1 or params.chunk_frames < 1:
        raise InvalidChunkingError(
            f"first_chunk_frames and chunk_frames must be >= 1; got {params}"
        )
    if params.left_context_frames < 0 or params.right_holdback_frames < 0:
        raise InvalidChunkingError(f"context and holdback must be >= 0; got {params}")
    return params


def get_preset(name: str) -> ChunkingParams:
    try:
        return PRESETS[name]
    except KeyError as e:
        raise InvalidChunkingError(
            f"unknown latency preset {name!r}; choose one of {sorted(PRESETS)}"
        ) from e


def is_exact(params: ChunkingParams) -> bool:
    """Chunked output equals whole-utterance decoding."""
    return (
        params.left_context_frames >= RECEPTIVE_FIELD_FRAMES
        and params.right_holdback_frames >= RECEPTIVE_FIELD_FRAMES
    )


def first_chunk_rows(params: ChunkingParams) -> int:
    """Talker rows needed before the first chunk can be decoded."""
    return DELAY_ROWS + params.first_chunk_frames + params.right_holdback_frames
