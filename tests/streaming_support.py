"""Helpers shared by the StreamingDecoder tests: the tiny codec's
utterances, whole-utterance references and chunking strategies."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

from realtime_engine.codec.decoder import CodecDecoder, load_codec_decoder
from realtime_engine.codec.delay import apply_delay
from realtime_engine.codec.layout import CodecDims, random_codec_state_dict
from realtime_engine.codec.streaming import StreamingDecoder, rows_to_frames
from realtime_engine.format import BOC, EOC, ChunkingParams

HOP = 960
EXACT = 1e-6  # float64 codec, float32 chunks


def random_tiny_codec() -> CodecDecoder:
    """The tiny codec's decoder with random weights (seed 0), float32 on the CPU."""
    dims = CodecDims.tiny()
    sd = random_codec_state_dict(dims, torch.Generator().manual_seed(0), include_encoder=False)
    return load_codec_decoder(sd)


def stream(decoder: StreamingDecoder, rows: np.ndarray, finish: bool = True) -> np.ndarray:
    chunks = [c for row in rows for c in decoder.feed(row)]
    if finish:
        chunks += decoder.finish()
    return np.concatenate(chunks) if chunks else np.zeros(0, np.float32)


def whole(codec: CodecDecoder, rows: np.ndarray, stop_at_eoc: bool = True) -> np.ndarray:
    frames = rows_to_frames(rows, stop_at_eoc)
    if frames.shape[1] == 0:
        return np.zeros(0, np.float32)
    with torch.inference_mode():
        latent = codec.acoustic_input(torch.from_numpy(frames[None]))
        return codec.acoustic_decoder(latent)[0, 0].float().numpy()


def peak_error(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape
    if a.size == 0:
        return 0.0
    return float(np.abs(a - b).max()) / max(float(np.abs(b).max()), 1e-12)


def utterance_rows(frames: int, seed: int, padding: float = 0.0) -> np.ndarray:
    """Rows the talker would emit for ``frames`` raw frames; ``padding`` is
    the share of cells (codebooks 1-7) replaced by stray BOC/EOC."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 1024, size=(frames, 8))
    if padding:
        stray = rng.random((frames, 8)) < padding
        stray[:, 0] = False
        raw[stray] = rng.choice([BOC, EOC, -1], size=int(stray.sum()))
    return apply_delay(raw)


# None (no ramp), exactly 1 (constant first-size chunks), or a random ratio.
chunk_growth = st.one_of(st.none(), st.just(1.0), st.floats(1.0, 4.0))
exact_chunking = st.builds(
    ChunkingParams,
    first_chunk_frames=st.integers(1, 6),
    chunk_frames=st.integers(1, 12),
    left_context_frames=st.integers(0, 14),  # no longer matters: the state has it all
    right_holdback_frames=st.integers(10, 13),
    chunk_growth=chunk_growth,
)
any_chunking = st.builds(
    ChunkingParams,
    first_chunk_frames=st.integers(1, 6),
    chunk_frames=st.integers(1, 12),
    left_context_frames=st.integers(0, 14),
    right_holdback_frames=st.integers(0, 13),
    chunk_growth=chunk_growth,
)
