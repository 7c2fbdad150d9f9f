"""Audio out of the vLLM engine core: the codec decodes beside the talker.

Rows never leave the device. After each sampling step the worker copies only
the step's status (per batch row: valid, done, row index; 24 bytes) into
pinned host memory with a non-blocking copy and an event. At every later
step, the statuses whose event has completed (``query``, never a wait) tell
:class:`~realtime_engine.talker.slot_codec.SlotCodec` how many rows each
request has in the slot table; the frames they complete are stepped through
the streaming codec (one captured graph per batch bucket, on a codec stream
that overlaps the next forward pass), and the chunks that became due are
cut from the committed samples. Each batch of PCM is copied to
pinned memory, an event is recorded, and a sender thread waits for the event
and pushes the chunks (the pattern of :mod:`.vllm_publish`). On CPU all of
this happens inline. A device that stops (a wait for an event that never
completes) ends the engine core process (:mod:`.device_watchdog`).

The host learns a step's rows when its event has completed: at the start of
the next step at best. The engine's thread never waits for the device. While
the batch is small, a step whose status makes a request's first chunk due is
also handed to a watcher thread, which waits for its event and cuts the
chunk at once: the host of a small batch is ahead of the device, so it would
otherwise learn of the row a step or two later (about 2 ms at one stream on an
H200, docs/bench/RESULTS.md section 19). Better still, when the statuses
still on their way would make a first chunk due if each carries the
request's next row, the engine's thread assumes they do and queues the
chunk on the device right behind the step (:mod:`.chunk_ahead`); the sender
drops it if the deciding status says otherwise, and the request's decoding
is rewound. Every entry point takes one lock, so the two threads never
interleave their work on the codec's state.

With ``decode_thread`` (an experiment, off by default), the watcher does the
same for every step above that batch: the engine's thread only copies the
status and hands it over, and the watcher applies it and decodes its audio
when its event completes. The engine's thread is the engine core's bottleneck
at 256 streams (docs/bench/RESULTS.md sections 22-26); whether a second
thread relieves it under the interpreter's lock is what the option measures.
``remove`` still decodes on the engine's thread: a finished request's last
frames must be read before its slot is reused.

The steps are counted too (:class:`StepCounter`): about twice a second the
counters go to the destinations of the requests in flight, so the serving
process can show the engine's step time and batch size.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from realtime_engine.codec.causal import DEFAULT_GEMM_TAPS, GemmChannels, GemmTaps
from realtime_engine.codec.decoder import CodecDecoder
from realtime_engine.codec.fused_unit import DEFAULT_FUSED_UNITS, FusedUnitsOption
from realtime_engine.format import (
    DEFAULT_CODEC_COMPILE_MODE,
    DEFAULT_CODEC_FRAMES_PER_CALL,
    DEFAULT_CODEC_KERNELS,
    DEFAULT_CODEC_STREAM_PRIORITY,
)
from realtime_engine.talker.chunk_ahead import AssumedRows, refutes
from realtime_engine.talker.device_watchdog import DeviceWatchdog, process_watchdog
from realtime_engine.talker.pinned_buffers import PinnedBuffer, PinnedBuffers
from realtime_engine.talker.slot_codec import ChunkPlan, SlotCodec, SlotStream
from realtime_engine.talker.types import MAX_RETURNED_ROWS, NUM_CODEBOOKS
from realtime_engine.talker.vllm_protocol import PcmHeader, StepStats, TalkerArgs
from realtime_engine.talker.vllm_rows import RowPusher

logger = logging.getLogger(__name__)

_QUEUE_BATCHES = 256
# How often the step counters go out while requests are in flight.
STATS_INTERVAL_S = 0.5
# A step that follows the previous one by more than this came after an idle
# gap: counted, but not timed.
_IDLE_GAP_S = 0.25
# Up to this many audio requests in a step, first chunks are cut ahead of their
# statuses, or their status is watched (see the module's notes). A bigger
# batch keeps the engine's thread busy: it polls the statuses soon enough
# itself, and a second thread would only wait for the interpreter's lock.
WATCH_MAX_BATCH = 8


class StepCounter:
    """Cumulative sampling steps with audio requests, their batch, their time."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self.steps = 0
        self.rows = 0
        self.timed_steps = 0
        self.step_s = 0.0
        self._last: float | None = None
        self._sent_at: float | None = None

    def step(self, batch: int) -> StepStats | None:
        """Count a step of ``batch`` audio requests; the counters when it is time
        to send them again (else None)."""
        now = self._clock()
        self.steps += 1
        self.rows += batch
        if self._last is not None and now - self._last <= _IDLE_GAP_S:
            self.timed_steps += 1
            self.step_s += now - self._last
        self._last = now
        if self._sent_at is not None and now - self._sent_at < STATS_INTERVAL_S:
            return None
        self._sent_at = now
        return StepStats(self.steps, self.rows, self.timed_steps, self.step_s)


