"""``VllmTalkerRunner``: the talker on vLLM (``AsyncLLM``), streaming audio or code rows.

vLLM's own output per request is just the forced ``<|audio|>`` token. The
audio is decoded inside the engine core, beside the talker, and its PCM
chunks (:meth:`VllmTalkerRunner.speak`) travel separately, pushed by the
worker (see :mod:`realtime_engine.talker.vllm_audio`) to a socket this runner
binds, keyed by a correlation id carried in ``SamplingParams.extra_args``.
Nothing here touches a code row or a GPU.

For tools and tests, :meth:`VllmTalkerRunner.submit` streams the code rows
instead. A request's rows end at the row the worker marks last; if vLLM
finishes the request otherwise (abort, length), only as many rows as tokens
vLLM counted are delivered, which also drops the extra step an async
scheduler may run.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from realtime_engine.codec.streaming import HOP
from realtime_engine.format import DEFAULT_CODEC_KERNELS, DEFAULT_CODEC_PRECISION, ChunkingParams
from realtime_engine.model.tokenizer import HiggsTokenizer, SpecialIds
from realtime_engine.talker.rank_stats import RankReport, RankStats
from realtime_engine.talker.types import PcmChunk, TalkerError, TalkerRequest
from realtime_engine.talker.vllm_engine_config import talker_engine_args
from realtime_engine.talker.vllm_link import EngineLink, EngineRequest, as_link
from realtime_engine.talker.vllm_protocol import (
    Event,
    FailureEvent,
    PcmEvent,
    RowEvent,
    StatsEvent,
    StepStats,
    engine_prompt,
)
from realtime_engine.talker.vllm_requests import row_budget, talker_args
from realtime_engine.talker.vllm_rows import RowReceiver

logger = logging.getLogger(__name__)

# How long rows may trail vLLM's report that a request finished.
ROW_GRACE_S = 30.0


@dataclass(frozen=True)
class _Finished:
    num_tokens: int


@dataclass(frozen=True)
class _Aborted:
    pass


_Item = RowEvent | PcmEvent | FailureEvent | _Finished | _Aborted | BaseException


@dataclass(frozen=True)
class EngineStepStats:
    """The engine cores' step counters, summed (``engine.stats()``, for /metrics)."""

    steps: int
    rows: int
    mean_step_s: float
    waiting: int | None = None  # vLLM's own queue is not seen from here


def sum_step_stats(by_core: dict[int, StepStats]) -> EngineStepStats | None:
    """Counters of every engine core heard from (None before any)."""
    if not by_core:
        return None
    cores = by_core.values()
    timed = sum(s.timed_steps for s in cores)
    mean = sum(s.step_s for s in cores) / timed if timed else 0.0
    return EngineStepStats(sum(s.steps for s in cores), sum(s.rows for s in cores), mean)


class _Stream:
    def __init__(self, request: TalkerRequest, correlation_id: str) -> None:
        self.request = request
        self.correlation_id = correlation_id
        # Bounded by the request itself: at most max_model_len rows plus a few
        # control items (a row is 8 integers).
        self.queue: asyncio.Queue[_Item] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None
        self.done = False
        self.started = time.perf_counter()
        self.rank: int | None = None  # the data-parallel rank serving it, once known
        self.rank_closed = False


