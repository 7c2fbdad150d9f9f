"""Getting each step's sampled rows off the device and out to the serving process.

On CUDA the sampler must not wait for the GPU: rows are copied with a
non-blocking copy into pinned host memory, an event is recorded, and a
sender thread waits for the event and pushes the rows. On CPU the rows are
already on the host and go out at once. Either way messages leave in step
order, so each request's rows arrive in order.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from realtime_engine.talker.device_watchdog import process_watchdog
from realtime_engine.talker.vllm_protocol import RowHeader, TalkerArgs
from realtime_engine.talker.vllm_rows import RowPusher

logger = logging.getLogger(__name__)

_QUEUE_STEPS = 64


@dataclass(frozen=True)
class StepRows:
    """One step on the device.

    ``rows`` int64 ``[B, N]``; ``valid``, ``done`` bool and ``index`` int64 ``[B]``.
    """

    rows: torch.Tensor
    valid: torch.Tensor
    done: torch.Tensor
    index: torch.Tensor

    def packed(self) -> torch.Tensor:
        cols = [self.valid.long(), self.done.long(), self.index.long()]
        return torch.cat([self.rows.long(), torch.stack(cols, dim=1)], dim=1)


def split_by_endpoint(
    packed: np.ndarray, args_per_row: Sequence[TalkerArgs | None]
) -> dict[str, tuple[list[RowHeader], np.ndarray]]:
    """Group the valid rows of a packed step ``[B, N + 3]`` by destination."""
    n = packed.shape[1] - 3
    groups: dict[str, tuple[list[RowHeader], list[int]]] = {}
    for i, args in enumerate(args_per_row):
        if args is None or not packed[i, n]:
            continue
        headers, picks = groups.setdefault(args.endpoint, ([], []))
        headers.append(
            RowHeader(args.correlation_id, int(packed[i, n + 2]), bool(packed[i, n + 1]))
        )
        picks.append(i)
    return {ep: (headers, packed[picks, :n]) for ep, (headers, picks) in groups.items()}


class RowPublisher:
    def __init__(self, device: torch.device, *, enabled: bool = True) -> None:
        self._enabled = enabled
        self._pusher = RowPusher()
        self._async = device.type == "cuda"
        self._watchdog = process_watchdog() if self._async else None
        self._queue: queue.Queue[
            tuple[torch.cuda.Event, torch.Tensor, list[TalkerArgs | None]] | tuple[str, TalkerArgs]
        ] = queue.Queue(maxsize=_QUEUE_STEPS)
        if self._async:
            threading.Thread(target=self._drain, name="talker-row-publisher", daemon=True).start()

    def publish_packed(
        self, packed: torch.Tensor, args_per_row: Sequence[TalkerArgs | None]
    ) -> None:
        """Send a step already packed as ``[B, N + 3]`` (see :meth:`StepRows.packed`)."""
        if not self._enabled or all(a is None for a in args_per_row):
            return
        args = list(args_per_row)
        if not self._async:
            self._send(packed.numpy(), args)
            return
        host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
        host.copy_(packed, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._queue.put((event, host, args))

    def fail(self, args: TalkerArgs, reason: str) -> None:
        if not self._enabled:
            return
        if self._async:
            self._queue.put((reason, args))
        else:
            self._pusher.push_failure(args.endpoint, args.correlation_id, reason)

    def _send(self, packed: np.ndarray, args: Sequence[TalkerArgs | None]) -> None:
        for endpoint, (headers, rows) in split_by_endpoint(packed, args).items():
            self._pusher.push(endpoint, headers, rows)

    def _drain(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if isinstance(item[0], str):
                    reason, failed = item
                    assert isinstance(failed, TalkerArgs) and isinstance(reason, str)
                    self._pusher.push_failure(failed.endpoint, failed.correlation_id, reason)
                    continue
                event, host, args = item
                assert self._watchdog is not None  # set where there is a queue to drain
                self._watchdog.synchronize(event, "a step's rows")
                self._send(host.numpy(), args)
            except Exception:
                logger.exception("publishing talker rows failed")
