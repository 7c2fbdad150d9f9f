"""Codec: RVQ + DAC decoder, strict loaders, the stateful streaming codec and
the per-utterance streaming decoder."""

from realtime_engine.codec.decoder import CodecDecoder, extract_codec_state, load_codec_decoder
from realtime_engine.codec.errors import CodecInputError, InvalidChunkingError, StreamStateError
from realtime_engine.codec.layout import CODEC_PREFIX, CodecDims, random_codec_state_dict
from realtime_engine.codec.presets import (
    PRESETS,
    chunk_schedule,
    first_chunk_rows,
    get_preset,
    is_exact,
    next_chunk_frames,
)
from realtime_engine.codec.stream_core import SavedSlots, StreamingCodec
from realtime_engine.codec.streaming import (
    DecodedJob,
    DecodeJob,
    StreamingDecoder,
    decode_jobs,
    rows_to_frames,
    run_jobs,
)

__all__ = [
    "CODEC_PREFIX",
    "PRESETS",
    "CodecDecoder",
    "CodecDims",
    "CodecInputError",
    "DecodeJob",
    "DecodedJob",
    "InvalidChunkingError",
    "SavedSlots",
    "StreamStateError",
    "StreamingCodec",
    "StreamingDecoder",
    "chunk_schedule",
    "decode_jobs",
    "extract_codec_state",
    "first_chunk_rows",
    "get_preset",
    "is_exact",
    "load_codec_decoder",
    "next_chunk_frames",
    "random_codec_state_dict",
    "rows_to_frames",
    "run_jobs",
]
