"""Types shared by every talker runner (reference PyTorch, vLLM plugin).

A runner turns a prompt into PCM chunks decoded beside the talker
(:meth:`TalkerRunner.speak`: the code rows stay where they are sampled), or,
for tools and tests, into the delay-patterned code rows themselves, one row of
``NUM_CODEBOOKS`` codes per decode step (:meth:`TalkerRunner.submit`). It
knows nothing about audio formats or WebSockets.
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
from realtime_engine.format import ChunkingParams
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
    first_row: float | None = None  # the first code row exists
    first_frame_row: float | None = None  # the row that completes frame 0 exists


# Most rows a request gets back with ``return_rows`` (its first rows; 40 s of audio).
MAX_RETURNED_ROWS = 1024


@dataclass(frozen=True)
class PcmChunk:
    """Audio of consecutive codec frames, decoded where the talker runs.

    ``start_frame``: the codec frame (960 samples at 24 kHz) the chunk starts
    at; ``final``: the last chunk of the request (it may be empty).
    """

    start_frame: int
    pcm: np.ndarray  # float32 mono
    final: bool = False
    # On the final chunk of a request that asked for them (``return_rows``): the
    # request's delay-patterned code rows ``[n, 8]`` (a context's voice anchor).
    rows: np.ndarray | None = None


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
    # ``speak``: send the request's code rows back with its final chunk.
    return_rows: bool = False


class TalkerError(RuntimeError):
    """A request failed inside the talker; raised from the row iterator."""


class TalkerRunner(Protocol):
    """Continuous-batching talker: requests join and leave between steps."""

    def submit(self, request: TalkerRequest) -> AsyncIterator[np.ndarray]:
        """Start ``request``; iterate its code rows (int64 arrays of shape [8])."""
        ...

    def speak(self, request: TalkerRequest, chunking: ChunkingParams) -> AsyncIterator[PcmChunk]:
        """Start ``request``; iterate its audio, chunked by ``chunking``, ending
        with a ``final`` chunk. Stage stamps go to ``request.timings`` before
        the first chunk is yielded."""
        ...

    async def abort(self, request_id: str) -> None:
        """Stop ``request_id`` within one step and free its slot (no-op if unknown)."""
        ...

    async def close(self) -> None: ...
