"""Cuts a stream of samples into fixed-size frames."""

from __future__ import annotations

import numpy as np

from realtime_engine.audio.pcm import FloatArray


class SampleFramer:
    """Accumulates samples; hands out whole frames of ``frame_samples``."""

    def __init__(self, frame_samples: int) -> None:
        if frame_samples <= 0:
            raise ValueError(f"frame_samples must be positive, got {frame_samples}")
        self.frame_samples = frame_samples
        self._pending: list[FloatArray] = []
        self._pending_len = 0

    @property
    def pending_samples(self) -> int:
        return self._pending_len

    def push(self, pcm: FloatArray) -> list[FloatArray]:
        if pcm.size == 0:
            return []
        self._pending.append(pcm)
        self._pending_len += pcm.size
        if self._pending_len < self.frame_samples:
            return []
        # One pending array (the common case: a chunk longer than a frame) is
        # sliced as it is, without a copy; the leftover is copied so it does
        # not pin the whole chunk until the next push.
        joined = self._pending[0] if len(self._pending) == 1 else np.concatenate(self._pending)
        whole = (joined.size // self.frame_samples) * self.frame_samples
        frames = [joined[i : i + self.frame_samples] for i in range(0, whole, self.frame_samples)]
        rest = joined[whole:].copy()
        self._pending = [rest] if rest.size else []
        self._pending_len = rest.size
        return frames

    def drain(self, pad_to_frame: bool) -> list[FloatArray]:
        """The leftover partial frame (zero-padded to a whole frame if asked)."""
        if self._pending_len == 0:
            return []
        rest = np.concatenate(self._pending)
        self._pending, self._pending_len = [], 0
        if pad_to_frame:
            rest = np.concatenate([rest, np.zeros(self.frame_samples - rest.size, np.float32)])
        return [rest]
