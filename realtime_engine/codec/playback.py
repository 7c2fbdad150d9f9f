"""Client playback model for a streamed utterance (sans-I/O).

``chunk_arrivals`` runs a ``StreamingDecoder`` over an utterance whose rows
come out of the talker at a steady rate and returns when each chunk is ready
and how long it is. ``simulate_playback`` plays those chunks the way a
client does: it starts at the first chunk, plays continuously, and when its
buffer runs dry it pauses (an underrun) until the next chunk arrives. Times
are seconds from the talker's first row.

Used by the tests that check the chunk-size ramp and by
``realtime_engine.tools.measure_presets``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from realtime_engine.codec.decoder import load_codec_decoder
from realtime_engine.codec.delay import apply_delay
from realtime_engine.codec.layout import CodecDims, random_codec_state_dict
from realtime_engine.codec.stream_core import StreamingCodec
from realtime_engine.codec.streaming import StreamingDecoder
from realtime_engine.format import FRAMES_PER_SECOND, ChunkingParams

FRAME_S = 1.0 / FRAMES_PER_SECOND  # one codec frame
REAL_TIME_ROWS_PER_S = float(FRAMES_PER_SECOND)  # one row per frame of audio
# Arrival and deadline computed along different float paths may differ by
# rounding; a chunk that arrives within this of its deadline is on time.
ON_TIME_TOLERANCE_S = 1e-9


@dataclass(frozen=True)
class ChunkArrival:
    at_s: float  # when the chunk is ready at the client
    frames: int  # codec frames of audio in it


@dataclass(frozen=True)
class PlaybackReport:
    first_audio_s: float
    audio_s: float
    underruns: int  # pauses after the first chunk started playing
    stall_s: float  # total paused time
    longest_stall_s: float
    # Least audio still queued when a later chunk arrived (0 after a pause);
    # None for a one-chunk utterance.
    min_buffer_s: float | None


@functools.cache
def _planning_codec() -> StreamingCodec:
    """Any codec with the real strides plans the same chunks; chunk_arrivals
    never decodes, so a tiny random one will do."""
    state = random_codec_state_dict(
        CodecDims.tiny(), torch.Generator().manual_seed(0), include_encoder=False
    )
    return StreamingCodec(load_codec_decoder(state), max_slots=1)


def chunk_arrivals(
    params: ChunkingParams,
    frames: int,
    rows_per_s: float,
    decode_s: float = 0.0,
) -> list[ChunkArrival]:
    """Chunks of a ``frames``-frame utterance whose rows are generated at
    ``rows_per_s`` (row ``i`` at ``(i + 1) / rows_per_s``); each chunk is
    ready ``decode_s`` after the row that completes it."""
    if rows_per_s <= 0:
        raise ValueError(f"rows_per_s must be > 0; got {rows_per_s}")
    decoder = StreamingDecoder(_planning_codec(), params)
    rows = apply_delay(np.zeros((frames, decoder.num_codebooks), dtype=np.int64))
    out: list[ChunkArrival] = []
    for i, row in enumerate(rows):
        at = (i + 1) / rows_per_s + decode_s
        out += [ChunkArrival(at, job.emit_frames) for job in decoder.plan_feed(row)]
    end = len(rows) / rows_per_s + decode_s
    out += [ChunkArrival(end, job.emit_frames) for job in decoder.plan_finish()]
    decoder.close()
    return out


def simulate_playback(arrivals: Sequence[ChunkArrival], frame_s: float = FRAME_S) -> PlaybackReport:
    """Play ``arrivals`` (in order) from the first one on, pausing whenever
    the buffer is empty."""
    if not arrivals:
        raise ValueError("no chunks to play")
    first = arrivals[0].at_s
    play_end = first  # when the audio received so far finishes playing
    underruns = 0
    stall = longest = 0.0
    min_buffer: float | None = None
    for index, chunk in enumerate(arrivals):
        if chunk.at_s > play_end + ON_TIME_TOLERANCE_S:
            gap = chunk.at_s - play_end
            underruns += 1
            stall += gap
            longest = max(longest, gap)
            play_end = chunk.at_s
        if index > 0:
            held = max(0.0, play_end - chunk.at_s)
            min_buffer = held if min_buffer is None else min(min_buffer, held)
        play_end += chunk.frames * frame_s
    return PlaybackReport(
        first_audio_s=first,
        audio_s=sum(c.frames for c in arrivals) * frame_s,
        underruns=underruns,
        stall_s=stall,
        longest_stall_s=longest,
        min_buffer_s=min_buffer,
    )