class StepEvent(Protocol):
    """What the host asks of a step's completion event (``torch.cuda.Event``)."""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


@dataclass
class _Status:
    """One step's status on its way to the host."""

    event: StepEvent | None
    host: torch.Tensor  # [B, 3] int64: valid, done, row index
    keys: list[str | None]  # audio request per batch row
    # The pinned buffer ``host`` lives in (CUDA), given back once applied unless
    # ``kept``: a watcher or an assumption reads it later.
    buffer: PinnedBuffer | None = None
    kept: bool = False
    applied: bool = False  # taken off the queue and applied


@dataclass(frozen=True)
class _Watch:
    """A status for the watcher: its event, and the stream the step ran on."""

    event: StepEvent
    stream: torch.cuda.Stream | None
    # A status handed over (``decode_thread``): not waited for once applied,
    # since its event may be recorded again for a later step by then.
    status: _Status | None = None


@dataclass(frozen=True)
class _Outgoing:
    """PCM (or a failure) ready to send once ``event`` completes."""

    event: torch.cuda.Event | None
    host: torch.Tensor | None  # [n, samples] float32
    plans: list[ChunkPlan]
    endpoints: list[str]
    stamps: list[dict[str, float] | None]
    failure: tuple[str, str] | None = None  # correlation id, reason
    # Per plan: the request's rows on the host ([n, 8] int16), for requests that
    # asked for them on their final chunk (copied behind ``rows_event``).
    rows: list[torch.Tensor | None] | None = None
    rows_event: torch.cuda.Event | None = None
    stats: StepStats | None = None  # step counters for every endpoint instead
    # Per plan: the rows its chunk assumed (sent only if they held), or None.
    assumed: list[AssumedRows | None] | None = None
    buffer: PinnedBuffer | None = None  # where ``host`` lives: given back once sent


