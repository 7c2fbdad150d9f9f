"""First chunks cut ahead of their rows' statuses (small batches, on a GPU).

A step's status (valid, done, row index per batch row) reaches the host a
step or two after the host launched the step: while the batch is small, the
host runs ahead of the device. Waiting for the status that makes a request's
first chunk due costs about 4 ms between that row's sampling and its PCM on
the host (docs/bench/RESULTS.md section 22: the watcher wakes, plans, and
launches the codec step and the edge one operator call at a time).

Instead, when the statuses still on their way would make the first chunk
due *if* each carries the request's next row, the host assumes they do: it
counts the rows as written and queues the codec step, the cut and the copy
on the device right behind the sampler. One status decides whether the
assumption held: the last one assumed, whose row must be valid and carry the
expected index (row indices only advance on valid rows, and no valid row
follows a done one). The sender drops a chunk whose assumption failed, and
the engine's thread rewinds the request's decoding to what its confirmed
rows allow; its codec state is rebuilt from the table.

Only requests with a confirmed row are assumed: their prefill is complete,
so every later step of theirs writes a row until the one that is done.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AssumedRows:
    """A request's rows counted before their statuses landed, and its decoding
    state before that (what a failed assumption rewinds to)."""

    host: torch.Tensor  # the deciding status, ``[B, 3]``: valid, done, row index
    batch_row: int  # the request's row in that status
    index: int  # the row index it must carry
    rows: int
    fed: int
    emitted: int
    next_rows: int
    first_planned_at: float | None

    def held(self) -> bool:
        """Whether the deciding status confirms the assumption (read it once it
        is on the host)."""
        valid, _, index = self.host[self.batch_row].tolist()
        return bool(valid) and index == self.index


def refutes(valid: bool, done: bool) -> bool:
    """Whether a status of the request that lands before the deciding one rules
    the assumption out: a row that is not valid, or one that ends the audio."""
    return not valid or done
