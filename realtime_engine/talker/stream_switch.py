"""Make a CUDA stream current for a block, cheaply.

``torch.cuda.stream`` checks devices on every entry (several device-index
lookups and a device comparison, 10-15 µs of the engine's thread); the codec
path switches streams a few times every engine step, always on its own
device. :class:`OnStream` only saves the current stream and sets the new one.
"""

from __future__ import annotations

from typing import Any

import torch


def device_index(device: torch.device) -> int:
    """``device``'s index, the current device's for a bare ``cuda``."""
    return device.index if device.index is not None else torch.cuda.current_device()


class OnStream:
    """``with OnStream(stream, index):`` runs the block with ``stream`` current
    (``stream`` on device ``index``, the current device). Make one per use."""

    __slots__ = ("_index", "_previous", "_stream")

    def __init__(self, stream: torch.cuda.Stream, index: int) -> None:
        self._stream = stream
        self._index = index

    def __enter__(self) -> None:
        # an int index skips torch.device parsing (about 3 µs a call)
        self._previous = torch.cuda.current_stream(self._index)
        torch.cuda.set_stream(self._stream)

    def __exit__(self, *exc: Any) -> None:
        torch.cuda.set_stream(self._previous)
