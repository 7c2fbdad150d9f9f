"""A cloned voice as engines take it: reference codec codes and their transcript."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class VoiceReference:
    """A cloned voice: raw codec codes ``[frames, 8]`` (0..1023) and their transcript."""

    codes: np.ndarray
    text: str | None = None

    @property
    def frames(self) -> int:
        return int(self.codes.shape[0])
