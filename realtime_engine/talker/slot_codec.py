"""Codec decoding beside the talker, from the code rows it keeps on the device.

The talker writes each request's delay-patterned rows into a device table
``[slots, positions, 8]`` (row ``r`` of a request at position ``base + r``).
:class:`SlotCodec` keeps each request's progress on the host, from row
counts alone, and drives the streaming codec of
:class:`~realtime_engine.talker.codec_slots.CodecSlots`:

- :meth:`SlotCodec.feed`: the frames completed since the last call (frame
  ``t`` is complete once row ``t + 7`` is written) are stepped through the
  codec, batched over the slots; each sample is computed once, with all of
  the utterance's left context. With ``frames_per_call`` above 1, a stream
  whose next chunk is not due keeps its new frames until it has that many and
  steps them in one call (its cached state read and written once for them
  all); the frames a due chunk, a first chunk, an ending or a listener at
  the low water needs never wait.
- :meth:`SlotCodec.due` plans the chunks now due (the chunk schedule of each
  request's :class:`~realtime_engine.format.ChunkingParams`, as in
  :class:`~realtime_engine.codec.streaming.StreamingDecoder`). Given the
  time, it also sends early what a request has committed once its listener
  is about to run dry (:data:`LISTENER_LOW_WATER_S`): the schedule assumes
  the talker runs ``chunk_growth`` times faster than real time, and under
  load it may not.
- :meth:`SlotCodec.decode` cuts them out of the committed samples, completing
  a chunk's right edge speculatively where its holdback is under the codec's
  receptive field, and at the end of an utterance.

No code row reaches the host, and nothing here reads a device value back.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch

from realtime_engine.codec.causal import DEFAULT_GEMM_TAPS, GemmChannels, GemmTaps
from realtime_engine.codec.decoder import CodecDecoder
from realtime_engine.codec.fused_unit import DEFAULT_FUSED_UNITS, FusedUnitsOption
from realtime_engine.codec.presets import next_chunk_frames, validate_chunking
from realtime_engine.format import (
    DEFAULT_CODEC_COMPILE_MODE,
    DEFAULT_CODEC_FRAMES_PER_CALL,
    DEFAULT_CODEC_KERNELS,
    DEFAULT_CODEC_STREAM_PRIORITY,
    DELAY_ROWS,
    SAMPLE_RATE,
    ChunkingParams,
    frame_counts,
)
from realtime_engine.talker.codec_slots import CodecSlots

# Audio a listener should still hold when a request's next chunk is planned.
# Below it, whatever is committed goes out now instead of waiting for the
# schedule's next size. It covers the way out (the codec behind the current
# step, the copy, the gateway's Opus framing of up to 60 ms) and one step of
# lateness in noticing.
LISTENER_LOW_WATER_S = 0.15


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
    fed: int = 0  # frames stepped through the codec
    replay: bool = False  # the codec state must be rebuilt (back in a slot after preemption)
    stamps: dict[str, float] = field(default_factory=dict)
    # Rows at which the next chunk is due (kept so that a step with nothing due
    # costs a comparison per request, not a plan).
    next_rows: int = 0
    # When the first chunk was planned (the time given to :meth:`SlotCodec.due`):
    # the listener's playback clock starts about then.
    first_planned_at: float | None = None

    def __post_init__(self) -> None:
        self.next_rows = self.rows_for_next_chunk()

    def rows_for_next_chunk(self) -> int:
        p = self.chunking
        need = next_chunk_frames(p, self.emitted)
        return self.emitted + need + p.right_holdback_frames + DELAY_ROWS

    @property
    def available(self) -> int:
        """Complete frames in the table."""
        return max(0, self.rows - DELAY_ROWS)


@dataclass(frozen=True)
class ChunkPlan:
    """One chunk: frames ``[first_frame, first_frame + emit)`` of request ``key``,
    planned after ``fed`` of its frames went through the codec."""

    key: str
    slot: int
    first_frame: int
    emit: int
    final: bool
    fed: int


class SlotCodec:
    """Per-request streaming state over :class:`CodecSlots` and the talker's row table.

    ``slots`` is the number of talker slots; ``max_batch`` bounds the chunks cut
    in one call; ``graphs`` captures the codec step per batch bucket (CUDA);
    ``gemm_channels``: see :class:`~realtime_engine.codec.causal.CausalDac`;
    ``compile_mode``: see :class:`CodecSlots`; ``frames_per_call``: the most frames
    a slot steps in one codec call
    (:data:`~realtime_engine.format.DEFAULT_CODEC_FRAMES_PER_CALL`);
    ``fused_units``, ``gemm_taps``: see :class:`CodecSlots`."""

    def __init__(
        self,
        codec: CodecDecoder,
        *,
        slots: int,
        max_batch: int = 64,
        graphs: bool = False,
        kernels: str = DEFAULT_CODEC_KERNELS,
        stream_priority: str = DEFAULT_CODEC_STREAM_PRIORITY,
        gemm_channels: GemmChannels = "auto",
        compile_mode: str = DEFAULT_CODEC_COMPILE_MODE,
        frames_per_call: int = DEFAULT_CODEC_FRAMES_PER_CALL,
        fused_units: FusedUnitsOption = DEFAULT_FUSED_UNITS,
        gemm_taps: GemmTaps = DEFAULT_GEMM_TAPS,
    ) -> None:
        self.frames_per_call = frames_per_call
        self.device_codec = CodecSlots(
            codec,
            slots,
            graphs=graphs,
            kernels=kernels,
            stream_priority=stream_priority,
            gemm_channels=gemm_channels,
            compile_mode=compile_mode,
            frame_counts=frame_counts(frames_per_call),
            fused_units=fused_units,
            gemm_taps=gemm_taps,
        )
        self.max_batch = max(1, max_batch)
        self.hop = self.device_codec.hop
        self._streams: dict[str, SlotStream] = {}
        self._ready: set[str] = set()  # streams that may have a chunk due
        self._feeding: set[str] = set()  # streams that may have frames to step
        # Streams whose listener is at the low water, found by feed (their frames
        # do not wait) for the next due().
        self._urgent: set[str] = set()
        # Slots of new streams whose codec state is still to be cleared: one
        # batched reset before the codec next runs, not one per admission.
        self._resets: dict[int, None] = {}
        # (time the listener's audio falls to the low water, tiebreak, key,
        # frames emitted then): stale entries are skipped when popped.
        self._low_water: list[tuple[float, int, str, int]] = []
        self._tiebreak = itertools.count()
        self.frame_s = self.hop / SAMPLE_RATE

    def warm_up(self) -> None:
        self.device_codec.warm_up()

    def fence(self) -> None:
        """Call before the talker writes rows into a slot for a new request
        (:meth:`CodecSlots.fence`)."""
        self.device_codec.fence()

    # -- per-request state -------------------------------------------------------

    def open(self, key: str, slot: int, base: int, chunking: ChunkingParams) -> SlotStream:
        """Start decoding request ``key`` (fresh state; any old state of ``key`` goes)."""
        stream = SlotStream(key, slot, base, validate_chunking(chunking))
        self._streams[key] = stream
        self.device_codec.fence()  # the caller writes the slot's rows from now on
        self._resets[slot] = None
        return stream

    def _apply_resets(self) -> None:
        """Clear the codec state of the slots opened since the codec last ran (before
        anything else touches their state: a step, a chunk, a replay)."""
        if self._resets:
            self.device_codec.reset(list(self._resets))
            self._resets.clear()

    def get(self, key: str) -> SlotStream | None:
        return self._streams.get(key)

    def active(self) -> list[str]:
        """Keys of the attached streams."""
        return list(self._streams)

    def detach(self, key: str) -> SlotStream | None:
        """Forget ``key`` (finished, aborted, or preempted: the caller may keep the
        state and :meth:`attach` it again); its state, or None once it has ended."""
        stream = self._streams.pop(key, None)
        self._ready.discard(key)
        self._feeding.discard(key)
        self._urgent.discard(key)
        return None if stream is None or stream.ended else stream

    def attach(self, stream: SlotStream, slot: int) -> None:
        """Resume a detached stream, possibly in another slot, with its rows restored
        at the same table positions there (its codec state is rebuilt from them)."""
        self._apply_resets()
        self.device_codec.fence()
        stream.slot = slot
        stream.replay = True
        self._streams[stream.key] = stream
        self._feeding.add(stream.key)
        if stream.final or stream.rows >= stream.next_rows:
            self._ready.add(stream.key)

    def rewind(
        self,
        stream: SlotStream,
        *,
        rows: int,
        fed: int,
        emitted: int,
        next_rows: int,
        first_planned_at: float | None,
    ) -> None:
        """Take ``stream`` back to an earlier state (rows counted before they were
        confirmed, and were not): its codec state is rebuilt from its first
        ``fed`` frames in the table before it next runs."""
        stream.rows, stream.fed, stream.emitted = rows, fed, emitted
        stream.next_rows, stream.first_planned_at = next_rows, first_planned_at
        stream.ended = False
        stream.replay = True
        if self._streams.get(stream.key) is stream:
            self._feeding.add(stream.key)

    def advance(self, key: str, rows: int, final: bool = False) -> None:
        """``rows`` rows of ``key`` are in the table; ``final``: no more will come."""
        stream = self._streams.get(key)
        if stream is not None:
            self.advance_stream(stream, rows, final)

    def advance_stream(self, stream: SlotStream, rows: int, final: bool = False) -> None:
        """:meth:`advance` for an attached stream already at hand (every step runs
        this for every request: one lookup fewer)."""
        if stream.ended:
            return
        if rows > stream.rows:
            stream.rows = rows
            self._feeding.add(stream.key)
        if final:
            stream.final = True
        if stream.final or stream.rows >= stream.next_rows:
            self._ready.add(stream.key)

    # -- the codec steps -----------------------------------------------------------

    def feed(
        self,
        table: torch.Tensor,
        *,
        rows_written: bool = False,
        written_by: Any = None,
        now: float | None = None,
    ) -> None:
        """Step the complete frames not stepped yet through the codec (``table``:
        ``[slots, positions, Q]``): all of them, or with ``frames_per_call`` above 1,
        whole calls' worth of those whose next chunk is not due, unless their
        listener is at the low water by ``now`` (as :meth:`due` takes it).
        ``rows_written``: every row advanced so far is known to be in the table
        (its write completed), so the codec need not wait for the current stream;
        ``written_by``: they are once that event completes (:meth:`CodecSlots.step`)."""
        self._apply_resets()
        streams = self._streams
        batch = self.frames_per_call
        if now is not None:
            self._urgent |= self._running_dry(now)
        urgent = self._urgent
        work: list[tuple[SlotStream, int]] = []  # (stream, frames to step now)
        waiting: set[str] = set()
        # Every step runs this over every stream: plain attribute arithmetic, no
        # properties (frame ``t`` is complete once row ``t + DELAY_ROWS`` is in).
        for key in sorted(self._feeding):  # sorted: the same batches every time
            stream = streams[key]
            if stream.replay:
                self._replay(stream, table)
            new = stream.rows - DELAY_ROWS - stream.fed
            if new <= 0:
                continue
            if (
                batch > 1
                and stream.emitted > 0  # a first chunk never waits
                and not stream.final
                and stream.rows < stream.next_rows  # nor a chunk that is due
                and key not in urgent  # nor a listener at the low water
            ):
                whole_calls = new - new % batch
                if whole_calls < new:
                    waiting.add(key)
                if whole_calls == 0:
                    continue
                new = whole_calls
            work.append((stream, new))
        self._feeding = waiting
        while work:  # rounds: each stream at most once per call, in order
            calls: dict[int, tuple[list[int], list[int]]] = {}
            rest = []
            for stream, left in work:
                n = 1 << (min(left, batch).bit_length() - 1)  # the largest count that fits
                slots, rows = calls.setdefault(n, ([], []))
                slots.append(stream.slot)
                rows.append(stream.base + stream.fed)
                stream.fed += n
                if left > n:
                    rest.append((stream, left - n))
            for n, (slots, rows) in sorted(calls.items(), reverse=True):
                self.device_codec.step(
                    slots, rows, table, rows_written=rows_written, written_by=written_by, frames=n
                )
            work = rest

    def _replay(self, stream: SlotStream, table: torch.Tensor) -> None:
        stream.replay = False
        self.device_codec.replay(
            stream.slot, table, stream.base, stream.fed, stream.emitted * self.hop
        )

    # -- planning ----------------------------------------------------------------

    def due(self, now: float | None = None) -> list[ChunkPlan]:
        """Every chunk now due, at most one per request; a final chunk may be empty
        (it only tells the consumer that the audio ended). Call after :meth:`feed`.

        ``now`` (seconds, any monotonic clock): also plan, whatever its size,
        the committed audio of every request whose listener is down to
        :data:`LISTENER_LOW_WATER_S`. None: the chunk schedule alone."""
        urgent = self._urgent | (self._running_dry(now) if now is not None else set())
        self._urgent = set()
        plans = []
        for key in sorted(self._ready | urgent):
            stream = self._streams[key]
            plan = self._plan(stream, urgent=key in urgent)
            if plan is not None:
                plans.append(plan)
                if now is not None and plan.emit > 0:
                    self._watch(stream, now)
            elif key in urgent:  # nothing committed yet: look again next time
                self._watch(stream, now)
            stream.next_rows = stream.rows_for_next_chunk()
        self._ready.clear()
        return plans

    def _watch(self, stream: SlotStream, now: float | None) -> None:
        if now is None or stream.ended:
            return
        if stream.first_planned_at is None:
            stream.first_planned_at = now
        low = stream.first_planned_at + stream.emitted * self.frame_s - LISTENER_LOW_WATER_S
        heapq.heappush(self._low_water, (low, next(self._tiebreak), stream.key, stream.emitted))

    def _running_dry(self, now: float) -> set[str]:
        """Keys of the requests whose listener is at the low water by ``now``."""
        urgent: set[str] = set()
        heap = self._low_water
        while heap and heap[0][0] <= now:
            _, _, key, emitted = heapq.heappop(heap)
            stream = self._streams.get(key)
            if stream is not None and not stream.ended and stream.emitted == emitted:
                urgent.add(key)
        return urgent

    def _plan(self, s: SlotStream, urgent: bool = False) -> ChunkPlan | None:
        if s.ended:
            return None
        p = s.chunking
        available = min(s.available, s.fed)
        holdback = 0 if s.final else p.right_holdback_frames
        target = available - holdback
        pending = target - s.emitted
        if not s.final and (
            pending <= 0 or (not urgent and pending < next_chunk_frames(p, s.emitted))
        ):
            return None
        if s.final:
            s.ended = True
            pending = max(pending, 0)
        plan = ChunkPlan(s.key, s.slot, s.emitted, pending, s.final, s.fed)
        s.emitted += pending
        return plan

    # -- decoding ------------------------------------------------------------------

    def batches(self, plans: Sequence[ChunkPlan]) -> list[list[ChunkPlan]]:
        """The plans with audio, grouped for :meth:`decode`: by how far past the
        committed samples they reach (one speculative tail length per group)."""
        groups: dict[int, list[ChunkPlan]] = {}
        for plan in plans:
            if plan.emit > 0:
                groups.setdefault(self._edge(plan), []).append(plan)
        return [
            group[lo : lo + self.max_batch]
            for _, group in sorted(groups.items())
            for lo in range(0, len(group), self.max_batch)
        ]

    def _edge(self, plan: ChunkPlan) -> int:
        end = (plan.first_frame + plan.emit) * self.hop
        return max(0, end - (plan.fed * self.hop - self.device_codec.delay))

    def decode(self, plans: Sequence[ChunkPlan]) -> torch.Tensor:
        """PCM ``[n, samples]`` float32 on the codec's device for one batch of
        :meth:`batches`; row ``i`` holds ``plans[i].emit * hop`` valid samples.
        Call it on the codec stream (inside :meth:`on_codec_stream`) and use the
        PCM there."""
        self._apply_resets()
        hop = self.hop
        return self.device_codec.chunks(
            [p.slot for p in plans],
            [p.first_frame * hop for p in plans],
            [(p.first_frame + p.emit) * hop for p in plans],
            [p.fed for p in plans],
        )

    def on_codec_stream(self) -> AbstractContextManager[None]:
        return self.device_codec.on_codec_stream()
