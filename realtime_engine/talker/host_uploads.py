"""Small integer arrays from the host to the device, through one reused pinned ring.

The codec path uploads a few index arrays every engine step (the frame
gather's table offsets, the chunks' slots and sample positions, the slots to
reset). Pinning a fresh host tensor for each costs the engine's thread about
40-80 µs on an H200 host (``python -m bench.gpu.audio_host --breakdown``):
the caching host allocator records and queries an event per block. Here the
values are written into a pinned ring allocated once, and copied from there
with a non-blocking copy on the current stream.

A slice of the ring must not be written again before the copies that read it
ran. The ring is cut into parts used in turn; when the writer leaves a part,
an event is recorded on every stream that copied from it, and the writer
waits for those events before it writes into that part again, a whole lap
later (by then long complete, so the wait costs a query).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from realtime_engine.talker.stream_switch import device_index

# Elements (int64) in the ring and the parts it is cut into. An engine step at
# 256 streams uploads about 2,400 values: a lap is about 50 steps.
RING_ELEMENTS = 1 << 17
RING_PARTS = 4


class HostUploads:
    """Uploads of int64 arrays to ``device``.

    ``ring``: go through the ring (default: on CUDA; on the CPU it is plain
    memory and each upload a copy, which tests the ring's bookkeeping)."""

    def __init__(
        self,
        device: torch.device,
        elements: int = RING_ELEMENTS,
        parts: int = RING_PARTS,
        *,
        ring: bool | None = None,
    ) -> None:
        if parts < 2 or elements < parts:
            raise ValueError("need at least two parts of at least one element")
        self.device = device
        self._cuda = device.type == "cuda"
        self._index = device_index(device) if self._cuda else -1
        self._part_len = elements // parts
        self._parts = parts
        self._part = 0  # the part being written
        self._at = 0  # next free element in it
        self.laps = 0  # times the writer came back to the first part
        # streams that copied from the current part; events guarding each part
        self._readers: dict[torch.cuda.Stream, None] = {}
        self._guards: list[list[torch.cuda.Event]] = [[] for _ in range(parts)]
        # the ring, and a numpy view of it to write into
        self._ring: tuple[torch.Tensor, np.ndarray] | None = None
        if self._cuda if ring is None else ring:
            memory = torch.empty(self._part_len * parts, dtype=torch.int64, pin_memory=self._cuda)
            self._ring = (memory, memory.numpy())

    def upload(self, values: Sequence[object] | np.ndarray) -> torch.Tensor:
        """``values`` as an int64 tensor on the device, shape kept; on CUDA the
        copy is enqueued on the current stream and the host never waits for it."""
        array = np.asarray(values, dtype=np.int64)
        n = array.size
        if self._ring is None or n > self._part_len:
            if self._cuda:  # larger than a part: pinned (a copy) for this call alone
                return torch.from_numpy(array).pin_memory().to(self.device, non_blocking=True)
            return torch.from_numpy(array.copy()).to(self.device)  # never the caller's memory
        if self._at + n > self._part_len:
            self._next_part()
        memory, writable = self._ring
        start = self._part * self._part_len + self._at
        writable[start : start + n] = array.ravel()
        self._at += n
        host = memory[start : start + n].view(array.shape)
        if not self._cuda:
            return host.clone()
        self._readers[torch.cuda.current_stream(self._index)] = None
        return host.to(self.device, non_blocking=True)

    def _next_part(self) -> None:
        """Leave the current part (guarded by an event on each stream that read it)
        and make the next one writable (its guards from the last lap complete)."""
        guards = []
        for stream in self._readers:
            event = torch.cuda.Event()
            event.record(stream)
            guards.append(event)
        self._guards[self._part] = guards
        self._readers = {}
        self._part = (self._part + 1) % self._parts
        self.laps += self._part == 0
        self._at = 0
        for event in self._guards[self._part]:
            event.synchronize()
        self._guards[self._part] = []
