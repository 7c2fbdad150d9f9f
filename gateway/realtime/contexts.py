"""Per-context synthesis: segments in order, bounded look-ahead, encode, frame.

A ``ContextWorker`` turns a context's segments into audio, one engine request
at a time, in order, and puts frames and events on the session's bounded
outbound queue (``gateway.realtime.outbound``). From a self-paced engine (one
that makes a request's audio whether or not it is read, as the Higgs talkers
do in their own process or thread), a server that sets ``read_ahead_s`` has
each request's audio read as it comes, up to that far ahead of what was sent
(``gateway.realtime.segment_pull``), so the next segment goes to the engine as
soon as the engine is done with the previous one, while that one's audio may
still wait for its encoding. By default, and from other engines, audio is read
in step with the sending. Generation runs ahead of real-time
playback by at most ``max_lead_s`` so a barge-in wastes little engine work.
A failure ends only this context: an ``error`` then ``context.done{failed}``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import numpy as np

from gateway.availability import RETRY_ENGINE_DEAD_MS
from gateway.encode_pool import EncodePool
from gateway.engine_health import engine_failure
from gateway.protocol import (
    ErrorCode,
    ErrorDetail,
    SegmentDone,
    SegmentStarted,
    TextFlushed,
    pack_audio_frame,
    voice_store_unavailable,
)
from gateway.protocol.audio_delta import AudioDeltaWriter
from gateway.realtime.context_stats import ENGINE_STAGES as ENGINE_STAGES
from gateway.realtime.context_stats import ContextStats
from gateway.realtime.engine_wait import next_chunk_or_stall
from gateway.realtime.outbound import (
    OutAudio,
    Outbound,
    OutDone,
    OutEvent,
)
from gateway.realtime.segment_pull import PULL_END, Inbox, PullEnd, SegmentPull
from gateway.realtime.session import EndContext, Flush, OpenContext, Speak, error_event
from gateway.voices import VoiceNotFoundError, VoiceStoreError
from realtime_engine.audio.encoder import AudioEncoder, EncodedFrame
from realtime_engine.engines.base import (
    ChunkingParams,
    EngineDeadError,
    EngineError,
    EngineOverloadedError,
    SegmentRequest,
    SegmentTimings,
    SpeechEngine,
    UnsupportedVoiceError,
    VoiceReference,
)
from realtime_engine.engines.continuity import VoiceContinuity
from realtime_engine.talker.types import TalkerSampling

log = logging.getLogger("gateway.realtime.contexts")
VoiceResolver = Callable[[str], Awaitable[VoiceReference | None]]

# How long a context failed from outside waits for its task's cleanup.
FAIL_UNWIND_S = 1.0
# The default ``read_ahead_s``: none. Reading ahead starts a context's next
# segment earlier, but each second of it is audio made for a listener who may
# stop (a cut, a barge-in) before it is sent: on an H200 at 256 streams that
# cut 10 s in, it wasted 9.5% of the talker's audio against 1% and served
# 392-406 audio-s/s against 441-468 (docs/bench/RESULTS.md, section 17).
DEFAULT_READ_AHEAD_S = 0.0


def to_engine_request(
    request_id: str,
    spec: OpenContext,
    text: str,
    timings: SegmentTimings | None = None,
    reference: VoiceReference | None = None,
    continuity: VoiceContinuity | None = None,
) -> SegmentRequest:
    cfg = spec.config
    chunking = None
    if cfg.chunking is not None:
        chunking = ChunkingParams(**cfg.chunking.model_dump())
    sampling = TalkerSampling(
        temperature=cfg.sampling.temperature,
        top_k=cfg.sampling.top_k,
        top_p=cfg.sampling.top_p,
        seed=cfg.sampling.seed,
    )
    return SegmentRequest(
        request_id=request_id,
        text=text.strip(),  # segments keep their leading whitespace; engines want words
        voice=cfg.voice,
        sampling=sampling,
        chunking=chunking,
        max_audio_seconds=cfg.max_audio_seconds,
        timings=timings,
        reference=reference,
        continuity=continuity,
    )


# The longest first chunk encoded on the event loop (about 4 ms of Opus).
FIRST_CHUNK_INLINE_MAX_MS = 1000.0


class ContextWorker:
    def __init__(
        self,
        spec: OpenContext,
        session_id: str,
        engine: SpeechEngine,
        outbound: Outbound,
        *,
        max_lead_s: float,
        encode_inline_max_ms: float,
        encode_pool: EncodePool | None = None,
        stall_timeout_s: float = 60.0,
        read_ahead_s: float = DEFAULT_READ_AHEAD_S,
        on_closed: Callable[[ContextWorker, str], None],
        on_queue_change: Callable[[int], None] = lambda delta: None,
        resolve_voice: VoiceResolver | None = None,
    ) -> None:
        self.spec = spec
        self.key = spec.key
        self.context_id = spec.context_id
        self.stream = spec.stream
        self.stats = ContextStats()
        self.cancelled = False
        self.finished = False
        self.current_request: str | None = None
        self._session_id = session_id
        self._engine = engine
        self._out = outbound
        self._max_lead_s = max_lead_s
        self._encode_inline_max_ms = encode_inline_max_ms
        self._encode_pool = encode_pool  # None: long chunks are encoded inline too
        self._stall_timeout_s = stall_timeout_s
        self._on_closed = on_closed
        self._on_queue_change = on_queue_change
        self._queued_segments = 0
        self._resolve_voice = resolve_voice
        self._voice_resolved = False
        self._reference: VoiceReference | None = None
        # One voice across the context's segments (realtime_engine.engines.continuity).
        self._continuity = VoiceContinuity()
        # Bounded upstream: the session caps a context's text (max_text_chars_per_context).
        self._inbox: Inbox[Speak | Flush | EndContext] = Inbox()
        # Engine requests read ahead for queued segments, by segment index; the
        # one whose engine request runs (at most one per context at a time).
        self._pulls: dict[int, SegmentPull] = {}
        self._live_pull: SegmentPull | None = None
        # Read ahead only from an engine that makes audio at its own pace anyway
        # (``self_paced``): one that makes it as it is read, on the gateway's
        # own CPU, would make audio for listeners far ahead first.
        self._reads_ahead = read_ahead_s > 0 and bool(getattr(engine, "self_paced", False))
        self._unsent = 0  # samples read from the engine, not yet sent
        self._read_ahead = max(1, int(read_ahead_s * engine.sample_rate))
        self._room = asyncio.Event()  # set while ``_unsent`` is under the read-ahead
        self._room.set()
        self._speaking = False  # a segment's audio is being encoded and sent
        out = spec.config.output
        self._binary = spec.config.audio_transport == "binary"
        self._deltas = AudioDeltaWriter(spec.context_id)
        self._out_rate = out.sample_rate
        self._encoder = self._new_encoder()
        # Input samples of one output packet: what the first packet waits for.
        self._packet_input_samples = max(1, engine.sample_rate * out.frame_ms // 1000)
        self._seq = 0
        self._out_samples = 0  # output samples in frames made so far
        self._base_ms = 0.0  # timeline at the start of the current encoder
        self._fed_in = 0  # input samples fed to the current encoder
        self.task: asyncio.Task[None] | None = None

    def _new_encoder(self) -> AudioEncoder:
        out = self.spec.config.output
        return AudioEncoder(
            out.format, out.sample_rate, frame_ms=out.frame_ms, input_rate=self._engine.sample_rate
        )

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name=f"context-{self.context_id}")

    def submit(self, item: Speak | Flush | EndContext) -> None:
        # Unbounded on purpose: it holds at most the context's own text
        # (max_text_chars_per_context), and the reader must never block on it.
        if isinstance(item, Speak):
            self.stats.segment_texts[item.index] = item.text
            if self.stats.first_ready_at is None:
                self.stats.first_ready_at = item.ready_at
                self.stats.first_segment_chars = len(item.text)
            self._queued_segments += 1
            self._on_queue_change(1)
        self._inbox.put_nowait(item)
        if isinstance(item, Speak) and self._speaking:
            self._pull_next()  # the engine may be free while the last segment is encoded

    @property
    def busy(self) -> bool:
        """Audio is still being made or sent (the session is not idle)."""
        return self.current_request is not None or self._speaking

    # ------------------------------------------------------------------ run loop

    async def _run(self) -> None:
        try:
            while not self.cancelled:
                item = await self._inbox.get()
                if isinstance(item, Speak):
                    self._queued_segments -= 1
                    self._on_queue_change(-1)
                    await self._speak(item)
                elif isinstance(item, Flush):
                    await self._emit_frames(self._restart_encoder())
                    flushed = TextFlushed(
                        context_id=self.context_id, flush_id=item.flush_id, reply_to=item.reply_to
                    )
                    await self._out.put(OutEvent(flushed, worker=self))
                else:
                    await self._emit_frames(self._encoder.finish())
                    self._close("completed")
                    await self._out.put(OutDone(self, "completed", item.reply_to))
                    return
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if self.cancelled:
                return  # engines may raise on abort; the cancel already answered
            await self._fail(e)
        finally:
            # Requests read ahead for segments that will not be spoken: aborted.
            pulls, self._pulls = list(self._pulls.values()), {}
            for pull in pulls:
                await pull.stop()

    async def _fail(self, exc: Exception) -> None:
        dead = engine_failure(self._engine)
        if self.current_request is not None and dead is None:
            await self._engine.abort(self.current_request)
        if dead is not None or isinstance(exc, EngineDeadError):
            # Whichever sees the death first (this stream or the health watch),
            # the client hears the same retryable error.
            detail = ErrorDetail(
                type="server_error",
                code=ErrorCode.ENGINE_UNAVAILABLE,
                message=f"the engine died: {dead or exc}",
                retryable=True,
                retry_after_ms=RETRY_ENGINE_DEAD_MS,
            )
        elif isinstance(exc, VoiceNotFoundError):
            detail = ErrorDetail(
                type="invalid_request_error",
                code=ErrorCode.VOICE_NOT_FOUND,
                message=str(exc),
                param="session.voice",
            )
        elif isinstance(exc, VoiceStoreError):
            detail = voice_store_unavailable(str(exc))
        elif isinstance(exc, UnsupportedVoiceError):
            detail = ErrorDetail(
                type="invalid_request_error", code=ErrorCode.VOICE_UNSUPPORTED, message=str(exc)
            )
        elif isinstance(exc, EngineOverloadedError):
            detail = ErrorDetail(
                type="engine_overloaded",
                code=ErrorCode.ENGINE_OVERLOADED,
                message=str(exc),
                retryable=True,
                retry_after_ms=exc.retry_after_ms,
            )
        elif isinstance(exc, EngineError):
            detail = ErrorDetail(
                type="server_error", code=ErrorCode.ENGINE_ERROR, message=str(exc), retryable=True
            )
        else:
            log.error("context %s failed", self.context_id, exc_info=exc)
            detail = ErrorDetail(
                type="server_error",
                code=ErrorCode.INTERNAL_ERROR,
                message=f"{type(exc).__name__}: {exc}",
            )
        detail.context_id = self.context_id
        self._close("failed")
        await self._out.put(OutEvent(error_event(detail), worker=self))
        await self._out.put(OutDone(self, "failed", None))

    async def fail_now(self, detail: ErrorDetail) -> None:
        """Fail from outside, at once (the engine died): no abort, nothing to stop.

        The task is cancelled and given a moment to unwind (a dead engine may
        not answer its cleanup); the client then gets ``detail`` and
        ``context.done{failed}``, as for a failure the worker saw itself.
        """
        if self.finished:
            return
        self._close("failed")
        task = self.task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.wait({task}, timeout=FAIL_UNWIND_S)
            if task.done() and not task.cancelled() and task.exception() is not None:
                log.info("context %s unwound with %r", self.context_id, task.exception())
        detail = detail.model_copy(update={"context_id": self.context_id})
        await self._out.put(OutEvent(error_event(detail), worker=self))
        await self._out.put(OutDone(self, "failed", None))

    def discard_queued(self) -> None:
        """Drop work that will never reach the engine (and its queue-depth count);
        requests already read ahead for it are cancelled (their cleanup aborts them)."""
        while not self._inbox.empty():
            self._inbox.get_nowait()
        for pull in self._pulls.values():
            if pull.task is not None:
                pull.task.cancel()
        if self._queued_segments:
            self._on_queue_change(-self._queued_segments)
            self._queued_segments = 0

    def _close(self, status: str) -> None:
        self.discard_queued()
        if not self.finished:
            self.finished = True
            self._on_closed(self, status)

    # ------------------------------------------------------------------ one segment

    def timeline_ms(self) -> int:
        return round(self._base_ms + self._fed_in * 1000 / self._engine.sample_rate)

    async def _speak(self, item: Speak) -> None:
        if self.cancelled:
            return
        self._speaking = True
        try:
            if self._reads_ahead:
                await self._speak_read_ahead(item)
            else:
                # In step with the engine: each chunk is sent before the next is read.
                request_id = self._request_id(item)
                timings = SegmentTimings()

                async def deliver(chunk: np.ndarray) -> None:
                    await self._speak_chunk(item, chunk, timings)

                await self._read_engine(item, request_id, timings, deliver)
        finally:
            self._speaking = False
        if item.index not in self.stats.started_segments:
            await self._segment_started(item)
        self.stats.segments_done += 1
        done = SegmentDone(
            context_id=self.context_id, segment=item.index, end_ms=self.timeline_ms()
        )
        await self._out.put(OutEvent(done, worker=self))

    async def _speak_chunk(self, item: Speak, chunk: np.ndarray, timings: SegmentTimings) -> None:
        if self.stats.first_timings is None and len(chunk):
            self.stats.first_timings = timings
        if item.index not in self.stats.started_segments:
            await self._segment_started(item)
        await self._send_audio(chunk)

    async def _speak_read_ahead(self, item: Speak) -> None:
        pull = self._pulls.pop(item.index, None) or self._start_pull(item)
        try:
            while True:
                got = await pull.chunks.get()
                if isinstance(got, PullEnd):
                    return
                if isinstance(got, BaseException):
                    raise got
                await self._speak_chunk(item, got, pull.timings)
                self._unsent -= len(got)
                if self._unsent < self._read_ahead:
                    self._room.set()
        finally:
            # A no-op once the engine was done; else (a failure of ours, a
            # cancel) the engine must not keep generating for nobody.
            await pull.stop()

    # ------------------------------------------------------------------ engine requests

    def _request_id(self, item: Speak) -> str:
        return f"{self._session_id}:{self.key}:{item.index}"

    def _start_pull(self, item: Speak) -> SegmentPull:
        pull = SegmentPull(item.index, self._request_id(item))
        pull.task = asyncio.create_task(self._pull(item, pull), name=f"pull-{pull.request_id}")
        self._live_pull = pull
        return pull

    def _pull_next(self) -> None:
        """Send the next queued segment to the engine now, if none is there: its
        audio is read ahead while earlier audio is still encoded and sent."""
        if not self._reads_ahead or self.cancelled or self.finished or self.task is None:
            return
        if self._live_pull is not None and self._live_pull.running:
            return
        for waiting in self._inbox.waiting():
            if isinstance(waiting, EndContext):
                return
            if isinstance(waiting, Speak) and waiting.index not in self._pulls:
                # in order, however far the sending lags (``read_ahead_s`` bounds it)
                self._pulls[waiting.index] = self._start_pull(waiting)
                return

    async def _pull(self, item: Speak, pull: SegmentPull) -> None:
        async def deliver(chunk: np.ndarray) -> None:
            self._unsent += len(chunk)
            pull.chunks.put_nowait(chunk)
            while self._unsent >= self._read_ahead:  # the client is not keeping up
                self._room.clear()
                await self._room.wait()

        try:
            await self._read_engine(item, pull.request_id, pull.timings, deliver)
        except asyncio.CancelledError as e:
            pull.chunks.put_nowait(e)  # whoever waits on this segment is not left hanging
            raise
        except Exception as e:  # raised where the segment's audio is spoken, in order
            pull.chunks.put_nowait(e)
            return
        finally:
            if self._live_pull is pull:
                self._live_pull = None
        pull.chunks.put_nowait(PULL_END)
        self._pull_next()

    async def _read_engine(
        self,
        item: Speak,
        request_id: str,
        timings: SegmentTimings,
        deliver: Callable[[np.ndarray], Awaitable[None]],
    ) -> None:
        """The segment's engine request, each chunk to ``deliver`` as it comes."""
        if not self._voice_resolved:
            # Once per context: a voice deleted mid-reply still finishes the reply.
            if self._resolve_voice is not None:
                self._reference = await self._resolve_voice(self.spec.config.voice)
            self._voice_resolved = True
        request = to_engine_request(
            request_id, self.spec, item.text, timings, self._reference, self._continuity
        )
        cap = int(self.spec.config.max_audio_seconds * self._engine.sample_rate)
        produced = 0
        if self.stats.first_engine_at is None:
            self.stats.first_engine_at = time.perf_counter()
        self.current_request = request_id
        stream = self._engine.synthesize(request)
        exhausted = False
        try:
            while produced < cap:
                await self._respect_lead()
                chunk = await self._next_chunk(stream, request_id)
                if chunk is None:
                    exhausted = True
                    break
                if produced + len(chunk) >= cap:
                    chunk = chunk[: cap - produced]
                    await self._engine.abort(request_id)  # runaway segment: stop paying for it
                    exhausted = True
                produced += len(chunk)
                await deliver(chunk)
        finally:
            if self.current_request == request_id:
                self.current_request = None
            if not exhausted:
                # Leaving early (a failure, a cancel): the engine must not keep
                # generating for nobody. A no-op if it already stopped.
                await self._engine.abort(request_id)
            await _aclose(stream)

    async def _segment_started(self, item: Speak) -> None:
        self.stats.started_segments.add(item.index)
        event = SegmentStarted(
            context_id=self.context_id,
            segment=item.index,
            text=item.text,
            start_ms=self.timeline_ms(),
        )
        await self._out.put(OutEvent(event, worker=self))

    async def _next_chunk(
        self, stream: AsyncIterator[np.ndarray], request_id: str
    ) -> np.ndarray | None:
        started = time.perf_counter()
        try:
            chunk = await self._await_engine(stream, request_id)
        except StopAsyncIteration:
            return None
        finally:
            self.stats.generation_s += time.perf_counter() - started
        chunk = np.asarray(chunk, dtype=np.float32).reshape(-1)
        self.stats.generated_s += len(chunk) / self._engine.sample_rate
        return chunk

    async def _await_engine(self, stream: AsyncIterator[np.ndarray], request_id: str) -> np.ndarray:
        """The next chunk, or ``EngineError`` (aborted first) when the engine stalls."""
        return await next_chunk_or_stall(
            stream, self._stall_timeout_s, lambda: self._engine.abort(request_id)
        )

    async def _respect_lead(self) -> None:
        """Wait while generated audio is more than ``max_lead_s`` ahead of playback."""
        first = self.stats.first_sent_at
        if first is None:
            return
        lead = self.stats.generated_s - (time.perf_counter() - first)
        if lead > self._max_lead_s:
            await asyncio.sleep(lead - self._max_lead_s)

    async def _send_audio(self, chunk: np.ndarray) -> None:
        """Encode ``chunk`` and queue its frames; the context's first packet leaves
        before the rest of its chunk is encoded (TTFA waits on one frame, not on
        the whole first chunk: 11 ms of Opus for the CPU voice's first clause)."""
        first_audio = self.stats.first_encoded_at is None
        if first_audio and len(chunk) > self._packet_input_samples:
            head = await self._encode(chunk[: self._packet_input_samples], first_audio=True)
            chunk = chunk[self._packet_input_samples :]
            if head:
                await self._emit_frames(head)
                await asyncio.sleep(0)  # the writer sends it now
        await self._emit_frames(await self._encode(chunk, first_audio=first_audio))

    async def _encode(self, chunk: np.ndarray, *, first_audio: bool = False) -> list[EncodedFrame]:
        self._fed_in += len(chunk)
        chunk_ms = len(chunk) * 1000 / self._engine.sample_rate
        # The context's first chunk is encoded here and now: its second packet
        # plays 20-60 ms after the first, and on a worker it could queue behind
        # other streams' long chunks. (Up to a second of it: longer would hold
        # every session's loop.)
        inline_first = first_audio and chunk_ms <= FIRST_CHUNK_INLINE_MAX_MS
        if (
            self._encode_pool is not None
            and chunk_ms > self._encode_inline_max_ms
            and self._encoder.worth_offloading
            and not inline_first
        ):
            job = self._encode_pool.submit(self._playback_deadline(), self._encoder.feed, chunk)
            return await asyncio.wrap_future(job)
        return self._encoder.feed(chunk)

    def _playback_deadline(self) -> float:
        """When this context's listener runs out of audio (``perf_counter`` time):
        its first packet's departure plus the audio queued so far; now, before
        the first packet has left."""
        first = self.stats.first_sent_at
        if first is None:
            return time.perf_counter()
        return first + self._out_samples / self._out_rate

    def _restart_encoder(self) -> list[EncodedFrame]:
        """Push out everything buffered (a flush) and keep the timeline continuous."""
        frames = self._encoder.finish()
        self._encoder = self._new_encoder()
        tail = sum(f.samples for f in frames)
        self._base_ms = (self._out_samples + tail) * 1000 / self._out_rate
        self._fed_in = 0
        return frames

    async def _emit_frames(self, frames: list[EncodedFrame]) -> None:
        if frames and self.stats.first_encoded_at is None:
            self.stats.first_encoded_at = time.perf_counter()
        for frame in frames:
            pts_ms = self._out_samples * 1000 // self._out_rate
            self._out_samples += frame.samples
            duration_ms = frame.samples * 1000 / self._out_rate
            data: str | bytes
            if self._binary:
                data = pack_audio_frame(self.stream, self._seq, pts_ms, frame.payload)
            else:
                data = self._deltas.event(self._seq, pts_ms, frame.payload)
            self._seq += 1
            await self._out.put(OutAudio(self, data, duration_ms))


async def _aclose(stream: AsyncIterator[np.ndarray]) -> None:
    close: Callable[[], Awaitable[None]] | None = getattr(stream, "aclose", None)
    if close is not None:
        await close()
