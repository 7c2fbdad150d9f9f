"""Streaming sample-rate conversion on top of soxr.

soxr's ``HQ`` filter is linear-phase and soxr removes its group delay, so the
output of ``feed``s followed by ``finish`` is aligned with the input and has
``round(n * out_rate / in_rate)`` samples. The price is block latency: soxr
emits output in blocks, so the first samples appear only after a few tens of
milliseconds of input (see docs/audio.md for the measured figures).
"""

from __future__ import annotations

import numpy as np
import soxr

from realtime_engine.audio.pcm import FloatArray

_EMPTY = np.zeros(0, dtype=np.float32)


class StreamingResampler:
    """Mono float32 resampler: ``feed`` chunks of any size, then ``finish`` once."""

    def __init__(self, in_rate: int, out_rate: int, quality: str = "HQ") -> None:
        if in_rate <= 0 or out_rate <= 0:
            raise ValueError(f"sample rates must be positive, got {in_rate} -> {out_rate}")
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._stream = (
            None
            if in_rate == out_rate
            else soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality=quality)
        )
        self._finished = False

    @property
    def passthrough(self) -> bool:
        return self._stream is None

    def feed(self, pcm: FloatArray) -> FloatArray:
        if self._finished:
            raise RuntimeError("resampler already finished")
        if self._stream is None:
            return pcm
        return np.asarray(self._stream.resample_chunk(pcm), dtype=np.float32)

    def finish(self) -> FloatArray:
        if self._finished:
            raise RuntimeError("resampler already finished")
        self._finished = True
        if self._stream is None:
            return _EMPTY
        return np.asarray(self._stream.resample_chunk(_EMPTY, last=True), dtype=np.float32)
