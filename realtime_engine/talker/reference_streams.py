"""The reference runner's requests and what it needs from a model (no logic of its own)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from realtime_engine.codec.streaming import HOP
from realtime_engine.talker.sampling import RequestNoise
from realtime_engine.talker.types import PcmChunk, TalkerRequest

if TYPE_CHECKING:
    from realtime_engine.format import ChunkingParams


class TalkerModel(Protocol):
    """What the runner needs from :class:`realtime_engine.model.talker.HiggsTalker`."""

    @property
    def device(self) -> torch.device: ...

    def new_cache(self, initial_capacity: int = 256) -> Any: ...

    def embed_prompt(
        self, token_ids: torch.Tensor, ref_rows: torch.Tensor | None = None
    ) -> torch.Tensor: ...

    def embed_audio_rows(self, rows: torch.Tensor) -> torch.Tensor: ...

    def forward_embeds(self, embeds: torch.Tensor, caches: Any) -> torch.Tensor: ...

    def audio_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class RunnerStats:
    steps: int
    rows: int
    prefills: int
    last_step_s: float
    mean_step_s: float
    last_batch_size: int
    active: int
    waiting: int


class End:
    """Marks the end of a request's rows."""


END = End()


class RunnerStream:
    """A request as the worker sees it; the consumer side lives on ``loop``."""

    def __init__(
        self,
        request: TalkerRequest,
        loop: asyncio.AbstractEventLoop,
        cap: int,
        chunking: ChunkingParams | None = None,
    ) -> None:
        self.request = request
        self.loop = loop
        self.chunking = chunking  # None: the consumer takes code rows
        # Bounded: the worker skips a stream with ``queue_rows`` undelivered rows.
        self.queue: asyncio.Queue[np.ndarray | PcmChunk | End | BaseException] = asyncio.Queue()
        self.cap = cap
        self.undelivered = 0  # rows posted but not yet taken; guarded by the runner lock
        self.slot = -1
        self.cache: Any = None
        self.hidden: torch.Tensor | None = None
        self.noise: RequestNoise | None = None
        self.emitted = 0
        self.closed = False
        self.released = asyncio.Event()  # set on the consumer's loop once the slot is free

    def post(self, item: np.ndarray | PcmChunk | End | BaseException) -> bool:
        """Hand ``item`` to the consumer's loop; False when that loop is gone."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:
            return False
        return True


def queue_weight(item: np.ndarray | PcmChunk) -> int:
    """What an item counts against ``queue_rows``: a row, or a chunk's frames."""
    return max(1, item.pcm.size // HOP) if isinstance(item, PcmChunk) else 1
