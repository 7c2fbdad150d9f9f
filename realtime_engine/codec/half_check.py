"""A float16 codec checks itself against float32 on the weights it was loaded with.

float16 rounds every activation (about 3e-3 of the peak on the real-size codec
with random weights) and overflows past 65504. Whether the released weights'
activations stay inside that range cannot be known before they are loaded. So
``--codec-precision fp16`` decodes a seeded probe of random codes twice at
start-up, with the float32 weights (IEEE) and with a float16 copy, and keeps
float16 only when the two agree within :data:`FP16_TOLERANCE` of the peak.
Otherwise the codec runs in TF32 and the log says why. Either way the log
states the error measured on these weights.
"""

from __future__ import annotations

import copy
import logging
import math
from dataclasses import dataclass
from typing import Final

import torch

from realtime_engine.codec.decoder import CodecDecoder

logger = logging.getLogger("realtime_engine.codec")

# The largest error, relative to the float32 decode's peak, at which a float16
# codec is kept: about three times the real-size random codec's (RESULTS.md
# section 30). An overflow is inf, NaN or of the order of the peak.
FP16_TOLERANCE: Final = 1e-2
# Two seconds of audio: every layer's receptive field many times over.
PROBE_FRAMES: Final = 50
# What a codec whose float16 copy fails the probe runs in.
FP16_FALLBACK: Final = "tf32"


@dataclass(frozen=True)
class HalfCheck:
    """The probe's result: ``error`` relative to the float32 peak (inf when the
    float16 decode is not finite)."""

    error: float
    tolerance: float

    @property
    def passed(self) -> bool:
        return self.error <= self.tolerance


def probe_codes(codec: CodecDecoder, frames: int = PROBE_FRAMES, seed: int = 0) -> torch.Tensor:
    """Seeded random codes ``[1, Q, frames]`` (the same on every start)."""
    gen = torch.Generator().manual_seed(seed)
    dims = codec.dims
    return torch.randint(0, dims.codebook_size, (1, dims.num_quantizers, frames), generator=gen)


def check_half(
    codec: CodecDecoder, frames: int = PROBE_FRAMES, tolerance: float = FP16_TOLERANCE
) -> HalfCheck:
    """Decodes the probe with ``codec`` (float32 weights, IEEE arithmetic) and
    with a float16 copy of it on the same device; ``codec`` is left as it was."""
    if codec.half_weights:
        raise ValueError("check_half needs the float32 weights: check before casting")
    codes = probe_codes(codec, frames)
    saved = codec.precision
    codec.set_precision("fp32")
    try:
        want = codec.decode(codes).double()
    finally:
        codec.set_precision(saved)
    half = copy.deepcopy(codec).half()
    got = half.decode(codes).double()
    peak = float(want.abs().max())
    error = float((got - want).abs().max()) / peak if peak > 0 else math.inf
    if not math.isfinite(error):
        error = math.inf
    return HalfCheck(error=error, tolerance=tolerance)


def set_checked_precision(
    codec: CodecDecoder,
    precision: str,
    *,
    tolerance: float = FP16_TOLERANCE,
    casts: bool | None = None,
) -> str:
    """:meth:`CodecDecoder.set_precision`, except that ``fp16`` where it casts the
    weights (``casts``; default: on CUDA) is taken only if :func:`check_half`
    passes, and is :data:`FP16_FALLBACK` otherwise. Returns the precision taken."""
    if casts is None:
        casts = codec.device.type == "cuda"
    if precision != "fp16" or not casts:
        codec.set_precision(precision)
        return precision
    check = check_half(codec, tolerance=tolerance)
    if check.passed:
        logger.info(
            "codec: float16 is %.1e of the peak from float32 on these weights (tolerance %.0e)",
            check.error,
            check.tolerance,
        )
        codec.set_precision("fp16")
        return "fp16"
    logger.warning(
        "codec: float16 is %.1e of the peak from float32 on these weights, over the "
        "tolerance of %.0e (an overflow is inf); running in %s instead",
        check.error,
        check.tolerance,
        FP16_FALLBACK,
    )
    codec.set_precision(FP16_FALLBACK)
    return FP16_FALLBACK
