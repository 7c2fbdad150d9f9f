"""The streaming codec on the talker's device: one codec slot per talker slot.

:class:`CodecSlots` owns a :class:`~realtime_engine.codec.stream_core.StreamingCodec`
with one slot per talker slot (plus a trash slot that padded batch rows
address), and a PCM ring per slot that holds the committed samples a chunk
has not taken yet. Each call of :meth:`step` feeds one frame to each of a
set of slots: the frame's codes are gathered from the talker's row table on
a gather stream of their own, the codec step runs on the codec stream (so it
overlaps the talker's forward passes) and writes its 960 committed samples
into the ring. On CUDA the step is a captured graph per batch-size bucket:
one launch, no host synchronisation.

A caller that knows the frames' rows are written (the engine core: their
step's event completed) says so with ``rows_written``, and the gather waits
for nothing: a frame is decoded while the talker's next step still runs, not
after it. A caller that knows which step writes them passes that step's
event as ``written_by``, and the gather waits for that step only, not for
the steps launched after it. Otherwise the gather waits for the current
stream's work so far.
The other direction is ordered by :meth:`fence`: before the talker writes
rows into a slot for a new request, its stream waits for the gathers already
issued, which may still read the slot's previous request.

:meth:`chunks` cuts chunks out of the rings, completing a chunk's right edge
with a speculative :meth:`StreamingCodec.peek` where the committed samples do
not reach it yet (holdbacks under the receptive field, and the end of an
utterance). The whole tail, which every stream's last chunk needs, and the
presets' speculative edges (:func:`tail_lengths`) are captured graphs per
batch bucket too: eager, a tail is a few hundred small kernel launches, host
time the engine core's step waits for, and the first chunk of `latency` and
`balanced` with it. With the compiled step the whole tail is compiled as
well, and an edge is its start (one trace, not one per length).

Sample ``j`` of a stream (whole-utterance decode numbering) lives at ring
position ``j mod ring_len``. After ``F`` frames a slot has committed samples
``[0, 960 F - delay)``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import torch

from realtime_engine.codec.causal import DEFAULT_GEMM_TAPS, GemmChannels, GemmTaps
from realtime_engine.codec.decoder import CodecDecoder
from realtime_engine.codec.fused_unit import DEFAULT_FUSED_UNITS, FusedUnitsOption
from realtime_engine.codec.kernel_launch import build_launches, deferred_launches
from realtime_engine.codec.stream_core import StreamingCodec
from realtime_engine.format import (
    CODEBOOK_SIZE,
    CODEC_COMPILE_MODES,
    CODEC_STREAM_PRIORITIES,
    DEFAULT_CODEC_COMPILE_MODE,
    DEFAULT_CODEC_KERNELS,
    DEFAULT_CODEC_STREAM_PRIORITY,
    MAX_CHUNK_FRAMES,
    MAX_FRAMES_PER_CALL,
    MAX_HOLDBACK_FRAMES,
    PRESETS,
    resolve_codec_kernels,
)
from realtime_engine.talker.compile_workers import (
    compile_phase_seconds,
    describe_compile_phases,
    parallel_compile,
)
from realtime_engine.talker.host_uploads import HostUploads
from realtime_engine.talker.stream_switch import OnStream, device_index
from realtime_engine.talker.vllm_sampler_graphs import bucket_sizes

logger = logging.getLogger("vllm.plugins.higgs_talker.codec")

# Committed samples a slot may hold before a chunk takes them: the longest
# chunk plus the longest holdback, plus frames that arrive while a chunk is
# planned (statuses reach the host a step or more late).
RING_FRAMES = MAX_CHUNK_FRAMES + MAX_HOLDBACK_FRAMES + 32

# The largest batch of tails run in fixed buckets (a step ends about one
# request in 250 at full load; larger bursts run as several batches).
TAIL_BATCH = 64


def tail_lengths(delay: int, hop: int) -> list[int]:
    """The tail lengths (samples) run from captured buckets: the whole tail (every
    stream's last chunk) and each preset's speculative right edge (a holdback of
    ``h`` frames under the receptive field needs the tail's first ``delay - hop h``
    samples: ``latency`` and ``balanced`` on every chunk, their first included)."""
    holdbacks = {preset.right_holdback_frames for preset in PRESETS.values()}
    return sorted({delay} | {delay - hop * h for h in holdbacks if delay - hop * h > 0})


class CodecCaptureError(RuntimeError):
    """Capturing the codec step as CUDA graphs failed: the engine must not start
    (``enforce_eager`` runs the codec without graphs)."""


class CodecSlots:
    """Per-slot streaming codec state and PCM rings on the talker's device."""

    def __init__(
        self,
        codec: CodecDecoder,
        slots: int,
        *,
        graphs: bool = False,
        kernels: str = DEFAULT_CODEC_KERNELS,
        ring_frames: int = RING_FRAMES,
        bucket_tails: bool | None = None,
        stream_priority: str = DEFAULT_CODEC_STREAM_PRIORITY,
        compile_workers: int | None = None,
        channels_last: bool = False,
        gemm_channels: GemmChannels = "auto",
        compile_mode: str = DEFAULT_CODEC_COMPILE_MODE,
        frame_counts: Sequence[int] = (1,),
        fused_units: FusedUnitsOption = DEFAULT_FUSED_UNITS,
        gemm_taps: GemmTaps = DEFAULT_GEMM_TAPS,
    ) -> None:
        """``bucket_tails``: run tails padded to the step's batch buckets, from
        static buffers (default: where the step is captured, so they are too).
        ``stream_priority``: the codec's and the gathers' CUDA stream priority
        (:data:`CODEC_STREAM_PRIORITIES`). ``compile_workers``: Inductor's workers
        while the compiled kernels' warm-up compiles them (default: a worker per
        core, :func:`~realtime_engine.talker.compile_workers.default_compile_workers`).
        ``channels_last``: the convolutions in channels-last layout (an
        experiment, off); ``gemm_channels``: the wide convolutions as matrix
        products (:class:`~realtime_engine.codec.causal.CausalDac`; by default
        where the weights are float16). ``compile_mode``: how torch.compile
        builds the compiled step (:data:`CODEC_COMPILE_MODES`). ``frame_counts``: the
        frames a slot may take in one :meth:`step` (each count a step of its own,
        captured per bucket; 1 is always one of them). ``fused_units``: the narrow
        residual units as one Triton kernel each, and with ``"narrow"`` every narrow
        layer (CausalDac's; by default every narrow layer on CUDA, none elsewhere,
        :func:`~realtime_engine.codec.fused_unit.resolve_fused_units`). ``gemm_taps``:
        how the products take their taps (CausalDac's; shifted views by default)."""
        if stream_priority not in CODEC_STREAM_PRIORITIES:
            raise ValueError(
                f"codec stream priority must be one of {CODEC_STREAM_PRIORITIES};"
                f" got {stream_priority!r}"
            )
        if compile_mode not in CODEC_COMPILE_MODES:
            raise ValueError(
                f"codec compile mode must be one of {CODEC_COMPILE_MODES}; got {compile_mode!r}"
            )
        counts = sorted({1, *frame_counts})
        if counts[0] < 1 or counts[-1] > MAX_FRAMES_PER_CALL:
            raise ValueError(
                f"frame counts must be from 1 to {MAX_FRAMES_PER_CALL}; got {list(frame_counts)}"
            )
        self.frame_counts = tuple(counts)
        self._cuda = codec.device.type == "cuda"
        kernels = resolve_codec_kernels(kernels, cuda=self._cuda)
        self.kernels = kernels
        # the activation kernel is Triton's: CUDA only
        fused = kernels == "snake" and self._cuda
        self.stream_codec = StreamingCodec(
            codec,
            max_slots=slots + 1,
            fused=fused,
            channels_last=channels_last,
            gemm_channels=gemm_channels,
            fused_units=fused_units,
            gemm_taps=gemm_taps,
        )
        self.trash = slots  # never a talker slot: padded batch rows go here
        self.device = self.stream_codec.device
        self._index = device_index(self.device) if self._cuda else -1
        self._uploads = HostUploads(self.device)
        self.hop = self.stream_codec.hop
        self.delay = self.stream_codec.delay
        self.num_codebooks = self.stream_codec.num_quantizers
        self.ring_len = ring_frames * self.hop
        self.ring = torch.zeros(slots + 1, self.ring_len, dtype=torch.float32, device=self.device)
        # A lower number is a higher priority; -1 is valid on every CUDA device.
        # Captured graphs replay at the priority of the stream they launch on.
        priority = -1 if stream_priority == "high" else 0
        self.stream = torch.cuda.Stream(self.device, priority=priority) if self._cuda else None
        self.gather_stream = (
            torch.cuda.Stream(self.device, priority=priority) if self._cuda else None
        )
        self._gathered: torch.cuda.Event | None = None  # the last gather, on its stream
        self._gather_event = torch.cuda.Event() if self._cuda else None
        self._sizes = bucket_sizes(slots)
        if kernels == "compiled" and slots > 1:
            # a batch of 1 runs padded to 2: one dynamic trace serves every batch
            # (torch.compile always specialises a size of 1), half the compile time
            self._sizes = [s for s in self._sizes if s > 1]
        self._want_graphs = graphs and self._cuda
        self._compile_workers = compile_workers
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}  # per (frames, size)
        # Static inputs of a step (what a graph reads).
        self._slot_in = torch.full((slots,), self.trash, dtype=torch.int64, device=self.device)
        self._codes_in = {
            n: torch.zeros(slots, self.num_codebooks, n, dtype=torch.int64, device=self.device)
            for n in self.frame_counts
        }
        self._books = torch.arange(self.num_codebooks, device=self.device)
        self._books_np = np.arange(self.num_codebooks, dtype=np.int64)
        # sample offsets within a chunk (a chunk never spans more than the ring)
        self._positions = torch.arange(self.ring_len, device=self.device)
        # Whole tails (every stream's last chunk) from static buffers, per bucket.
        self._bucket_tails = self._want_graphs if bucket_tails is None else bucket_tails
        self._tail_sizes = [s for s in self._sizes if s <= TAIL_BATCH] or self._sizes[:1]
        compiled = kernels == "compiled"
        # With the compiled step, the whole tail is compiled too (one trace for a
        # dynamic batch) and a preset's edge is its start: on one H200 a batch of 2
        # took 0.76 ms for the whole tail against 0.67-0.72 ms for an edge alone
        # (eager: 1.3-1.45 ms), and a trace a length would triple the compile time.
        self._tail_lengths = [self.delay] if compiled else tail_lengths(self.delay, self.hop)
        self._tail_in = torch.full_like(self._slot_in[: self._tail_sizes[-1]], self.trash)
        # per (bucket, tail length)
        self._tail_out: dict[tuple[int, int], torch.Tensor] = {}
        self._tail_graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        # The whole step through torch.compile: traced once, for a dynamic batch,
        # before any graph is captured.
        self._advance_fn: Callable[[torch.Tensor, torch.Tensor], None] = self._advance
        self._tail_fn: Callable[[torch.Tensor], torch.Tensor] | None = None
        if compiled:
            self._advance_fn = torch.compile(
                self._advance, fullgraph=True, dynamic=None, mode=compile_mode
            )
            self._tail_fn = torch.compile(
                self._whole_tail, fullgraph=True, dynamic=None, mode=compile_mode
            )

    def on_codec_stream(self) -> AbstractContextManager[None]:
        """Run the enclosed device work on the codec stream (inline on CPU)."""
        if self.stream is None:
            return contextlib.nullcontext()
        return OnStream(self.stream, self._index)

    # -- set-up ---------------------------------------------------------------------

    def warm_up(self) -> None:
        """Capture the step graphs (CUDA, when wanted) or run each bucket once: called
        at the engine's start-up profiling run, so the memory is accounted for."""
        self._build_fused_kernels()
        if self.kernels != "compiled":
            self._warm_up()
            return
        # eager once first: the layers build their masks and 1/alpha caches then,
        # so the traced step only reads them
        with torch.inference_mode(), self.stream_codec.codec.compute_context():
            for n in self.frame_counts:
                self._advance(self._slot_in[:1], self._codes_in[n][:1])
        phases = compile_phase_seconds()
        with parallel_compile(self._compile_workers) as workers:
            started = time.perf_counter()
            self._warm_up()
        logger.info(
            "compiled the codec step and tail with %d compile workers in %.1f s (%s)",
            workers,
            time.perf_counter() - started,
            describe_compile_phases(phases, compile_phase_seconds()),
        )

    def _build_fused_kernels(self) -> None:
        """Build every fused Triton kernel of a step at once, on threads, before
        the first step would build them one after another (with ``fused_units``,
        where the kernels run; :mod:`~realtime_engine.codec.kernel_launch`)."""
        if not self.stream_codec.layers.fused_units:
            return
        started = time.perf_counter()
        with (
            torch.inference_mode(),
            self.stream_codec.codec.compute_context(),
            deferred_launches() as launches,
        ):
            for n in self.frame_counts:  # the trash slot's state: zeros, then the warm-up's
                self._advance(self._slot_in[:1], self._codes_in[n][:1])
        if not launches:  # the kernels do not run on this device
            return
        try:
            built = build_launches(launches)
        except Exception as e:  # the first step builds them in turn, and fails there if it must
            logger.warning("building the codec's fused kernels at once failed: %s", e)
            return
        logger.info(
            "built the codec's %d fused kernels in %.1f s", built, time.perf_counter() - started
        )

    def _warm_up(self) -> None:
        if not self._cuda:
            if self.kernels == "compiled":  # trace now
                for n in self.frame_counts:
                    self._run(self._sizes[0], n)
            return
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for n in self.frame_counts:  # every row is padding: only the trash slot changes
                for size in self._sizes:
                    self._run(size, n)
            if self._bucket_tails:
                for size in self._tail_sizes:
                    for samples in self._tail_lengths:
                        self._run_tail(size, samples)
        torch.cuda.current_stream(self.device).wait_stream(side)
        if not self._want_graphs:
            return
        started = time.perf_counter()
        try:
            pool = torch.cuda.graph_pool_handle()
            for n in reversed(self.frame_counts):  # largest first: the rest reuse its pool
                for size in reversed(self._sizes):
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                        self._run(size, n)
                    self._graphs[n, size] = graph
            if self._bucket_tails:
                # a pool of their own: each bucket's output stays allocated
                pool = torch.cuda.graph_pool_handle()
                for size in reversed(self._tail_sizes):
                    for samples in self._tail_lengths:
                        graph = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                            self._run_tail(size, samples)
                        self._tail_graphs[size, samples] = graph
        except RuntimeError as e:
            self._graphs.clear()
            self._tail_graphs.clear()
            raise CodecCaptureError(f"capturing the codec step as CUDA graphs failed: {e}") from e
        logger.info(
            "captured the codec step of %s frames for batch sizes %s, its tails of %s samples"
            " for %s, in %.1f s",
            list(self.frame_counts),
            self._sizes,
            self._tail_lengths,
            self._tail_sizes if self._bucket_tails else [],
            time.perf_counter() - started,
        )

    # -- per stream ------------------------------------------------------------------

    def reset(self, slots: Sequence[int]) -> None:
        """New streams start in ``slots`` (nothing of the previous ones survives);
        one launch per state buffer, however many slots."""
        with self.on_codec_stream():
            self.stream_codec.reset(self._host_index(list(slots)))

    def replay(
        self, slot: int, table: torch.Tensor, first_row: int, frames: int, keep: int
    ) -> None:
        """Rebuild ``slot``'s state from the ``frames`` frames whose rows start at table
        position ``first_row`` (a stream back from preemption, its rows restored
        there): reset, one step over all the frames, and the ring refilled with the
        committed samples from sample ``keep`` on (the ones no chunk took yet)."""
        self.reset([slot])
        if frames <= 0:
            return
        # on the current stream: after the talker restored the rows
        codes, _ = self._gather(table, [slot], [first_row], frames)  # [1, Q, frames]
        ready = self._record_current()
        if self.stream is not None:
            codes.record_stream(self.stream)
        with self.on_codec_stream():
            self._wait(ready)
            pcm = self.stream_codec.step([slot], codes)[0]  # samples [-delay, 960 frames - delay)
            first = max(keep, frames * self.hop - self.delay - self.ring_len, 0)
            start = first + self.delay  # index of sample ``first`` in ``pcm``
            if start < pcm.shape[0]:
                tail = pcm[start:]
                pos = (first + torch.arange(tail.shape[0], device=self.device)) % self.ring_len
                self.ring[slot, pos] = tail.to(self.ring.dtype)

    # -- per step --------------------------------------------------------------------

    def step(
        self,
        slots: Sequence[int],
        rows: Sequence[int],
        table: torch.Tensor,
        *,
        rows_written: bool = False,
        written_by: Any = None,
        frames: int = 1,
    ) -> None:
        """Feed ``frames`` frames (one of :attr:`frame_counts`) to each slot: ``rows[i]``
        is the table position of the row that holds codebook 0 of slot ``slots[i]``'s
        first frame (its codebook ``c`` of frame ``t`` is ``t + c`` rows further).
        Slots must be distinct. ``rows_written``: the rows are
        known to be in the table already (their writes completed); else
        ``written_by``, an event recorded on the current stream after the rows'
        writes, is what the gather waits for (default: the current stream)."""
        b = len(slots)
        if b == 0:
            return
        if frames not in self._codes_in:
            raise ValueError(f"a step takes {list(self.frame_counts)} frames; got {frames}")
        padded = self._graphs or self.kernels == "compiled"
        size = next(s for s in self._sizes if s >= b) if padded else b
        codes, index = self._gather_on_side(
            table, slots, rows, size, frames, rows_written, written_by
        )
        with self.on_codec_stream():
            self._wait(self._gathered)
            # the static inputs are written on the codec stream: after the last
            # step read them, with no wait on the talker's stream (padding rows
            # included: they address the trash slot)
            self._codes_in[frames][:size].copy_(codes)
            self._slot_in[:size].copy_(index)
            graph = self._graphs.get((frames, size))
            if graph is not None:
                graph.replay()
            else:
                self._run(size, frames)

    def fence(self) -> None:
        """Order the current stream after every gather issued so far: call before
        the talker writes rows into a slot whose previous request may still be
        read (admission; cheap, the gather stream does nothing else)."""
        if self._gathered is not None:
            torch.cuda.current_stream(self._index).wait_event(self._gathered)

    def _gather_on_side(
        self,
        table: torch.Tensor,
        slots: Sequence[int],
        rows: Sequence[int],
        size: int,
        frames: int,
        written: bool,
        written_by: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`_gather_frame` on the gather stream: unless the rows are known
        to be ``written``, after ``written_by`` or else the current stream's work
        so far."""
        if self.gather_stream is None:
            return self._gather_frame(table, slots, rows, size, frames)
        if not written and written_by is not None:
            self.gather_stream.wait_event(written_by)
        elif not written:
            self.gather_stream.wait_stream(torch.cuda.current_stream(self._index))
        with OnStream(self.gather_stream, self._index):
            codes, index = self._gather_frame(table, slots, rows, size, frames)
            assert self._gather_event is not None
            # one event, recorded again each step: every wait on it is enqueued
            # before the next record, and a wait takes the record it sees
            self._gather_event.record(self.gather_stream)
            self._gathered = self._gather_event
        assert self.stream is not None
        # allocated on the gather stream, read on the codec stream
        codes.record_stream(self.stream)
        index.record_stream(self.stream)
        return codes, index

    def _run(self, size: int, frames: int = 1) -> None:
        slots, codes = self._slot_in[:size], self._codes_in[frames][:size]
        if size > 1 and self.kernels == "compiled":
            # one trace per frame count serves every batch size above 1
            torch._dynamo.mark_dynamic(slots, 0)
            torch._dynamo.mark_dynamic(codes, 0)
            # a trace of its own per frame count (not one dynamic in the frames)
            torch._dynamo.mark_static(codes, 2)
        with torch.inference_mode(), self.stream_codec.codec.compute_context():
            self._advance_fn(slots, codes)

    def _advance(self, slots: torch.Tensor, codes: torch.Tensor) -> None:
        """``codes`` ``[B, Q, n]``: ``n`` frames into each of ``slots``, their committed
        samples into the ring.

        ``codes`` come raw from the talker's table (:meth:`_gather_frame`): BOC/EOC
        and anything out of range become 0 here, inside the captured step."""
        codes = torch.where((codes < 0) | (codes >= CODEBOOK_SIZE), 0, codes)
        fed = self.stream_codec.frames_fed.index_select(0, slots)
        pcm = self.stream_codec.advance_slots(slots, codes)  # [size, n * hop]
        offsets = self._positions[: codes.shape[-1] * self.hop]
        pos = (fed[:, None] * self.hop - self.delay + offsets) % self.ring_len
        self.ring[slots[:, None], pos] = pcm.to(self.ring.dtype)

    # -- chunks ----------------------------------------------------------------------

    def chunks(
        self,
        slots: Sequence[int],
        starts: Sequence[int],
        ends: Sequence[int],
        fed: Sequence[int],
    ) -> torch.Tensor:
        """PCM of chunks ``[starts[i], ends[i])`` (samples) of the streams in ``slots``,
        after ``fed[i]`` frames were stepped: ``[n, max length]`` float32 on the
        device (row ``i`` valid up to its length). Run on the codec stream; the
        ends must be at most ``960 fed``. Where a chunk reaches past the committed
        samples, its edge is decoded as if the stream ended after its last fed
        frame; chunks that need that are best grouped by ``960 fed - end``."""
        n = len(slots)
        hop, ring_len = self.hop, self.ring_len
        length = max(max(e - s for s, e in zip(starts, ends, strict=True)), 0)
        committed = [f * hop - self.delay for f in fed]
        peek = max(e - c for e, c in zip(ends, committed, strict=True))
        # Every chunk batch runs this: one upload and four kernels without an edge.
        # Per chunk: its ring row's offset, first sample, first uncommitted sample, slot.
        meta = self._host_index(
            np.array([[s * ring_len for s in slots], starts, committed, slots]).reshape(4, n, 1)
        )
        base, start, commit, index = meta.unbind(0)
        # the edge first: its kernels are most of a chunk's device time
        edge = self._peek(index.view(n), peek) if peek > 0 else None  # [n, peek] from ``commit``
        positions = self._positions
        sample = start + (
            positions[:length]
            if length <= positions.shape[0]
            else torch.arange(length, device=self.device)
        )
        out = torch.take(self.ring, base + sample % ring_len)
        if edge is not None:
            if edge.dtype != out.dtype:
                edge = edge.to(out.dtype)
            at = (sample - commit).clamp_(0, peek - 1)
            out = torch.where(sample < commit, out, torch.gather(edge, 1, at))
        return out

    def _peek(self, index: torch.Tensor, samples: int) -> torch.Tensor:
        """The first ``samples`` of the slots' tails: the start of the shortest
        captured tail length that holds them, from its bucket's graph (or static
        buffers), padded with the trash slot. Eager,
        a tail is a few hundred small launches on the host's time, which a
        preset's first chunk waits for."""
        n = index.shape[0]
        # the shortest captured tail that holds the wanted start
        length = next((t for t in self._tail_lengths if t >= samples), None)
        if not self._bucket_tails or length is None or n > self._tail_sizes[-1]:
            return self.stream_codec.peek(index, samples)
        size = next(s for s in self._tail_sizes if s >= n)
        # written on the codec stream, after the last tail read them
        self._tail_in[:n].copy_(index)
        if size > n:
            self._tail_in[n:size].fill_(self.trash)
        graph = self._tail_graphs.get((size, length))
        if graph is not None:
            graph.replay()
        else:
            self._run_tail(size, length)
        # valid until the next tail of this bucket and length: the caller uses it first
        return self._tail_out[size, length][:n, :samples]

    def _run_tail(self, size: int, samples: int) -> None:
        index = self._tail_in[:size]
        if self._tail_fn is None:
            self._tail_out[size, samples] = self.stream_codec.peek(index, samples)
            return
        assert samples == self.delay, "the compiled tail is the whole one"
        if size > 1:
            torch._dynamo.mark_dynamic(index, 0)
        with torch.inference_mode(), self.stream_codec.codec.compute_context():
            self._tail_out[size, samples] = self._tail_fn(index)

    def _whole_tail(self, index: torch.Tensor) -> torch.Tensor:
        return self.stream_codec.tail_slots(index)

    # -- helpers ---------------------------------------------------------------------

    def _host_index(self, values: Sequence[object] | np.ndarray) -> torch.Tensor:
        """Integers from the host on the device, through the pinned ring without a
        wait (:class:`~realtime_engine.talker.host_uploads.HostUploads`)."""
        return self._uploads.upload(values)

    def _gather_frame(
        self,
        table: torch.Tensor,
        slots: Sequence[int],
        rows: Sequence[int],
        size: int,
        frames: int = 1,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Raw codes ``[size, Q, frames]`` (the table's dtype, uncleaned: :meth:`_advance`
        cleans them) of ``frames`` frames per slot, codebook ``c`` of frame ``t`` at table
        row ``rows[i] + t + c`` of slot ``slots[i]``, and the slots as a device index;
        rows past ``len(slots)`` are padding (the trash slot, codes of table element 0).

        Every step runs this, so its host side is one copy up and one kernel:
        the flat table offsets are computed on the host (numpy) and taken in
        one ``take``, where indexing ``[slot, row + c, c]`` on the device costs
        a dozen launches."""
        b, books = len(slots), self.num_codebooks
        positions = table.shape[1]
        slot = np.full(size, self.trash, dtype=np.int64)
        slot[:b] = slots
        flat = np.zeros((size, books, frames), dtype=np.int64)
        # [b, Q, frames]: row of codebook c of frame t
        pos = (
            np.asarray(rows, dtype=np.int64)[:, None, None]
            + self._books_np[:, None]
            + np.arange(frames, dtype=np.int64)
        )
        pos = np.clip(pos, 0, positions - 1)
        flat[:b] = (slot[:b, None, None] * positions + pos) * books + self._books_np[:, None]
        meta = self._host_index(np.concatenate([flat.ravel(), slot]))
        offsets = meta[: size * books * frames]
        if offsets.device != table.device:
            offsets = offsets.to(table.device)
        codes = torch.take(table, offsets).view(size, books, frames)
        if codes.device != self.device:
            codes = codes.to(self.device)
        return codes, meta[size * books * frames :]

    def _gather(
        self, table: torch.Tensor, slots: Sequence[int], rows: Sequence[int], frames: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Clean codes ``[b, Q, frames]`` of frames starting at table row ``rows[i]``
        of slot ``slots[i]`` (BOC/EOC and anything out of range become 0), and the
        slots as a device index."""
        meta = self._host_index([list(slots), list(rows)])
        t = torch.arange(frames, device=table.device)
        pos = meta[1][:, None, None] + t[None, :, None] + self._books.to(table.device)
        pos = pos.clamp(0, table.shape[1] - 1)
        codes = table[meta[0][:, None, None], pos, self._books.to(table.device)].long()
        codes = torch.where((codes < 0) | (codes >= CODEBOOK_SIZE), 0, codes)
        return codes.transpose(1, 2).to(self.device), meta[0].to(self.device)

    def _record_current(self) -> torch.cuda.Event | None:
        if self.stream is None:
            return None
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event

    def _wait(self, event: torch.cuda.Event | None) -> None:
        if event is not None and self.stream is not None:
            self.stream.wait_event(event)
