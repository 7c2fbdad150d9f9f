"""Codec decoding beside the talker, from the code rows it keeps on the device.

The talker writes each request's delay-patterned rows into a device table
``[slots, positions, 8]`` (row ``r`` of a request at position ``base + r``).
:class:`SlotCodec` decides on the host, from row counts alone, which requests
have a chunk due (the chunk schedule of each request's
:class:`~realtime_engine.engines.base.ChunkingParams`, as in
:class:`~realtime_engine.codec.streaming.StreamingDecoder`), then gathers the
windows straight from the table and decodes them batched, on the device:
no code row reaches the host, and nothing here reads a device value back.

Window policy (the streaming decoder's): a chunk emits frames
``[emitted, target)`` from the window ``[emitted - L, target + H)``, clipped to
the frames that exist; ``H = 0`` for the final chunk. Raw frame ``t``,
codebook ``c`` sits in row ``t + c``. Windows whose chunk starts at least the
codec's receptive field into them are left-padded to one width (the padding
only reaches frames that are trimmed away); windows at an utterance's start
are batched with windows of their own width. Every batch is a fixed shape
``(n, width, emitted samples)``, which is what a CUDA graph per bucket needs.

This is the one place that knows how decoding is done: a stateful streaming
codec can replace :meth:`SlotCodec.decode` and the window planning without
the talkers noticing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from realtime_engine.codec.decoder import CodecDecoder
from realtime_engine.codec.presets import (
    RECEPTIVE_FIELD_FRAMES,
    next_chunk_frames,
    validate_chunking,
)
from realtime_engine.format import DELAY_ROWS, ChunkingParams

CODEBOOK_SIZE = 1024


@dataclass
class SlotStream:
    """One request's decoding progress (host only; survives a change of slot)."""

    key: str
    slot: int
    base: int  # table position of the request's row 0
    chunking: ChunkingParams
    rows: int = 0  # rows known to be written in the table
    final: bool = False  # no rows follow
    emitted: int = 0  # frames already planned into chunks
    ended: bool = False  # the final chunk is planned
    stamps: dict[str, float] = field(default_factory=dict)
    # Rows at which the next chunk is due (kept so that a step with nothing due
    # costs a comparison per request, not a plan).
    next_rows: int = 0

    def __post_init__(self) -> None:
        self.next_rows = self.rows_for_next_chunk()

    def rows_for_next_chunk(self) -> int:
        p = self.chunking
        need = next_chunk_frames(p, self.emitted)
        return self.emitted + need + p.right_holdback_frames + DELAY_ROWS


@dataclass(frozen=True)
class ChunkPlan:
    """One chunk: decode frames ``[start, start + width)``, keep ``emit`` after ``trim``."""

    key: str
    slot: int
    base: int
    start: int
    trim: int
    emit: int
    final: bool
    holdback: int = 0  # frames decoded after the chunk as its right context

    @property
    def width(self) -> int:
        return self.trim + self.emit + self.holdback

    @property
    def first_frame(self) -> int:
        """The raw frame the chunk's audio starts at."""
        return self.start + self.trim


@dataclass(frozen=True)
class CodecBatch:
    """Plans gathered into one fixed-shape codec input (device tensors)."""

    plans: list[ChunkPlan]
    codes: torch.Tensor  # [n, Q, width] int64
    offsets: torch.Tensor  # [n] first kept sample of each window
    emit_samples: int  # samples kept per window (the longest chunk of the batch)


