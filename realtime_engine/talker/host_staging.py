"""Small integer arrays from the host to the device, through one pinned ring.

The codec's host side sends a few index arrays to the device on every step
(slots, table offsets, chunk bounds). ``tensor.pin_memory()`` per array costs
an allocation from PyTorch's pinned-memory cache, which walks the events of
every block in use: at 256 streams that was 3.8% of the engine core's busy
thread (docs/bench/RESULTS.md, section 19). Here the arrays are written into
blocks of one buffer pinned once, copied without a wait, and a block is
reused only after the copy out of it completed (its event; by then long done,
since the ring holds many steps' worth of blocks).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

BLOCK_INTS = 4096  # one step's largest array at 256 slots is 9 × 256
BLOCKS = 128


class HostToDevice:
    """``send(values)``: int64 ``values`` (any shape) as a tensor on ``device``,
    copied without a wait on the current stream (on CPU, a copy of them)."""

    def __init__(
        self,
        device: torch.device,
        *,
        block_ints: int = BLOCK_INTS,
        blocks: int = BLOCKS,
        ring: bool | None = None,
    ) -> None:
        """``ring``: stage through the ring (default: on CUDA; on CPU, where
        the copy out of a block is done when it returns, for tests)."""
        self.device = device
        self._cuda = device.type == "cuda"
        self._ring = self._cuda if ring is None else ring
        self._block = block_ints
        self._blocks = blocks
        self._next = 0
        self._copied: list[torch.cuda.Event | None] = [None] * blocks
        size = blocks * block_ints if self._ring else 0
        self._host = torch.empty(size, dtype=torch.int64, pin_memory=self._cuda and self._ring)
        self._host_np = self._host.numpy()

    def send(self, values: Sequence[object] | np.ndarray) -> torch.Tensor:
        array = np.ascontiguousarray(values, dtype=np.int64)
        if not self._ring or array.size > self._block:  # too big: never at the engine's sizes
            host = torch.from_numpy(array.copy())
            if self._cuda:
                host = host.pin_memory()
            return host.to(self.device, non_blocking=True)
        i = self._next
        self._next = (i + 1) % self._blocks
        copied = self._copied[i]
        if copied is not None:
            copied.synchronize()  # the copy out of this block, a ring ago
        lo = i * self._block
        self._host_np[lo : lo + array.size] = array.ravel()
        staged = self._host[lo : lo + array.size].view(array.shape)
        if not self._cuda:
            return staged.clone()
        out = staged.to(self.device, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        self._copied[i] = event
        return out
