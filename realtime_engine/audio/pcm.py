"""Sample conversions: float32 <-> s16 and G.711 mu-law.

Float to s16 scales by 32768 and clips, the convention of FFmpeg's sample
converter, so our PCM and the containers muxed through PyAV agree bit for bit.
The mu-law coder is the classic G.711 one (Sun's reference ``g711.c``). Its
decoder is identical to FFmpeg's ``pcm_mulaw``; the encoders differ only for
inputs right at a segment edge, where both choices are within one step.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float32]
Int16Array = npt.NDArray[np.int16]
UInt8Array = npt.NDArray[np.uint8]

_ULAW_BIAS = 0x84
_ULAW_CLIP_14BIT = 8159
# Upper ends of the eight mu-law segments in the 14-bit domain.
_ULAW_SEGMENT_ENDS = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF], np.int32)


def as_mono_float32(pcm: npt.ArrayLike) -> FloatArray:
    """A 1-D float32 view of ``pcm``; rejects multi-channel or non-float input."""
    arr = np.asarray(pcm)
    if arr.ndim != 1:
        raise ValueError(f"expected mono PCM as a 1-D array, got shape {arr.shape}")
    if arr.dtype.kind != "f":
        # Integer samples would need a scale (s16? s32?); refuse rather than guess.
        raise ValueError(f"expected float PCM in [-1, 1], got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.float32)


def float_to_s16(pcm: FloatArray) -> Int16Array:
    """Scale by 32768, round half to even, clip; NaN becomes 0.

    Written as in-place ufuncs on one float32 buffer: this runs for every
    audio frame of every stream, and ``nan_to_num``/``clip`` add several
    temporaries and Python-level dispatch per call.
    """
    with np.errstate(over="ignore"):  # out-of-range input saturates below
        scaled = np.multiply(pcm, np.float32(32768.0), dtype=np.float32)
    np.rint(scaled, out=scaled)
    np.maximum(scaled, -32768.0, out=scaled)  # keeps NaN
    np.minimum(scaled, 32767.0, out=scaled)
    np.copyto(scaled, 0.0, where=np.isnan(scaled))
    return scaled.astype(np.int16)


def s16_to_float(samples: Int16Array) -> FloatArray:
    return (samples.astype(np.float32) / 32768.0).astype(np.float32)


def s16_to_mulaw(samples: Int16Array) -> UInt8Array:
    value = samples.astype(np.int32) >> 2  # 14-bit domain, arithmetic shift like C
    negative = value < 0
    magnitude = np.minimum(np.where(negative, -value, value), _ULAW_CLIP_14BIT)
    magnitude = magnitude + (_ULAW_BIAS >> 2)
    segment = np.searchsorted(_ULAW_SEGMENT_ENDS, magnitude, side="left").astype(np.int32)
    code = (segment << 4) | ((magnitude >> (segment + 1)) & 0x0F)
    # Past the last segment the reference coder saturates to the largest code.
    code = np.where(segment >= len(_ULAW_SEGMENT_ENDS), 0x7F, code)
    mask = np.where(negative, 0x7F, 0xFF)
    return (code ^ mask).astype(np.uint8)


def mulaw_to_s16(codes: UInt8Array) -> Int16Array:
    inverted = (~codes.astype(np.int32)) & 0xFF
    t = (((inverted & 0x0F) << 3) + _ULAW_BIAS) << ((inverted & 0x70) >> 4)
    return np.where(inverted & 0x80, _ULAW_BIAS - t, t - _ULAW_BIAS).astype(np.int16)


def float_to_mulaw(pcm: FloatArray) -> UInt8Array:
    return s16_to_mulaw(float_to_s16(pcm))
