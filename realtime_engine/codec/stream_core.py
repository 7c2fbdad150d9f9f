"""Batched streaming codec: per-slot cached layer state, every sample computed once.

``StreamingCodec(codec, max_slots)`` keeps the causal layers' state of up
to ``max_slots`` streams in one ``[max_slots, elements]`` tensor on the
codec's device, each layer's buffer a ``[max_slots, C, L]`` view of it. A
call steps any set of slots at once: it gathers their state by slot index
(one indexed kernel for every buffer), runs the layers on the new frames
only, packs the new state in the same layout and scatters it back (one
indexed kernel); a reset is one kernel. Shapes depend only on the
batch size and the frames per call, and nothing reads device values back
to the host, so a call can be captured as a CUDA graph per batch size.

Slot ``s``'s output, concatenated over ``step`` calls and ``flush``, is the
whole-utterance decode of the frames it was given, preceded by
:attr:`delay` samples of zeros (the causal layers' delay): drop the first
``delay`` samples of a stream. ``peek`` returns what ``flush`` would,
without changing the state: the right edge of a stream that has not ended,
decoded as if it had (speculative audio for holdbacks under the receptive
field). See docs/streaming-codec.md.

Codes are not range-checked per call (that would synchronise the device):
validate them where they are produced, or with :meth:`check_codes` for
untrusted input.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from realtime_engine.codec.causal import (
    DEFAULT_GEMM_TAPS,
    CausalDac,
    GemmChannels,
    GemmTaps,
    State,
    resolve_gemm_channels,
)
from realtime_engine.codec.decoder import CodecDecoder
from realtime_engine.codec.errors import CodecInputError
from realtime_engine.codec.fused_unit import (
    DEFAULT_FUSED_UNITS,
    FusedUnitsOption,
    resolve_fused_units,
)

Slots = torch.Tensor | Sequence[int]


@dataclass(frozen=True)
class SavedSlots:
    """The state of some slots, detached from the codec (preemption): ``flat``
    ``[n, elements]``, ``buffers`` the layers' views of it."""

    flat: torch.Tensor
    buffers: tuple[torch.Tensor, ...]
    frames_fed: torch.Tensor


