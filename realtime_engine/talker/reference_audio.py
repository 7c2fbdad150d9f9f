"""The reference runner's codec side: rows stay on the runner's device, PCM comes out.

Runs on the runner's thread, in its CUDA context: every step's rows are
written into a per-slot device table, :class:`SlotCodec` steps the frames
they complete through the streaming codec, batched over the slots, and cuts
the chunks that became due (no CUDA graphs here: the runner is the
reference, not the fast path).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from realtime_engine.codec.decoder import CodecDecoder
from realtime_engine.codec.errors import InvalidChunkingError
from realtime_engine.codec.presets import validate_chunking
from realtime_engine.format import DEFAULT_CODEC_KERNELS, ChunkingParams
from realtime_engine.talker.slot_codec import SlotCodec
from realtime_engine.talker.types import (
    MAX_RETURNED_ROWS,
    NUM_CODEBOOKS,
    PcmChunk,
    TalkerError,
    TalkerRequest,
)

_INITIAL_ROWS = 256


class ReferenceAudio:
    def __init__(
        self,
        codec: CodecDecoder,
        slots: int,
        device: torch.device,
        *,
        max_batch: int = 64,
        kernels: str = DEFAULT_CODEC_KERNELS,
    ) -> None:
        self.codec = SlotCodec(codec, slots=slots, max_batch=max_batch, kernels=kernels)
        self.device = device
        self._table = torch.zeros(
            slots, _INITIAL_ROWS, NUM_CODEBOOKS, dtype=torch.int16, device=device
        )
        self._return_rows: set[str] = set()  # requests that get their rows back at the end

    @staticmethod
    def check(chunking: ChunkingParams) -> None:
        try:
            validate_chunking(chunking)
        except InvalidChunkingError as e:
            raise TalkerError(f"invalid chunking: {e}") from e

    def open(
        self, key: str, slot: int, chunking: ChunkingParams, *, return_rows: bool = False
    ) -> None:
        self.codec.open(key, slot, 0, chunking)
        if return_rows:
            self._return_rows.add(key)

    def close(self, key: str) -> None:
        self.codec.detach(key)
        self._return_rows.discard(key)

    def _rows_of(self, key: str, final: bool) -> np.ndarray | None:
        stream = self.codec.get(key)
        if not final or key not in self._return_rows or stream is None:
            return None
        n = min(stream.rows, MAX_RETURNED_ROWS)
        return self._table[stream.slot, :n].cpu().numpy().astype(np.int64)

    def write(self, slots: Sequence[int], rows_before: Sequence[int], rows: torch.Tensor) -> None:
        """Row ``rows_before[i]`` of the request in ``slots[i]`` is ``rows[i]``."""
        if not slots:
            return
        need = max(rows_before) + 1
        if need > self._table.shape[1]:
            grown = torch.zeros(
                self._table.shape[0],
                max(need, 2 * self._table.shape[1]),
                NUM_CODEBOOKS,
                dtype=self._table.dtype,
                device=self.device,
            )
            grown[:, : self._table.shape[1]] = self._table
            self._table = grown
        index = torch.tensor([list(slots), list(rows_before)], device=self.device)
        self._table[index[0], index[1]] = rows.to(device=self.device, dtype=torch.int16)

    def row(self, request: TalkerRequest, rows: int, final: bool, now: float) -> None:
        """Row ``rows - 1`` of ``request`` is in the table: stamp its stage, tell the codec."""
        timings = request.timings
        if timings is not None:
            if rows == 1:
                timings.first_row = now
            if rows == NUM_CODEBOOKS:  # codebook 7 of frame 0 arrives here
                timings.first_frame_row = now
        self.codec.advance(request.request_id, rows, final)

    def decode_due(
        self, now: float | None = None
    ) -> tuple[list[tuple[str, PcmChunk]], list[tuple[str, Exception]]]:
        """Chunks now due, per request key, in order; and the keys whose decode failed.
        ``now``: the time, for early chunks to listeners running dry (:meth:`SlotCodec.due`)."""
        chunks: list[tuple[str, PcmChunk]] = []
        failed: list[tuple[str, Exception]] = []
        try:
            self.codec.feed(self._table, now=now)
        except Exception as e:  # a codec failure fails its requests, not the talker
            failed.extend((key, e) for key in self.codec.active())
            for key in self.codec.active():
                self.codec.detach(key)
            return chunks, failed
        plans = self.codec.due(now)
        hop = self.codec.hop
        for batch in self.codec.batches(plans):
            try:
                with self.codec.on_codec_stream():
                    pcm = self.codec.decode(batch).cpu().numpy()
            except Exception as e:
                failed.extend((plan.key, e) for plan in batch)
                continue
            for i, plan in enumerate(batch):
                pcm_i = pcm[i, : plan.emit * hop].copy()
                rows = self._rows_of(plan.key, plan.final)
                chunks.append((plan.key, PcmChunk(plan.first_frame, pcm_i, plan.final, rows)))
        for plan in plans:
            if plan.emit == 0:
                empty = np.zeros(0, dtype=np.float32)
                rows = self._rows_of(plan.key, True)
                chunks.append((plan.key, PcmChunk(plan.first_frame, empty, True, rows)))
        return chunks, failed