class VllmAudio:
    """Per-request audio state of the worker, over the talker's slot table."""

    def __init__(
        self,
        codec: CodecDecoder,
        table: torch.Tensor,
        *,
        max_batch: int = 64,
        keep: int = 128,
        graphs: bool = False,
        kernels: str = DEFAULT_CODEC_KERNELS,
        stream_priority: str = DEFAULT_CODEC_STREAM_PRIORITY,
        step_event: Callable[[], StepEvent] | None = None,
        watchdog: DeviceWatchdog | None = None,
        clock: Callable[[], float] = time.perf_counter,
        watch_first_chunks: bool | None = None,
        first_chunks_ahead: bool | None = None,
        decode_thread: bool = False,
        gemm_channels: GemmChannels = "auto",
        compile_mode: str = DEFAULT_CODEC_COMPILE_MODE,
        frames_per_call: int = DEFAULT_CODEC_FRAMES_PER_CALL,
        fused_units: FusedUnitsOption = DEFAULT_FUSED_UNITS,
        gemm_taps: GemmTaps = DEFAULT_GEMM_TAPS,
    ) -> None:
        """``step_event``: on CPU, where a step is complete when the host has it,
        makes each step's status wait for an event of this factory instead (to
        drive the device's ordering without one). ``watchdog`` times the waits
        on events (on CUDA, the process's by default). ``watch_first_chunks``:
        run the watcher thread (default: on CUDA). ``first_chunks_ahead``: cut
        first chunks ahead of their statuses (default: on CUDA).
        ``decode_thread``: above :data:`WATCH_MAX_BATCH`, the watcher applies
        every status and decodes its audio as soon as its event completes, and
        the engine's thread only queues statuses (and still decodes what
        ``remove`` needs); an experiment, off (see the module's notes).
        ``gemm_channels``: the codec's wide convolutions as matrix products
        (:class:`~realtime_engine.codec.causal.CausalDac`; by default where the
        weights are float16). ``compile_mode``: how torch.compile builds the
        compiled codec step (:class:`~realtime_engine.talker.codec_slots.CodecSlots`).
        ``frames_per_call``: the most frames a slot steps in one codec call
        (:class:`~realtime_engine.talker.slot_codec.SlotCodec`). ``fused_units``:
        the codec's narrow residual units, or (``"narrow"``) all its narrow layers, as
        one kernel each (by default all on CUDA, none elsewhere). ``gemm_taps``: how
        the products take their taps (CausalDac's; shifted views by default)."""
        self._step_event = step_event
        self.codec = SlotCodec(
            codec,
            slots=table.shape[0],
            max_batch=max_batch,
            graphs=graphs,
            kernels=kernels,
            stream_priority=stream_priority,
            gemm_channels=gemm_channels,
            compile_mode=compile_mode,
            frames_per_call=frames_per_call,
            fused_units=fused_units,
            gemm_taps=gemm_taps,
        )
        # Streams of requests vLLM removed unfinished (preempted or aborted).
        self._detached: OrderedDict[str, SlotStream] = OrderedDict()
        self._keep = keep
        self.table = table
        self.device = table.device
        self._cuda = self.device.type == "cuda"
        self._statuses: deque[_Status] = deque()
        self._args: dict[str, TalkerArgs] = {}
        self._pusher = RowPusher()
        # statuses' and chunks' host memory and events, made once and reused
        self._buffers = PinnedBuffers(cuda=self._cuda)
        self._outgoing: queue.Queue[_Outgoing] = queue.Queue(maxsize=_QUEUE_BATCHES)
        self._watchdog = watchdog
        self.steps = StepCounter(clock)
        # Held by every entry point: the engine's thread and the watcher's.
        self._lock = threading.Lock()
        self._watched: queue.SimpleQueue[_Watch] = queue.SimpleQueue()
        self._watching = self._cuda if watch_first_chunks is None else watch_first_chunks
        self._decode_thread = decode_thread
        self._handed_off = False  # the last step's status went to the watcher
        self._ahead = self._cuda if first_chunks_ahead is None else first_chunks_ahead
        # Requests whose rows were counted before their statuses landed.
        self._assumed: dict[str, AssumedRows] = {}
        if self._cuda:
            if self._watchdog is None:
                self._watchdog = process_watchdog()
            threading.Thread(target=self._drain, name="talker-audio-sender", daemon=True).start()
        if self._watching or decode_thread:
            threading.Thread(target=self._watch, name="talker-first-chunks", daemon=True).start()

    def warm_up(self) -> None:
        """Capture the codec step (CUDA): called at vLLM's start-up profiling run,
        so the KV cache is sized with the codec's memory accounted for, and the
        codec's kernels are loaded before any request."""
        self.codec.warm_up()

    # -- request lifecycle ------------------------------------------------------

    def fence(self) -> None:
        """The talker is about to write into a slot (admission): order that after
        the codec's reads of the slot's previous request."""
        with self._lock:
            self.codec.fence()

    def open(self, args: TalkerArgs, slot: int, prompt_len: int) -> None:
        with self._lock:
            self._args[args.correlation_id] = args
            self._assumed.pop(args.correlation_id, None)
            self.codec.open(args.correlation_id, slot, prompt_len, args.chunking_params())

    def resume(self, args: TalkerArgs, slot: int) -> bool:
        """A preempted request is back in ``slot`` (its rows restored there): go on
        where its audio stopped. False when its state is gone."""
        with self._lock:
            stream = self._detached.pop(args.correlation_id, None)
            if stream is None:
                return False
            self._args[args.correlation_id] = args
            self.codec.attach(stream, slot)
            return True

    def remove(self, key: str) -> bool:
        """vLLM let go of ``key``: send what its known rows allow, and keep its state
        in case it comes back (preemption; bounded, oldest dropped first).

        Never waits: a request vLLM saw finish has its last status on the host
        already (vLLM learnt of the end from a token copied after it), so its
        final chunk goes out now, before the slot is reused. Statuses still on
        their way for an aborted or preempted request update the kept state.

        True when the request may come back (its audio had not ended).
        """
        with self._lock:
            self._settle()
            self._decode_due()
            stream = self.codec.detach(key)
            self._args.pop(key, None)
            if stream is None:
                return False
            self._detached[key] = stream
            while len(self._detached) > self._keep:
                self._detached.popitem(last=False)
            return True

    def fail(self, args: TalkerArgs, reason: str) -> None:
        failure = (args.correlation_id, reason)
        self._send(_Outgoing(None, None, [], [args.endpoint], [None], failure))

    # -- per step -------------------------------------------------------------------

    def after_step(self, packed: torch.Tensor, keys: list[str | None]) -> None:
        """The sampler wrote this step's rows; ``packed`` ``[B, N + 3]`` (see
        :meth:`StepRows.packed`), ``keys`` the audio request of each batch row."""
        batch = len(keys) - keys.count(None)
        with self._lock:
            ahead = False
            if batch:
                self._count_step(batch)
                status = packed[:, NUM_CODEBOOKS:]
                buffer = self._buffers.take(status.numel(), status.dtype)
                host = buffer.view(tuple(status.shape))
                host.copy_(status, non_blocking=self._cuda)
                event: StepEvent | None = buffer.event
                if buffer.event is not None:
                    buffer.event.record()
                elif self._step_event is not None:
                    event = self._step_event()
                self._statuses.append(_Status(event, host, keys, buffer))
                pending = self._statuses[-1]
                self._handed_off = self._decode_thread and batch > WATCH_MAX_BATCH
                if self._handed_off:
                    self._hand_off(pending)
                    return
                self._settle()
                if batch <= WATCH_MAX_BATCH and self._statuses and self._statuses[-1] is pending:
                    ahead = self._ahead and self._assume_first_chunks(pending)
                    if self._watching and not ahead:
                        self._watch_if_first_chunk(pending)
            else:
                self._settle()
            # rows assumed are not written yet: the codec waits for this step
            self._decode_due(rows_written=not ahead)

    def poll(self) -> None:
        """Decode what the statuses on the host so far allow (never waits)."""
        if self._handed_off:  # the watcher does, as each status lands
            return
        with self._lock:
            if self._statuses:
                self._settle()
                self._decode_due()

    # -- first chunks ahead of their statuses ------------------------------------------

    def _assume_first_chunks(self, status: _Status) -> bool:
        """Count the rows of the statuses on their way (``status`` the newest) as
        written for each request they would give its first chunk (see
        :mod:`.chunk_ahead`); whether any was."""
        if status.event is None:
            return False
        # the rows of the earlier statuses on their way (up to ``earlier``)
        earlier = self._statuses[-2] if len(self._statuses) > 1 else None
        counts: list[tuple[str, int]] = []  # (request, rows counted)
        for batch_row, key in enumerate(status.keys):
            stream = self.codec.get(key) if key is not None else None
            if stream is None or key in self._assumed or stream.replay:
                continue
            if stream.rows < 1 or stream.emitted > 0 or stream.final or stream.ended:
                continue
            rows = stream.rows + sum(key in s.keys for s in self._statuses)
            if rows < stream.next_rows:
                continue
            self._assumed[stream.key] = AssumedRows(
                host=status.host,
                batch_row=batch_row,
                index=rows - 1,
                rows=stream.rows,
                fed=stream.fed,
                emitted=stream.emitted,
                next_rows=stream.next_rows,
                first_planned_at=stream.first_planned_at,
            )
            counts.append((stream.key, rows))
            status.kept = True  # the sender reads it to check the assumption
        if earlier is not None and earlier.event is not None and counts:
            # frames the earlier steps complete wait for those steps only, so
            # they decode while the newest step still runs
            for key, rows in counts:
                self.codec.advance(key, rows - 1)
            self._feed(written_by=earlier.event)
        for key, rows in counts:
            self.codec.advance(key, rows)
        return bool(counts)

    def _decide(
        self, key: str, stream: SlotStream | None, status: _Status, row: tuple[int, int, int]
    ) -> None:
        """Settle an assumption about ``key``'s rows that ``status`` decides or
        refutes: a failed one rewinds the request's decoding."""
        assumed = self._assumed.get(key)
        valid, done, index = row
        deciding = assumed is not None and status.host is assumed.host
        if assumed is None or not (deciding or refutes(bool(valid), bool(done))):
            return
        del self._assumed[key]
        if deciding and valid and index == assumed.index:
            return
        if stream is not None:
            self.codec.rewind(
                stream,
                rows=assumed.rows,
                fed=assumed.fed,
                emitted=assumed.emitted,
                next_rows=assumed.next_rows,
                first_planned_at=assumed.first_planned_at,
            )

    # -- the watcher ------------------------------------------------------------------

    def _hand_off(self, status: _Status) -> None:
        """Leave ``status`` to the watcher, which applies it and decodes once its
        event completes (``decode_thread``). The engine's thread may apply it
        first (``remove``): the watcher then does not wait for its event, which
        may be recorded again for a later step. (Between the watcher's check and
        its wait that can still happen: it then waits for that later step.)"""
        if status.event is None:  # the host has it already
            self._settle()
            self._decode_due()
            return
        engine_stream = torch.cuda.current_stream(self.device) if self._cuda else None
        self._watched.put(_Watch(status.event, engine_stream, status))

    def _watch_if_first_chunk(self, status: _Status) -> None:
        """Hand ``status`` to the watcher when it may make a request's first chunk
        due: the request has no chunk yet and the rows of every status not yet
        applied (this one's included) would reach the chunk's row."""
        if status.event is None:
            return
        pending = len(self._statuses)
        for key in status.keys:
            stream = self.codec.get(key) if key is not None else None
            if stream is None or stream.emitted > 0 or stream.ended:
                continue
            if stream.rows + pending >= stream.next_rows:
                status.kept = True  # the watcher waits for its event
                engine_stream = torch.cuda.current_stream(self.device) if self._cuda else None
                self._watched.put(_Watch(status.event, engine_stream))
                return

    def _watch(self) -> None:
        if self._cuda:
            torch.cuda.set_device(self.device)  # a new thread starts on device 0
        while True:
            watch = self._watched.get()
            try:
                if watch.status is None or not watch.status.applied:
                    self._wait(watch.event, "a step's status")
                # the engine's thread may have applied it meanwhile: then this is cheap
                with self._lock, self._on_engine_stream(watch.stream):
                    self._settle()
                    self._decode_due()
            except Exception:
                logger.exception("cutting a first chunk early failed")

    def _on_engine_stream(self, stream: torch.cuda.Stream | None) -> AbstractContextManager[Any]:
        """Device work enqueued from the watcher goes where the engine's thread
        would have put it: on the stream that was current at its step."""
        return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()

    def _settle(self) -> None:
        """Apply the statuses that reached the host, oldest first (never waits: the
        first one still on its way stops the walk)."""
        while self._statuses:
            status = self._statuses[0]
            if status.event is not None and not status.event.query():
                return
            self._statuses.popleft()
            status.applied = True
            now = time.perf_counter()
            values = status.host.tolist()
            if status.buffer is not None and not status.kept:
                self._buffers.give_back(status.buffer)
            # Every step runs this over every request: lookups bound once.
            attached_of, detached_of = self.codec.get, self._detached.get
            advance, assumed = self.codec.advance_stream, self._assumed
            for key, (valid, done, index) in zip(status.keys, values, strict=True):
                if key is None:
                    continue
                attached = attached_of(key)
                stream = attached or detached_of(key)
                if assumed:
                    self._decide(key, stream, status, (valid, done, index))
                if stream is None or not valid:
                    continue
                if index < NUM_CODEBOOKS:
                    if index == 0:
                        stream.stamps.setdefault("first_row", now)
                    if index == NUM_CODEBOOKS - 1:  # codebook 7 of frame 0 arrives here
                        stream.stamps.setdefault("first_frame_row", now)
                if attached is None:  # a preempted request's last rows: kept for its return
                    stream.rows = max(stream.rows, index + 1)
                    stream.final = stream.final or bool(done)
                else:
                    advance(attached, index + 1, bool(done))

    def _decode_due(self, *, rows_written: bool = True) -> None:
        """``rows_written``: only rows of statuses whose event completed were
        advanced (none assumed), so the codec need not wait for the talker."""
        now = time.perf_counter()
        if not self._feed(rows_written=rows_written, now=now):
            return
        plans = self.codec.due(now)
        for batch in self.codec.batches(plans):
            try:
                self._decode(batch)
            except Exception as e:
                self._fail_plans(batch, e)
        for plan in plans:
            if plan.emit == 0:  # nothing to decode: only the end of the audio
                self._queue([plan], None, None)

    def _feed(
        self,
        *,
        rows_written: bool = False,
        written_by: StepEvent | None = None,
        now: float | None = None,
    ) -> bool:
        """:meth:`SlotCodec.feed`; whether it went well (a codec failure fails its
        requests, not the engine)."""
        try:
            self.codec.feed(self.table, rows_written=rows_written, written_by=written_by, now=now)
        except Exception as e:
            self._fail_keys(self.codec.active(), e)
            return False
        return True

    def _decode(self, plans: list[ChunkPlan]) -> None:
        if not self._cuda:
            self._queue(plans, None, self.codec.decode(plans))
            return
        with self.codec.on_codec_stream():
            pcm = self.codec.decode(plans)
            buffer = self._buffers.take(pcm.numel(), torch.float32)
            host = buffer.view(tuple(pcm.shape))
            host.copy_(pcm, non_blocking=True)
            assert buffer.event is not None
            buffer.event.record()
        self._queue(plans, buffer.event, host, buffer)

    def _queue(
        self,
        plans: list[ChunkPlan],
        event: torch.cuda.Event | None,
        pcm: torch.Tensor | None,
        buffer: PinnedBuffer | None = None,
    ) -> None:
        endpoints, stamps = [], []
        rows: list[torch.Tensor | None] = []
        assumed: list[AssumedRows | None] = []
        for plan in plans:
            args = self._args.get(plan.key)
            stream = self.codec.get(plan.key)
            assumed.append(self._assumed.get(plan.key) if plan.emit > 0 else None)
            endpoints.append(args.endpoint if args is not None else "")
            first = plan.first_frame == 0 or plan.emit == 0
            stamps.append(dict(stream.stamps) if stream is not None and first else None)
            wanted = plan.final and args is not None and args.return_rows and stream is not None
            rows.append(self._rows_to_host(stream) if wanted and stream is not None else None)
        rows_event = None
        if self._cuda and any(r is not None for r in rows):
            rows_event = torch.cuda.Event()
            rows_event.record()
        self._send(
            _Outgoing(
                event,
                pcm,
                plans,
                endpoints,
                stamps,
                rows=rows,
                rows_event=rows_event,
                assumed=assumed if any(a is not None for a in assumed) else None,
                buffer=buffer,
            )
        )

    def _rows_to_host(self, stream: SlotStream) -> torch.Tensor:
        """A request's rows, copied off the table on the current stream (ordered before
        any later request's writes to the slot); never waited on here."""
        n = min(stream.rows, MAX_RETURNED_ROWS)
        rows = self.table[stream.slot, stream.base : stream.base + n]
        if not self._cuda:
            return rows.to(torch.int16).clone()
        host = torch.empty(rows.shape, dtype=torch.int16, pin_memory=True)
        host.copy_(rows, non_blocking=True)
        return host

    def _fail_plans(self, plans: list[ChunkPlan], error: Exception) -> None:
        self._fail_keys([plan.key for plan in plans], error)

    def _fail_keys(self, keys: list[str], error: Exception) -> None:
        logger.exception("codec decode failed", exc_info=error)
        for key in keys:
            args = self._args.get(key)
            self._assumed.pop(key, None)
            self.codec.detach(key)
            if args is not None:
                self.fail(args, f"codec decode failed: {error}")

    def _count_step(self, batch: int) -> None:
        stats = self.steps.step(batch)
        if stats is None:
            return
        endpoints = sorted({args.endpoint for args in self._args.values()})
        if endpoints:
            self._send(_Outgoing(None, None, [], endpoints, [], stats=stats))

    # -- sending ---------------------------------------------------------------------

    def _send(self, item: _Outgoing) -> None:
        if self._cuda:
            self._outgoing.put(item)
        else:
            self._push(item)

    def _push(self, item: _Outgoing) -> None:
        if item.failure is not None:
            self._pusher.push_failure(item.endpoints[0], *item.failure)
            return
        if item.stats is not None:
            for endpoint in item.endpoints:
                self._pusher.push_stats(endpoint, item.stats)
            return
        if item.event is not None:
            self._wait(item.event, "a batch of chunks")
        if item.rows_event is not None:
            self._wait(item.rows_event, "a request's rows")
        pcm = None if item.host is None else item.host.numpy()
        groups: dict[str, tuple[list[PcmHeader], list[np.ndarray]]] = {}
        for i, plan in enumerate(item.plans):
            if not item.endpoints[i]:
                continue
            assumed = item.assumed[i] if item.assumed is not None else None
            stamps = item.stamps[i]
            if assumed is not None:
                if not assumed.held():  # cut from rows that were never written
                    continue
                if stamps is not None:  # its rows were confirmed just now
                    now = time.perf_counter()
                    stamps.setdefault("first_frame_row", now)
                    stamps.setdefault("first_row", now)
            samples = plan.emit * self.codec.hop
            chunk = np.zeros(0, np.float32) if pcm is None else pcm[i, :samples]
            headers, chunks = groups.setdefault(item.endpoints[i], ([], []))
            rows = None if item.rows is None else item.rows[i]
            headers.append(
                PcmHeader(
                    plan.key,
                    plan.first_frame,
                    samples,
                    plan.final,
                    stamps,
                    None if rows is None else rows.numpy(),
                )
            )
            chunks.append(chunk)
        for endpoint, (headers, chunks) in groups.items():
            self._pusher.push_pcm(endpoint, headers, chunks)

    def _wait(self, event: StepEvent, what: str) -> None:
        if self._watchdog is None:
            event.synchronize()
        else:
            self._watchdog.synchronize(event, what)

    def _drain(self) -> None:
        while True:
            item = self._outgoing.get()
            try:
                self._push(item)
            except Exception:
                logger.exception("sending talker audio failed")
            # its copy completed and the PCM is sent (a failed wait keeps it out)
            if item.buffer is not None and (item.event is None or item.event.query()):
                self._buffers.give_back(item.buffer)
            self._outgoing.task_done()  # for a caller that waits for everything sent
