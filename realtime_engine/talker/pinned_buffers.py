"""Pinned host buffers for device-to-host copies, each with its own event, reused.

Every engine step copies its status to the host, and every batch of chunks
its PCM. Pinning a fresh host tensor and making a fresh event for each costs
the engine's thread about 30 and 20 µs on an H200 host
(``python -m bench.gpu.audio_host --breakdown``, docs/bench/RESULTS.md
section 25). Here a buffer and its event are made once and handed out again
after their user gives them back: by then the copy into the buffer has
completed (its event was seen complete) and nothing reads it any more.

A buffer that is never given back is simply dropped; a new one replaces it
when needed. Taking and giving back are safe from two threads (the engine's
takes, the sender gives back): the free lists are deques.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

# The smallest buffer made (elements): small requests share one size class.
_MIN_ELEMENTS = 1 << 10


@dataclass(eq=False)
class PinnedBuffer:
    """``memory``: flat pinned host memory; ``event``: recorded after the copy
    into it (None off CUDA)."""

    memory: torch.Tensor
    event: torch.cuda.Event | None

    def view(self, shape: tuple[int, ...]) -> torch.Tensor:
        """The first ``prod(shape)`` elements, shaped."""
        n = 1
        for size in shape:
            n *= size
        return self.memory[:n].view(shape)


class PinnedBuffers:
    """Buffers in power-of-two size classes per dtype (pinned on CUDA)."""

    def __init__(self, *, cuda: bool) -> None:
        self._cuda = cuda
        self._free: dict[tuple[torch.dtype, int], deque[PinnedBuffer]] = {}
        self.made = 0  # buffers made so far (each pins memory once)

    def take(self, elements: int, dtype: torch.dtype) -> PinnedBuffer:
        """A buffer of at least ``elements`` of ``dtype``, the caller's until it
        gives it back."""
        size = max(_MIN_ELEMENTS, 1 << max(elements - 1, 0).bit_length())
        free = self._free.get((dtype, size))
        if free:
            try:
                return free.pop()
            except IndexError:  # taken meanwhile by another thread
                pass
        self.made += 1
        memory = torch.empty(size, dtype=dtype, pin_memory=self._cuda)
        return PinnedBuffer(memory, torch.cuda.Event() if self._cuda else None)

    def give_back(self, buffer: PinnedBuffer) -> None:
        """``buffer`` is read and its copies are complete: it may be taken again."""
        key = (buffer.memory.dtype, buffer.memory.numel())
        self._free.setdefault(key, deque()).append(buffer)