class VllmTalkerRunner:
    """:class:`~realtime_engine.talker.types.TalkerRunner` on a vLLM ``AsyncLLM`` engine."""

    def __init__(
        self,
        engine: Any,
        specials: SpecialIds,
        max_model_len: int | None = None,
        *,
        profiler: bool = False,
    ) -> None:
        """``engine``: vLLM's ``AsyncLLM`` in this process, or an
        :class:`~realtime_engine.talker.vllm_link.EngineLink` to one elsewhere.
        ``profiler``: the engine was started with a ``profiler_config``
        (:meth:`toggle_device_trace` may start it)."""
        self._engine: EngineLink | None = as_link(engine)
        self._profiler = profiler
        self._tracing = False
        self._max_model_len = max_model_len
        self._specials = specials
        self._loop: asyncio.AbstractEventLoop | None = None
        self._streams: dict[str, _Stream] = {}
        self._by_request: dict[str, _Stream] = {}
        self._nonce = secrets.token_hex(4)
        self._counter = itertools.count()
        self._receiver = RowReceiver(self._on_event)
        self._ranks = RankStats()
        self._core_steps: dict[int, StepStats] = {}

    @classmethod
    def from_model_dir(
        cls,
        model_dir: str | Path,
        *,
        max_num_seqs: int = 256,
        max_model_len: int = 4096,
        dtype: str = "auto",
        enforce_eager: bool = False,
        gpu_memory_utilization: float = 0.85,
        codec_precision: str = DEFAULT_CODEC_PRECISION,
        codec_batch: int = 64,
        codec_kernels: str = DEFAULT_CODEC_KERNELS,
        **engine_kwargs: Any,
    ) -> VllmTalkerRunner:
        """Start an engine on ``model_dir`` (a Higgs v3 checkpoint directory).

        What the talker needs of vLLM is set by :func:`talker_engine_args`;
        ``engine_kwargs`` are further ``AsyncEngineArgs`` fields (the parallel
        layout among them). The engine core loads the bundled codec too.
        """
        engine = start_vllm_engine(
            model_dir,
            enforce_eager=enforce_eager,
            codec_precision=codec_precision,
            codec_batch=codec_batch,
            codec_kernels=codec_kernels,
            dtype=dtype,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            **engine_kwargs,
        )
        tokenizer = HiggsTokenizer.from_dir(model_dir)
        profiler = bool(engine_kwargs.get("profiler_config"))
        return cls(engine, tokenizer.specials, max_model_len, profiler=profiler)

    # ------------------------------------------------------------ receiving
    def _on_event(self, event: Event) -> None:
        """Receiver thread → event loop."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._dispatch, event)

    def _dispatch(self, event: Event) -> None:
        if isinstance(event, StatsEvent):
            self._core_steps[event.stats.rank or 0] = event.stats
            return
        cid = event.header.correlation_id if isinstance(event, RowEvent) else event.correlation_id
        stream = self._streams.get(cid)
        if stream is not None:  # rows of aborted or finished requests are dropped
            stream.queue.put_nowait(event)

    # ------------------------------------------------------------ requests
    def submit(self, request: TalkerRequest) -> AsyncIterator[np.ndarray]:
        return self._rows(self._start(request, None))

    def speak(self, request: TalkerRequest, chunking: ChunkingParams) -> AsyncIterator[PcmChunk]:
        return self._chunks(self._start(request, chunking))

    def _start(self, request: TalkerRequest, chunking: ChunkingParams | None) -> _Stream:
        if self._engine is None:
            raise TalkerError("the runner is closed")
        self._loop = asyncio.get_running_loop()
        if request.request_id in self._by_request:
            raise TalkerError(f"request {request.request_id!r} is already running")
        ids, offset, rows = engine_prompt(request, self._specials)
        cid = f"{self._nonce}-{next(self._counter)}"
        max_new, fixed = row_budget(request, len(ids), self._max_model_len)
        args = talker_args(
            request,
            cid,
            self._receiver.endpoint,
            self._specials,
            (max_new, fixed),
            (offset, rows),
            chunking,
        )
        limit = fixed if fixed is not None else int(max_new or 0)
        engine_request = EngineRequest(
            request.request_id,
            [int(t) for t in ids],
            # The worker stops the request itself; this is only a backstop.
            max(limit, 1) + 1,
            [self._specials.eos],
            args.to_extra_args(),
        )
        stream = _Stream(request, cid)
        self._streams[cid] = stream
        self._by_request[request.request_id] = stream
        stream.task = asyncio.create_task(self._drive(stream, self._engine, engine_request))
        return stream

    async def _drive(self, stream: _Stream, engine: EngineLink, request: EngineRequest) -> None:
        """Run vLLM's side of the request; report how many steps it counted."""
        try:
            n = await engine.run(request)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            stream.queue.put_nowait(TalkerError(f"engine failed: {e}"))
            return
        stream.queue.put_nowait(_Finished(n))

    async def _rows(self, stream: _Stream) -> AsyncIterator[np.ndarray]:
        received = 0
        limit: int | None = None
        try:
            while limit is None or received < limit:
                timeout = ROW_GRACE_S if limit is not None else None
                try:
                    item = await asyncio.wait_for(stream.queue.get(), timeout)
                except TimeoutError as e:
                    raise TalkerError(
                        f"only {received} of the {limit} rows vLLM counted arrived"
                    ) from e
                if isinstance(item, RowEvent):
                    if item.header.index != received:
                        raise TalkerError(
                            f"row {received} expected, got {item.header.index} (rows were lost)"
                        )
                    if received == 0 and stream.request.timings is not None:
                        # vLLM samples the first row in the prefill step itself:
                        # its arrival is when prefill has finished.
                        stream.request.timings.prefilled = time.perf_counter()
                    received += 1
                    yield item.row
                    if item.header.last:
                        return
                elif isinstance(item, _Finished):
                    limit = item.num_tokens
                elif isinstance(item, FailureEvent):
                    raise TalkerError(item.reason)
                elif isinstance(item, _Aborted):
                    return
                elif isinstance(item, PcmEvent):
                    raise TalkerError("the worker sent audio for a rows request")
                else:
                    raise item
        finally:
            await self._release(stream)

    async def _chunks(self, stream: _Stream) -> AsyncIterator[PcmChunk]:
        frame = 0
        finished = False
        try:
            while True:
                timeout = ROW_GRACE_S if finished else None
                try:
                    item = await asyncio.wait_for(stream.queue.get(), timeout)
                except TimeoutError as e:
                    raise TalkerError("the request finished but its last audio never came") from e
                if isinstance(item, PcmEvent):
                    chunk = item.chunk
                    if chunk.start_frame != frame:
                        raise TalkerError(
                            f"audio from frame {frame} expected, got {chunk.start_frame} "
                            "(a chunk was lost)"
                        )
                    frame += chunk.pcm.size // HOP
                    self._count(stream, item)
                    if item.stamps:
                        _stamp(stream.request, item.stamps)
                    yield chunk
                    if chunk.final:
                        return
                elif isinstance(item, _Finished):
                    finished = True  # the last chunk may still be on its way
                elif isinstance(item, FailureEvent):
                    raise TalkerError(item.reason)
                elif isinstance(item, _Aborted):
                    return
                elif isinstance(item, RowEvent):
                    raise TalkerError("the worker sent rows for an audio request")
                else:
                    raise item
        finally:
            await self._release(stream)

    def _count(self, stream: _Stream, item: PcmEvent) -> None:
        if item.rank is None:
            return
        first = stream.rank is None
        stream.rank = item.rank
        waited = time.perf_counter() - stream.started if first else None
        self._ranks.chunk(item.rank, item.chunk.pcm.size, waited)

    def _close_rank(self, stream: _Stream) -> None:
        if stream.rank is not None and not stream.rank_closed:
            stream.rank_closed = True
            self._ranks.ended(stream.rank)

    def stats(self) -> EngineStepStats | None:
        """Sampling steps, their batch and time in the engine cores (for /metrics)."""
        return sum_step_stats(self._core_steps)

    def rank_stats(self) -> RankReport:
        """What each data-parallel rank served (``rank``-labelled metrics)."""
        return self._ranks.report()

    async def _release(self, stream: _Stream) -> None:
        if stream.done:
            return
        stream.done = True
        self._close_rank(stream)
        self._streams.pop(stream.correlation_id, None)
        if self._by_request.get(stream.request.request_id) is stream:
            del self._by_request[stream.request.request_id]
        task = stream.task
        if task is not None and not task.done():
            # Consumer left early: stop the engine's work on it too.
            if self._engine is not None:
                await self._engine.abort(stream.request.request_id)
            task.cancel()

    async def abort(self, request_id: str) -> None:
        stream = self._by_request.pop(request_id, None)
        if stream is None:
            return
        # Forget it now: its iterator may never be resumed to clean up itself.
        self._streams.pop(stream.correlation_id, None)
        self._close_rank(stream)
        if self._engine is not None:
            await self._engine.abort(request_id)
        stream.queue.put_nowait(_Aborted())

    async def toggle_device_trace(self) -> str:
        """Start vLLM's torch profiler in the engine core, or stop the one running
        (the trace is written to the ``profiler_config``'s directory on stop)."""
        if not self._profiler or self._engine is None:
            raise TalkerError(
                "no device trace without a profiler: start the talker with "
                'engine_args {"profiler_config": {"profiler": "torch", "torch_profiler_dir": DIR}}'
            )
        if self._tracing:
            self._tracing = False
            await self._engine.stop_profile()
            return "stopped"
        await self._engine.start_profile()
        self._tracing = True
        return "started"

    def failure(self) -> str | None:
        """Why the vLLM engine is dead (its engine core process exited), else None."""
        return None if self._engine is None else self._engine.failure()

    async def close(self) -> None:
        if self._engine is None:
            return
        for stream in list(self._streams.values()):
            await self.abort(stream.request.request_id)
        engine, self._engine = self._engine, None
        engine.shutdown()
        self._receiver.close()


def _stamp(request: TalkerRequest, stamps: dict[str, float]) -> None:
    """The worker's stage stamps (same host, same monotonic clock) into the request."""
    timings = request.timings
    if timings is None:
        return
    first_row = stamps.get("first_row")
    if first_row is not None:
        # vLLM samples the first row in the prefill step itself.
        timings.prefilled = timings.prefilled or first_row
        timings.first_row = timings.first_row or first_row
    timings.first_frame_row = timings.first_frame_row or stamps.get("first_frame_row")


def start_vllm_engine(model_dir: str | Path, **engine_kwargs: Any) -> Any:
    """vLLM's ``AsyncLLM`` for the Higgs talker on ``model_dir``, its engine core
    started (which loads the bundled codec too). ``engine_kwargs``: those of
    :func:`talker_engine_args`, then further ``AsyncEngineArgs`` fields."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_engine_args(
        AsyncEngineArgs(**talker_engine_args(model_dir, **engine_kwargs))
    )
