"""The Higgs Audio v3 code and audio format: every constant the layers share, defined once.

The ground of the package: it imports nothing of the project, so every layer
(codec, model, talker, engines, the gateway's protocol and the SDK) may import
it. The streaming-codec chunking and its named presets live here too, because
the engine runs them and the gateway's protocol offers them by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Literal, get_args

SAMPLE_RATE: Final = 24_000  # Hz, of the codec's PCM
FRAME_SAMPLES: Final = 960  # one codec frame (the codec's hop): 40 ms
FRAMES_PER_SECOND: Final = SAMPLE_RATE // FRAME_SAMPLES  # 25

NUM_CODEBOOKS: Final = 8
CODEBOOK_SIZE: Final = 1024  # real codes are 0..1023
BOC: Final = CODEBOOK_SIZE  # begin-of-codebook (delay padding at the start)
EOC: Final = CODEBOOK_SIZE + 1  # end-of-codebook (delay padding at the end)
CODEBOOK_VOCAB: Final = CODEBOOK_SIZE + 2  # codes + BOC + EOC

# The delay pattern: codebook c of frame t sits in row t + c, so frame t is
# complete at row t + DELAY_ROWS and T frames take T + DELAY_ROWS rows.
DELAY_ROWS: Final = NUM_CODEBOOKS - 1

# Codec arithmetic on CUDA (the CPU always computes fp32): fp32 (IEEE
# convolutions), tf32 (TF32 tensor cores, ~1e-3 of the peak), bf16 (autocast)
# or fp16 (the weights, state and activations in float16, products accumulated
# in float32, the wide convolutions as matrix products: the fastest codec step,
# ~3e-3 of the peak on random weights; docs/presets.md).
# fp16 by default: served with the narrow layers fused and shifted taps (their
# defaults on CUDA), 12% more audio at 256 streams than tf32, a step 1.3 ms
# shorter (docs/bench/RESULTS.md, section 40). At start-up it checks itself
# against float32 on the loaded weights and runs in tf32 past 1e-2 of the peak
# (realtime_engine/codec/half_check.py), so weights it cannot hold fall back.
CODEC_PRECISIONS: Final = ("fp32", "tf32", "bf16", "fp16")
DEFAULT_CODEC_PRECISION: Final = "fp16"

# How the served codec step runs: ``eager`` (PyTorch operators, one CUDA graph
# per batch bucket), ``snake`` (each activation one Triton kernel, CUDA),
# ``compiled`` (the whole step through torch.compile: elementwise passes,
# state gathers and scatters fused; one CUDA graph per bucket whichever) or
# ``auto``, the default: compiled on CUDA, eager on the CPU (where compiling
# costs more than it saves). On an H200 the compiled step served more audio at
# 64-256 streams and sooner first chunks (docs/bench/RESULTS.md, section 20).
CODEC_KERNELS: Final = ("auto", "eager", "snake", "compiled")
DEFAULT_CODEC_KERNELS: Final = "auto"


def resolve_codec_kernels(kernels: str, *, cuda: bool) -> str:
    """What ``auto`` means on this device; other choices as they are."""
    if kernels not in CODEC_KERNELS:
        raise ValueError(f"codec kernels must be one of {CODEC_KERNELS}; got {kernels!r}")
    if kernels != "auto":
        return kernels
    return "compiled" if cuda else "eager"


# The CUDA priority of the codec's streams, against the talker's forward pass
# on the default priority: "high" lets a chunk's codec work take the SMs as
# they free up instead of queueing behind the next step's kernels. "normal" by
# default: on an H200, high left `latency`'s first chunk 12.5-12.7 ms after the
# first full frame row, against 12.4 ms (docs/bench/RESULTS.md, section 17).
CODEC_STREAM_PRIORITIES: Final = ("high", "normal")
DEFAULT_CODEC_STREAM_PRIORITY: Final = "normal"

# How torch.compile builds the compiled codec step: Inductor's ``default``, or
# ``max-autotune-no-cudagraphs`` (Triton templates for the matrix products and
# convolutions, tuned at warm-up, with pointwise prologues such as the
# products' tap gathers fused into them; an experiment, not yet timed). The
# modes that capture CUDA graphs themselves are not offered: the codec captures
# its own, one per batch bucket.
CODEC_COMPILE_MODES: Final = ("default", "max-autotune-no-cudagraphs")
DEFAULT_CODEC_COMPILE_MODE: Final = "default"

# Frames the codec may step per slot in one call: a slot whose next chunk is
# not due yet keeps its newly complete frames until it has this many, then
# steps them together, so its cached state is read and written once for them
# all and the codec makes fewer, longer calls. A chunk that is due (the first
# one included) and the end of a stream never wait: the frames it needs are
# stepped at once, in calls of 1, 2, 4 ... frames. 1: every frame is stepped as
# it completes. A power of two up to MAX_FRAMES_PER_CALL.
MAX_FRAMES_PER_CALL: Final = 8
DEFAULT_CODEC_FRAMES_PER_CALL: Final = 1


def frame_counts(frames_per_call: int) -> tuple[int, ...]:
    """The frames a codec call takes when a slot may batch up to ``frames_per_call``:
    the powers of two up to it (a due chunk's frames go as a sum of them)."""
    if (
        isinstance(frames_per_call, bool)
        or not isinstance(frames_per_call, int)
        or not 1 <= frames_per_call <= MAX_FRAMES_PER_CALL
        or frames_per_call & (frames_per_call - 1)
    ):
        raise ValueError(
            f"frames per codec call must be a power of two from 1 to {MAX_FRAMES_PER_CALL};"
            f" got {frames_per_call!r}"
        )
    return tuple(1 << i for i in range(frames_per_call.bit_length()))


# Bounds of a chunking (the protocol's limits; the engine's per-slot PCM ring
# is sized from them).
MAX_FIRST_CHUNK_FRAMES: Final = 100
MAX_CHUNK_FRAMES: Final = 200
MAX_CONTEXT_FRAMES: Final = 64
MAX_HOLDBACK_FRAMES: Final = 64


def rows_for_frames(frames: int) -> int:
    """Talker rows that carry ``frames`` complete codec frames."""
    return frames + DELAY_ROWS


def rows_for_seconds(seconds: float) -> int:
    """Talker rows that carry ``seconds`` of audio (the last frame completed)."""
    return rows_for_frames(math.ceil(seconds * FRAMES_PER_SECOND))


@dataclass(frozen=True)
class ChunkingParams:
    """Streaming-codec chunking in codec frames (see docs/presets.md)."""

    first_chunk_frames: int
    chunk_frames: int
    left_context_frames: int
    right_holdback_frames: int
    # After the first chunk, chunk sizes grow geometrically by this ratio up to
    # ``chunk_frames`` so the client's buffer grows instead of draining; safe
    # (no underrun) while the talker runs at >= this many times real time.
    # None: jump straight to ``chunk_frames`` (see docs/presets.md).
    chunk_growth: float | None = 1.5


PresetName = Literal["latency", "balanced", "exact"]

PRESETS: Final[dict[str, ChunkingParams]] = {
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
# Exact by default: on one H200 it cost 29 ms more first audio than `balanced`
# (96.6 vs 67.4 ms at one stream) and removes `balanced`'s chunk-edge error (0.26 of
# peak at real size); docs/presets.md has the trade.
DEFAULT_PRESET: Final[PresetName] = "exact"

# The type and the table name the same presets (checked once, at import).
if tuple(PRESETS) != get_args(PresetName):
    raise AssertionError("PresetName and PRESETS disagree")
