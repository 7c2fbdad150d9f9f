"""Types shared by every talker runner (reference PyTorch, vLLM plugin).

A runner turns a prompt into a stream of delay-patterned code rows, one row of
``NUM_CODEBOOKS`` codes per decode step, and knows nothing about audio formats
or WebSockets.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from realtime_engine.format import BOC as BOC
from realtime_engine.format import CODEBOOK_VOCAB as CODEBOOK_VOCAB
from realtime_engine.format import EOC as EOC
from realtime_engine.format import NUM_CODEBOOKS as NUM_CODEBOOKS
from realtime_engine.model.prompts import TalkerPrompt as TalkerPrompt


@dataclass(frozen=True)
class TalkerSampling:
    """Per-request sampling parameters (defaults from the Higgs v3 release)."""

    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 0.95
    ras_window: int = 7
    ras_max_repeat: int = 2
    seed: int | None = None


@dataclass
class TalkerTimings:
    """Stamps a runner fills for one request when it can (``time.perf_counter`` s)."""

    prefilled: float | None = None  # the prompt is processed; decoding starts next


@dataclass(frozen=True)
class TalkerRequest:
    request_id: str
    prompt: TalkerPrompt
    sampling: TalkerSampling = field(default_factory=TalkerSampling)
    max_new_tokens: int = 2048
    # Stop after exactly this many rows regardless of EOC (benchmarks with
    # random weights, which never emit EOC on their own).
    fixed_rows: int | None = None
    # Written by the runner (its own thread) before the request's first row is posted.
    timings: TalkerTimings | None = field(default=None, compare=False, repr=False)


class TalkerError(RuntimeError):
    """A request failed inside the talker; raised from the row iterator."""


class TalkerRunner(Protocol):
    """Continuous-batching talker: requests join and leave between steps."""

    def submit(self, request: TalkerRequest) -> AsyncIterator[np.ndarray]:
        """Start ``request``; iterate its code rows (int64 arrays of shape [8])."""
        ...

    async def abort(self, request_id: str) -> None:
        """Stop ``request_id`` within one step and free its slot (no-op if unknown)."""
        ...

    async def close(self) -> None: ...