class StreamingCodec:
    """Streaming decode of up to ``max_slots`` independent code streams."""

    def __init__(
        self,
        codec: CodecDecoder,
        max_slots: int,
        device: str | torch.device | None = None,
        *,
        fused: bool = False,
        channels_last: bool = False,
        gemm_channels: GemmChannels = "auto",
        fused_units: FusedUnitsOption = DEFAULT_FUSED_UNITS,
        gemm_taps: GemmTaps = DEFAULT_GEMM_TAPS,
    ) -> None:
        """``fused``, ``channels_last``, ``gemm_channels``, ``fused_units``, ``gemm_taps``: see
        :class:`~realtime_engine.codec.causal.CausalDac`; ``"auto"`` (the default)
        chooses ``gemm_channels`` by the weights' type
        (:func:`~realtime_engine.codec.causal.resolve_gemm_channels`) and
        ``fused_units`` by the device
        (:func:`~realtime_engine.codec.fused_unit.resolve_fused_units`)."""
        if max_slots < 1:
            raise ValueError(f"max_slots must be >= 1; got {max_slots}")
        if device is not None and torch.device(device) != codec.device:
            codec = codec.to(device)
        self.codec = codec.eval()
        self.device = codec.device
        # fused activations: one compiled kernel each (CUDA; compiles on first use)
        self.layers = CausalDac(
            codec.acoustic_decoder,
            fused=fused,
            channels_last=channels_last,
            gemm_channels=resolve_gemm_channels(gemm_channels, codec.half_weights),
            fused_units=resolve_fused_units(fused_units, codec.device),
            gemm_taps=gemm_taps,
        )
        self.max_slots = max_slots
        self.hop = codec.hop
        self.num_quantizers = codec.dims.num_quantizers
        self.codebook_size = codec.dims.codebook_size
        self._elements = [spec.channels * spec.length for spec in self.layers.buffers]
        self.flat = torch.zeros(
            max_slots, sum(self._elements), device=self.device, dtype=codec.fc2.weight.dtype
        )
        self.state: State = self._views(self.flat)
        self.frames_fed = torch.zeros(max_slots, dtype=torch.int64, device=self.device)
        self.slots = SlotPool()  # for host-side streams (StreamingDecoder)

    @property
    def delay(self) -> int:
        """Samples of leading silence in every stream (drop them)."""
        return self.layers.delay

    def _index(self, slots: Slots) -> torch.Tensor:
        if isinstance(slots, torch.Tensor):
            return slots.to(device=self.device, dtype=torch.int64)
        host = torch.tensor(list(slots), dtype=torch.int64)
        if self.device.type == "cuda":  # from pinned memory: the host need not wait
            host = host.pin_memory()
        return host.to(self.device, non_blocking=True)

    def _views(self, flat: torch.Tensor) -> State:
        """Each layer's buffer ``[rows, C, L]`` as a view of ``flat`` ``[rows, elements]``."""
        views, at = [], 0
        for spec, n in zip(self.layers.buffers, self._elements, strict=True):
            views.append(flat[:, at : at + n].view(flat.shape[0], spec.channels, spec.length))
            at += n
        return views

    def ensure_slots(self, count: int) -> None:
        """Grow the state to at least ``count`` slots (eager use only: a
        captured graph keeps the tensors it was captured with)."""
        if count <= self.max_slots:
            return
        grown = max(count, 2 * self.max_slots)
        extra = self.flat.new_zeros(grown - self.max_slots, self.flat.shape[1])
        self.flat = torch.cat([self.flat, extra])
        self.state = self._views(self.flat)
        self.frames_fed = torch.cat([self.frames_fed, self.frames_fed.new_zeros(len(extra))])
        self.max_slots = grown

    # -- lifecycle ---------------------------------------------------------
    def reset(self, slots: Slots) -> None:
        """Start new, empty streams in ``slots`` (nothing of the previous
        stream survives)."""
        index = self._index(slots)
        self.flat.index_fill_(0, index, 0.0)
        self.frames_fed.index_fill_(0, index, 0)

    def save(self, slots: Slots) -> SavedSlots:
        """A copy of the slots' state, to :meth:`restore` later, into the same
        or other slots (preempt a stream, resume it elsewhere)."""
        index = self._index(slots)
        flat = self.flat.index_select(0, index)
        return SavedSlots(flat, tuple(self._views(flat)), self.frames_fed.index_select(0, index))

    def restore(self, slots: Slots, saved: SavedSlots) -> None:
        index = self._index(slots)
        if saved.frames_fed.shape[0] != index.shape[0]:
            raise ValueError(f"saved {saved.frames_fed.shape[0]} slots; restoring {index.shape[0]}")
        self.flat.index_copy_(0, index, saved.flat.to(self.flat.device, self.flat.dtype))
        self.frames_fed.index_copy_(0, index, saved.frames_fed.to(self.device))

    # -- decoding ----------------------------------------------------------
    @torch.inference_mode()
    def step(self, slots: Slots, codes: torch.Tensor) -> torch.Tensor:
        """Feed ``n`` new raw frames to each slot: ``codes`` [B, Q, n] (clean:
        in range) -> committed PCM [B, n * hop] float32, on the codec's device.

        Slots must be distinct within a call."""
        with self.codec.compute_context():
            return self.advance_slots(self._index(slots), codes)

    def advance_slots(self, index: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """:meth:`step`'s body for a device slot index, in the caller's grad mode
        and precision context: plain tensor operations only, so that it can be
        traced whole by ``torch.compile``."""
        state = self._views(self.flat.index_select(0, index))
        fed = self.frames_fed.index_select(0, index)
        x = self.codec.acoustic_input(codes)
        pcm, new = self.layers.advance(state, fed, x)
        # The new state, packed in the flat layout and scattered in one kernel.
        # Packing by concatenation lets each layer write its part straight into
        # the packed rows; copying into views of the gathered copy instead
        # compiles to a chain of whole-row rewrites (one per buffer).
        packed = torch.cat([value.reshape(value.shape[0], -1) for value in new], dim=1)
        self.flat.index_copy_(0, index, packed.to(self.flat.dtype))
        self.frames_fed.index_add_(0, index, torch.full_like(fed, codes.shape[-1]))
        return pcm

    @torch.inference_mode()
    def peek(self, slots: Slots, samples: int | None = None) -> torch.Tensor:
        """The last :attr:`delay` samples as if each stream ended now
        [B, delay], or only their first ``samples`` (cheaper: a chunk with
        ``h`` frames of holdback needs ``delay - 960 h``); the state is
        unchanged."""
        with self.codec.compute_context():
            return self.tail_slots(self._index(slots), samples)

    def tail_slots(self, index: torch.Tensor, samples: int | None = None) -> torch.Tensor:
        """:meth:`peek`'s body for a device slot index, in the caller's grad mode
        and precision context (traceable whole, as :meth:`advance_slots`)."""
        state = self._views(self.flat.index_select(0, index))
        return self.layers.tail(state, self.frames_fed.index_select(0, index), samples)

    def flush(self, slots: Slots) -> torch.Tensor:
        """End the streams: their last :attr:`delay` samples [B, delay]; the
        slots are reset, ready for new streams."""
        pcm = self.peek(slots)
        self.reset(slots)
        return pcm

    # -- validation of untrusted codes (synchronises; not for the hot path) --
    def check_codes(self, codes: torch.Tensor) -> None:
        if codes.ndim != 3 or codes.shape[1] != self.num_quantizers:
            raise CodecInputError(
                f"codes must be [B, {self.num_quantizers}, n]; got {tuple(codes.shape)}"
            )
        if codes.dtype not in (torch.int64, torch.int32):
            raise CodecInputError(f"codes must be integers; got {codes.dtype}")
        if codes.shape[-1] < 1:
            raise CodecInputError("a step needs at least one frame")
        if codes.numel() and bool(((codes < 0) | (codes >= self.codebook_size)).any()):
            raise CodecInputError(
                f"codes out of range [0, {self.codebook_size - 1}] "
                "(replace BOC/EOC by 0 before decoding)"
            )


def frames_from_rows(
    rows: torch.Tensor, frame: torch.Tensor, codebook_size: int = 1024
) -> torch.Tensor:
    """De-delay on the device: ``rows`` [B, R, Q] (each stream's delay-
    patterned rows so far, row ``t + c`` holding codebook ``c`` of frame
    ``t``), ``frame`` [B] (the frame each stream completes; its row
    ``frame + Q - 1`` must be in ``rows``) -> clean codes [B, Q, 1] for
    :meth:`StreamingCodec.step`. BOC/EOC and negative codes become 0, as in
    ``streaming.clean_codes``. Fixed shapes, no host synchronisation."""
    q = rows.shape[-1]
    books = torch.arange(q, device=rows.device)
    index = frame.to(rows.device, torch.int64)[:, None] + books  # [B, Q] row of each code
    codes = rows[torch.arange(rows.shape[0], device=rows.device)[:, None], index, books]
    codes = torch.where((codes < 0) | (codes >= codebook_size), torch.zeros_like(codes), codes)
    return codes.to(torch.int64)[:, :, None]


class SlotPool:
    """Hands out slot numbers of a :class:`StreamingCodec` to host-side
    streams. Numbers only: whoever decodes resets a slot before its first
    step and grows the codec (:meth:`StreamingCodec.ensure_slots`) on its own
    thread, so nothing here touches device state."""

    def __init__(self) -> None:
        self._free: list[int] = []
        self._next = 0

    def acquire(self) -> int:
        if self._free:
            return self._free.pop()
        self._next += 1
        return self._next - 1

    def release(self, slot: int) -> None:
        self._free.append(slot)

    @property
    def in_use(self) -> int:
        return self._next - len(self._free)
