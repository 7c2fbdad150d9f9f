"""A context's inbox, and one segment's engine audio pulled ahead of its encoding.

The engine makes a segment's audio faster than the gateway encodes and sends
it under load: encoding waits its turn in the shared pool, behind listeners
closer to running dry. A :class:`SegmentPull` reads the engine's chunks into
its own queue as they come, so the request ends when the engine is done with
it, and the context's next segment can go to the engine then, not when the
last of this one's audio has been encoded.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

from realtime_engine.engines.base import SegmentTimings

T = TypeVar("T")


class Inbox(Generic[T]):
    """An unbounded FIFO for one reader that can look at what waits behind its head."""

    def __init__(self) -> None:
        self._items: deque[T] = deque()
        self._ready = asyncio.Event()

    def put_nowait(self, item: T) -> None:
        self._items.append(item)
        self._ready.set()

    async def get(self) -> T:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        return self._items.popleft()

    def get_nowait(self) -> T:
        return self._items.popleft()

    def empty(self) -> bool:
        return not self._items

    def waiting(self) -> tuple[T, ...]:
        """The items not taken yet, oldest first."""
        return tuple(self._items)


class PullEnd:
    """The engine has no more audio for this segment."""


PULL_END = PullEnd()


@dataclass
class SegmentPull:
    """One segment's engine request, read ahead: chunks (float32 PCM), then
    :data:`PULL_END` or the exception that ended it."""

    index: int
    request_id: str
    timings: SegmentTimings = field(default_factory=SegmentTimings)
    chunks: asyncio.Queue[np.ndarray | PullEnd | BaseException] = field(
        default_factory=asyncio.Queue
    )
    task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    async def stop(self) -> None:
        """Cancel the reading (its own cleanup aborts the engine request) and wait."""
        task = self.task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