class SlotCodec:
    """Per-request streaming state and batched decoding from the talker's row table."""

    def __init__(self, codec: CodecDecoder, *, max_batch: int = 64) -> None:
        self.codec = codec
        self.max_batch = max(1, max_batch)
        self.hop = codec.hop
        self.num_codebooks = codec.dims.num_quantizers
        self.device = codec.fc2.weight.device
        self._streams: dict[str, SlotStream] = {}
        self._ready: set[str] = set()  # streams that may have a chunk due

    # -- per-request state -------------------------------------------------------

    def open(self, key: str, slot: int, base: int, chunking: ChunkingParams) -> SlotStream:
        """Start decoding request ``key`` (fresh state; any old state of ``key`` goes)."""
        stream = SlotStream(key, slot, base, validate_chunking(chunking))
        self._streams[key] = stream
        return stream

    def get(self, key: str) -> SlotStream | None:
        return self._streams.get(key)

    def detach(self, key: str) -> SlotStream | None:
        """Forget ``key`` (finished, aborted, or preempted: the caller may keep the
        state and :meth:`attach` it again); its state, or None once it has ended."""
        stream = self._streams.pop(key, None)
        self._ready.discard(key)
        return None if stream is None or stream.ended else stream

    def attach(self, stream: SlotStream, slot: int) -> None:
        """Resume a detached stream, possibly in another slot."""
        stream.slot = slot
        self._streams[stream.key] = stream
        if stream.final or stream.rows >= stream.next_rows:
            self._ready.add(stream.key)

    def advance(self, key: str, rows: int, final: bool = False) -> None:
        """``rows`` rows of ``key`` are in the table; ``final``: no more will come."""
        stream = self._streams.get(key)
        if stream is None or stream.ended:
            return
        if rows > stream.rows:
            stream.rows = rows
        if final:
            stream.final = True
        if stream.final or stream.rows >= stream.next_rows:
            self._ready.add(key)

    # -- planning ----------------------------------------------------------------

    def due(self) -> list[ChunkPlan]:
        """Every chunk now due, at most one per request; a final chunk may be empty
        (it only tells the consumer that the audio ended)."""
        plans = []
        for key in sorted(self._ready):  # sorted: the same batches every time
            stream = self._streams[key]
            plan = self._plan(stream)
            if plan is not None:
                plans.append(plan)
            stream.next_rows = stream.rows_for_next_chunk()
        self._ready.clear()
        return plans

    def _plan(self, s: SlotStream) -> ChunkPlan | None:
        if s.ended:
            return None
        p = s.chunking
        available = max(0, s.rows - DELAY_ROWS)
        holdback = 0 if s.final else p.right_holdback_frames
        target = available - holdback
        pending = target - s.emitted
        if not s.final and (pending <= 0 or pending < next_chunk_frames(p, s.emitted)):
            return None
        if s.final:
            s.ended = True
            if pending <= 0:
                return ChunkPlan(s.key, s.slot, s.base, s.emitted, 0, 0, True)
        start = max(0, s.emitted - p.left_context_frames)
        plan = ChunkPlan(
            s.key, s.slot, s.base, start, s.emitted - start, pending, s.final, holdback
        )
        s.emitted = target
        return plan

    # -- decoding ------------------------------------------------------------------

    def gather(self, plans: list[ChunkPlan], table: torch.Tensor) -> list[CodecBatch]:
        """Group ``plans`` into batches and gather their codes from ``table``
        (``[slots, positions, Q]``). Reads the table on the current stream, so
        a later write to it (a slot's next request) cannot race the decode."""
        work = [p for p in plans if p.emit > 0]
        groups: dict[object, list[ChunkPlan]] = {}
        for plan in work:
            # Windows with enough left context share one padded width.
            key = "padded" if plan.trim >= RECEPTIVE_FIELD_FRAMES else plan.width
            groups.setdefault(key, []).append(plan)
        batches = []
        for group in groups.values():
            for lo in range(0, len(group), self.max_batch):
                batches.append(self._gather(group[lo : lo + self.max_batch], table))
        return batches

    def _gather(self, plans: list[ChunkPlan], table: torch.Tensor) -> CodecBatch:
        width = max(p.width for p in plans)
        emit = max(p.emit for p in plans)
        pads = [width - p.width for p in plans]
        host = torch.tensor(
            [
                [p.slot for p in plans],
                [p.base + p.start - pad for p, pad in zip(plans, pads, strict=True)],
                pads,
                [(pad + p.trim) * self.hop for p, pad in zip(plans, pads, strict=True)],
            ],
            dtype=torch.int64,
        )
        if table.device.type == "cuda":
            host = host.pin_memory()
        meta = host.to(table.device, non_blocking=True)
        slot, first, pad, offsets = meta[0], meta[1], meta[2], meta[3]
        t = torch.arange(width, device=table.device)
        c = torch.arange(self.num_codebooks, device=table.device)
        # frame t, codebook c of a window is row (first + t) + c of its slot
        pos = (first[:, None, None] + t[None, :, None] + c[None, None, :]).clamp(
            0, table.shape[1] - 1
        )
        codes = table[slot[:, None, None], pos, c[None, None, :]].long()
        real = (t[None, :] >= pad[:, None])[:, :, None] & (codes < CODEBOOK_SIZE) & (codes >= 0)
        codes = torch.where(real, codes, 0).transpose(1, 2).contiguous()
        return CodecBatch(plans, codes.to(self.device), offsets.to(self.device), emit * self.hop)

    def decode(self, batch: CodecBatch) -> torch.Tensor:
        """PCM ``[n, emit_samples]`` float32 on the codec's device; row ``i`` holds
        ``plans[i].emit * hop`` valid samples (the rest is padding)."""
        pcm = self.codec.decode_valid(batch.codes)[:, 0]
        index = batch.offsets[:, None] + torch.arange(batch.emit_samples, device=pcm.device)
        return torch.gather(pcm, 1, index.clamp(max=pcm.shape[1] - 1))
