"""MusicGen-style delay pattern used by the Higgs Audio v3 talker.

Codebook ``c`` of frame ``t`` is emitted at row ``t + c``, so a T-frame
utterance of N codebooks becomes ``T + N - 1`` rows. Cells before a
codebook's first frame hold BOC, cells after its last frame hold EOC.

The functions accept numpy arrays or torch tensors and return the same kind.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import torch

from realtime_engine.format import BOC, EOC, NUM_CODEBOOKS

ArrayT = TypeVar("ArrayT", np.ndarray, torch.Tensor)

# Real codes are 0..1023; anything else after reverting is padding or garbage.
_CODE_LIMIT = BOC


class DelayPatternError(ValueError):
    """Codes or rows have a shape the delay pattern cannot handle."""


def _full_like_rows(template: ArrayT, rows: int, cols: int, fill: int) -> ArrayT:
    if isinstance(template, torch.Tensor):
        return torch.full((rows, cols), fill, dtype=template.dtype, device=template.device)
    return np.full((rows, cols), fill, dtype=template.dtype)


def _check_2d(array: np.ndarray | torch.Tensor, what: str) -> tuple[int, int]:
    if array.ndim != 2:
        raise DelayPatternError(
            f"{what} must be 2-D [length, codebooks], got shape {tuple(array.shape)}"
        )
    length, num_codebooks = (int(s) for s in array.shape)
    if num_codebooks < 1:
        raise DelayPatternError(f"{what} must have at least one codebook")
    return length, num_codebooks


def apply_delay(codes: ArrayT) -> ArrayT:
    """Delay ``codes[T, N]`` into ``rows[T + N - 1, N]`` (BOC before, EOC after)."""
    frames, num_codebooks = _check_2d(codes, "codes")
    out = _full_like_rows(codes, frames + num_codebooks - 1, num_codebooks, EOC)
    for c in range(num_codebooks):
        out[:c, c] = BOC
        out[c : c + frames, c] = codes[:, c]
    return out


def revert_delay(rows: ArrayT) -> ArrayT:
    """Undo :func:`apply_delay`: ``rows[L, N]`` → ``codes[L - N + 1, N]``.

    Padding cells are dropped by position, not by value, so the result may
    still hold BOC/EOC where the talker emitted them early; see
    :func:`sanitize_codes`.
    """
    length, num_codebooks = _check_2d(rows, "rows")
    frames = length - num_codebooks + 1
    if frames < 0:
        raise DelayPatternError(
            f"{length} rows cannot hold a delay pattern of {num_codebooks} codebooks "
            f"(need at least {num_codebooks - 1})"
        )
    out = _full_like_rows(rows, frames, num_codebooks, 0)
    for c in range(num_codebooks):
        out[:, c] = rows[c : c + frames, c]
    return out


def sanitize_codes(codes: ArrayT) -> ArrayT:
    """Replace anything outside 0..1023 by 0.

    Never clamp: clamping would turn EOC (1025) into 1023, a valid code that
    the codec would happily decode into noise.
    """
    if isinstance(codes, torch.Tensor):
        valid = (codes >= 0) & (codes < _CODE_LIMIT)
        return torch.where(valid, codes, torch.zeros_like(codes))
    valid_np = (codes >= 0) & (codes < _CODE_LIMIT)
    return np.where(valid_np, codes, 0).astype(codes.dtype, copy=False)


class StreamingReverter:
    """Incremental :func:`revert_delay`: feed rows one by one, get frames.

    Frame ``t`` is complete once row ``t + N - 1`` has arrived, so the first
    frame appears after N rows and every later row completes exactly one
    frame. Feeding every row of a pattern yields exactly the frames of
    ``revert_delay`` on the whole pattern.
    """

    def __init__(self, num_codebooks: int = NUM_CODEBOOKS) -> None:
        if num_codebooks < 1:
            raise DelayPatternError("num_codebooks must be at least 1")
        self.num_codebooks = num_codebooks
        # ring of the last N rows; frame t uses diagonal cells of rows t..t+N-1
        self._pending: list[np.ndarray] = []
        self.rows_seen = 0
        self.frames_emitted = 0

    def feed(self, row: np.ndarray) -> np.ndarray | None:
        """Take one row ``[N]``; return the frame ``[N]`` it completes, if any."""
        row = np.asarray(row)
        if row.shape != (self.num_codebooks,):
            raise DelayPatternError(
                f"row must have shape ({self.num_codebooks},), got {tuple(row.shape)}"
            )
        self._pending.append(row.copy())
        self.rows_seen += 1
        if len(self._pending) < self.num_codebooks:
            return None
        frame = np.array([self._pending[c][c] for c in range(self.num_codebooks)], dtype=row.dtype)
        self._pending.pop(0)
        self.frames_emitted += 1
        return frame
