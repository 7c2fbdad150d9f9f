"""Talker test support: a fake for failure tests (the real model behind the
runner's interface), and collecting a runner's rows."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np
import torch


async def collect(it: AsyncIterator[np.ndarray], limit: int | None = None) -> np.ndarray:
    """A runner's rows ``[n, 8]``, stopping after ``limit`` when given."""
    rows = []
    async for row in it:
        rows.append(row)
        if limit is not None and len(rows) == limit:
            break
    return np.stack(rows) if rows else np.zeros((0, 8), dtype=np.int64)


class FailingTalker:
    """The real tiny talker, failing its decode steps after ``fail_after`` of them.

    Prefill always works; decode step ``fail_after + 1`` onwards raises
    ``RuntimeError(message)``. Raise ``fail_after`` to let it recover.
    """

    def __init__(self, model: Any, fail_after: int = 0, message: str = "device fell over") -> None:
        self.inner = model
        self.fail_after = fail_after
        self.message = message
        self.decode_calls = 0

    @property
    def device(self) -> torch.device:
        return torch.device(self.inner.device)

    def new_cache(self, initial_capacity: int = 256) -> Any:
        return self.inner.new_cache(initial_capacity)

    def embed_prompt(
        self, token_ids: torch.Tensor, ref_rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.inner.embed_prompt(token_ids, ref_rows)

    def embed_audio_rows(self, rows: torch.Tensor) -> torch.Tensor:
        return self.inner.embed_audio_rows(rows)

    def forward_embeds(self, embeds: torch.Tensor, caches: Sequence[Any]) -> torch.Tensor:
        if embeds.shape[1] == 1:
            self.decode_calls += 1
            if self.decode_calls > self.fail_after:
                raise RuntimeError(self.message)
        return self.inner.forward_embeds(embeds, caches)

    def audio_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.inner.audio_logits(hidden)
