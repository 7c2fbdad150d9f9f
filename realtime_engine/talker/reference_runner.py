"""In-process PyTorch talker runner with continuous batching on a worker thread.

One thread owns the model. Between decode steps it admits new requests
(prefill), drops aborted ones, then runs one step for every request whose
consumer keeps up: sample a row per request from its last hidden state,
advance its delay/termination state, hand the row to the request's asyncio
consumer, and feed the fused embedding of the row back through the model.
Each request keeps its own KV cache, random stream and slot in the batched
termination state, so requests join and leave at any step.

Audio (:meth:`ReferenceRunner.speak`): the rows stay on the runner's device
and are decoded into PCM chunks on this same thread, batched over the requests
with a chunk due (:mod:`.reference_audio`).

Back-pressure: a request whose consumer holds ``queue_rows`` undelivered rows
(or frames of audio) sits out steps until the consumer catches up; others
keep going.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import numpy as np
import torch

from realtime_engine.format import DEFAULT_CODEC_KERNELS
from realtime_engine.talker.reference_streams import (
    END,
    End,
    RunnerStats,
    RunnerStream,
    TalkerModel,
    queue_weight,
)
from realtime_engine.talker.sampling import BatchSampling, RequestNoise, push_history, sample_codes
from realtime_engine.talker.termination import BatchTermination, eoc_bounds
from realtime_engine.talker.types import NUM_CODEBOOKS, PcmChunk, TalkerError, TalkerRequest

if TYPE_CHECKING:
    from realtime_engine.codec.decoder import CodecDecoder
    from realtime_engine.format import ChunkingParams
    from realtime_engine.talker.reference_audio import ReferenceAudio

# Codes remembered per codebook for repetition-aware sampling; the widest
# RAS window a request may ask for.
HISTORY_WIDTH = 32


class ReferenceRunner:
    """:class:`~realtime_engine.talker.types.TalkerRunner` over a PyTorch talker."""

    def __init__(
        self,
        model: TalkerModel,
        device: torch.device | str | None = None,
        *,
        max_batch: int = 32,
        queue_rows: int = 64,
        max_positions: int | None = None,
        codec: CodecDecoder | None = None,
        codec_batch: int = 64,
        codec_kernels: str = DEFAULT_CODEC_KERNELS,
    ) -> None:
        self.model = model
        self.device = torch.device(device) if device is not None else model.device
        self.max_batch = max_batch
        self.queue_rows = queue_rows
        self.max_positions = max_positions
        self._lock = threading.Condition()
        self._waiting: list[RunnerStream] = []
        self._active: dict[str, RunnerStream] = {}
        self._abort_requested: set[str] = set()
        self._free_slots = list(range(max_batch - 1, -1, -1))
        self._termination = BatchTermination(max_batch, NUM_CODEBOOKS, self.device)
        self._history = torch.full(
            (max_batch, NUM_CODEBOOKS, HISTORY_WIDTH), -1, dtype=torch.int64, device=self.device
        )
        self._audio: ReferenceAudio | None = None
        if codec is not None:
            from realtime_engine.talker.reference_audio import ReferenceAudio

            self._audio = ReferenceAudio(
                codec, max_batch, self.device, max_batch=codec_batch, kernels=codec_kernels
            )
        self._closing = False
        self._death: str | None = None  # why the worker thread died, once it has
        self._steps = 0
        self._rows = 0
        self._prefills = 0
        self._step_time_total = 0.0
        self._last_step_s = 0.0
        self._last_batch = 0
        self._thread = threading.Thread(target=self._run, name="talker-reference", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ asyncio side
    def submit(self, request: TalkerRequest) -> AsyncIterator[np.ndarray]:
        return self._iterate(self._start(request, None))  # type: ignore[return-value]

    def speak(self, request: TalkerRequest, chunking: ChunkingParams) -> AsyncIterator[PcmChunk]:
        if self._audio is None:
            raise TalkerError("this runner has no codec to decode audio with")
        self._audio.check(chunking)
        return self._iterate(self._start(request, chunking))  # type: ignore[return-value]

    def _start(self, request: TalkerRequest, chunking: ChunkingParams | None) -> RunnerStream:
        loop = asyncio.get_running_loop()
        sampling = request.sampling
        if sampling.ras_window > HISTORY_WIDTH:
            raise TalkerError(f"ras_window {sampling.ras_window} exceeds {HISTORY_WIDTH}")
        cap = request.max_new_tokens
        if request.fixed_rows is not None:
            cap = request.fixed_rows
        stream = RunnerStream(request, loop, max(cap, 0), chunking)
        with self._lock:
            if self._closing:
                raise TalkerError("the talker runner is closed")
            if (dead := self.failure()) is not None:
                raise TalkerError(dead)
            known = {s.request.request_id for s in self._waiting} | set(self._active)
            if request.request_id in known:
                raise TalkerError(f"request id {request.request_id!r} is already running")
            self._waiting.append(stream)
            self._lock.notify_all()
        return stream

    async def _iterate(self, stream: RunnerStream) -> AsyncIterator[np.ndarray | PcmChunk]:
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, End):
                    return
                if isinstance(item, BaseException):
                    raise item
                with self._lock:
                    before = stream.undelivered
                    stream.undelivered -= queue_weight(item)
                    if before >= self.queue_rows > stream.undelivered:
                        self._lock.notify_all()  # it may step again
                yield item
        finally:
            if not stream.closed:
                self._request_abort(stream.request.request_id)

    def _find(self, request_id: str) -> RunnerStream | None:
        """Under the lock: the live stream of ``request_id``."""
        stream = self._active.get(request_id)
        if stream is None:
            stream = next((s for s in self._waiting if s.request.request_id == request_id), None)
        return stream

    def _request_abort(self, request_id: str) -> RunnerStream | None:
        with self._lock:
            stream = self._find(request_id)
            if stream is not None:
                self._abort_requested.add(request_id)
                self._lock.notify_all()
            return stream

    async def abort(self, request_id: str) -> None:
        """Free ``request_id``'s slot; returns once the worker has let go of it.

        Call it on the loop that submitted the request.
        """
        stream = self._request_abort(request_id)
        if stream is None:
            return
        while not stream.released.is_set() and self._thread.is_alive():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stream.released.wait(), timeout=0.5)

    async def close(self) -> None:
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        await asyncio.to_thread(self._thread.join)

    def stats(self) -> RunnerStats:
        with self._lock:
            return RunnerStats(
                steps=self._steps,
                rows=self._rows,
                prefills=self._prefills,
                last_step_s=self._last_step_s,
                mean_step_s=self._step_time_total / self._steps if self._steps else 0.0,
                last_batch_size=self._last_batch,
                active=len(self._active),
                waiting=len(self._waiting),
            )

    # ------------------------------------------------------------ worker side
    def _run(self) -> None:
        try:
            with torch.inference_mode():
                while True:
                    try:
                        if not self._iteration():
                            break
                    except Exception as e:
                        self._fail_all(TalkerError(f"talker step failed: {e}"), e)
                self._fail_all(TalkerError("the talker runner is closed"), None)
        except BaseException as e:
            # The thread itself is ending (not one step failing): nobody will
            # serve these streams again, so end them now and say why.
            # The thread ends here either way; the cause is reported through
            # ``failure()`` (the gateway logs it once) rather than re-raised.
            self._death = f"the talker thread died: {type(e).__name__} {e}".strip()
            self._fail_all(TalkerError(self._death), e)

    def failure(self) -> str | None:
        """Why the worker thread is gone while the runner is not closing, else None."""
        if self._death is not None:
            return self._death
        if not self._thread.is_alive() and not self._closing:
            return "the talker thread exited"
        return None

    def _iteration(self) -> bool:
        """Admit, then step once; False once the runner is closing."""
        with self._lock:
            self._apply_aborts()
            if self._closing:
                return False
            admit = self._take_admissions()
            runnable = [s for s in self._active.values() if s.undelivered < self.queue_rows]
            if not admit and not runnable:
                self._lock.wait()
                return True
        for stream in admit:
            self._prefill(stream)
        self._step()
        return True

    def _apply_aborts(self) -> None:
        """Under the lock: drop aborted requests, waiting or active."""
        if not self._abort_requested:
            return
        ids = self._abort_requested
        self._abort_requested = set()
        for stream in [s for s in self._waiting if s.request.request_id in ids]:
            self._waiting.remove(stream)
            self._finish(stream, END)
        for request_id in ids & set(self._active):
            self._release(self._active[request_id], END)

    def _take_admissions(self) -> list[RunnerStream]:
        """Under the lock: move waiting requests into free slots."""
        admit = []
        while self._waiting and self._free_slots:
            stream = self._waiting.pop(0)
            stream.slot = self._free_slots.pop()
            self._active[stream.request.request_id] = stream
            admit.append(stream)
        return admit

    def _prefill(self, stream: RunnerStream) -> None:
        request = stream.request
        try:
            prompt = request.prompt
            ids = torch.tensor(prompt.token_ids, dtype=torch.long)
            ref = None if prompt.ref_rows is None else torch.as_tensor(prompt.ref_rows).long()
            if self.max_positions is not None:
                room = self.max_positions - len(prompt.token_ids)
                if room < 1:
                    raise TalkerError(f"prompt of {len(prompt.token_ids)} tokens leaves no room")
                stream.cap = min(stream.cap, room)
            embeds = self.model.embed_prompt(ids, ref)
            stream.cache = self.model.new_cache(initial_capacity=embeds.shape[0] + 64)
            hidden = self.model.forward_embeds(embeds.unsqueeze(0), [stream.cache])
            stream.hidden = hidden[0, -1]
            stream.noise = RequestNoise(request.sampling.seed, self.device)
            # bounds from the effective cap, so a clamped request still closes its pattern
            fixed = stream.cap if request.fixed_rows is not None else None
            lo, at = eoc_bounds(stream.cap, fixed)
            self._termination.reset_slot(stream.slot, lo, at)
            self._history[stream.slot].fill_(-1)
            if stream.chunking is not None and self._audio is not None:
                self._audio.open(
                    request.request_id,
                    stream.slot,
                    stream.chunking,
                    return_rows=request.return_rows,
                )
        except Exception as e:
            error = e if isinstance(e, TalkerError) else TalkerError(f"prefill failed: {e}")
            error.__cause__ = None if error is e else e
            with self._lock:
                self._release(stream, error)
            return
        if request.timings is not None:
            request.timings.prefilled = time.perf_counter()
        with self._lock:
            self._prefills += 1
            if stream.cap == 0:
                self._release(stream, END)

    def _step(self) -> None:
        with self._lock:
            batch = [
                s
                for s in self._active.values()
                if s.hidden is not None and s.undelivered < self.queue_rows
            ]
        if not batch:
            return
        started = time.perf_counter()
        slots = torch.tensor([s.slot for s in batch], device=self.device)
        hidden = torch.stack([s.hidden for s in batch if s.hidden is not None])
        logits = self.model.audio_logits(hidden).to(self.device)
        params = BatchSampling.from_requests([s.request.sampling for s in batch], self.device)
        noise = torch.stack([s.noise.draw() for s in batch if s.noise is not None])
        history = self._history.index_select(0, slots)
        sampled = sample_codes(logits, self._termination.allowed(slots), params, noise, history)
        rows, done = self._termination.advance(slots, sampled.codes)
        self._history.index_copy_(0, slots, push_history(history, rows))
        if self._audio is not None:
            speaking = [i for i, s in enumerate(batch) if s.chunking is not None]
            self._audio.write(
                [batch[i].slot for i in speaking],
                [batch[i].emitted for i in speaking],
                rows[speaking] if len(speaking) < len(batch) else rows,
            )
        rows_np = rows.cpu().numpy()
        done_np = done.cpu().numpy()

        going: list[int] = []
        ending: list[RunnerStream] = []
        now = time.perf_counter()
        with self._lock:
            for i, stream in enumerate(batch):
                stream.emitted += 1
                finished = bool(done_np[i]) or stream.emitted >= stream.cap
                if stream.chunking is not None and self._audio is not None:
                    self._audio.row(stream.request, stream.emitted, finished, now)
                    if finished:
                        ending.append(stream)
                    else:
                        going.append(i)
                    continue
                stream.undelivered += 1
                delivered = stream.post(rows_np[i].copy())
                if not delivered:
                    self._release(stream, None)
                elif finished:
                    self._release(stream, END)
                else:
                    going.append(i)
        self._post_audio()
        with self._lock:
            for stream in ending:
                if not stream.closed:
                    self._release(stream, END)
            going = [i for i in going if not batch[i].closed]  # a codec failure ends some
        if going:
            idx = torch.tensor(going, device=rows.device)
            embeds = self.model.embed_audio_rows(rows.index_select(0, idx))
            caches = [batch[i].cache for i in going]
            out = self.model.forward_embeds(embeds.unsqueeze(1), caches)
            for j, i in enumerate(going):
                batch[i].hidden = out[j, -1]
        elapsed = time.perf_counter() - started
        with self._lock:
            self._steps += 1
            self._rows += len(batch)
            self._last_step_s = elapsed
            self._step_time_total += elapsed
            self._last_batch = len(batch)

    def _post_audio(self) -> None:
        """Decode the chunks now due and hand them to their consumers."""
        if self._audio is None:
            return
        chunks, failed = self._audio.decode_due(time.perf_counter())
        with self._lock:
            for key, chunk in chunks:
                stream = self._active.get(key)
                if stream is None or stream.closed:
                    continue
                stream.undelivered += queue_weight(chunk)
                if not stream.post(chunk):
                    self._release(stream, None)
            for key, error in failed:
                stream = self._active.get(key)
                if stream is not None:
                    failure = TalkerError(f"codec decode failed: {error}")
                    failure.__cause__ = error
                    self._release(stream, failure)

    def _release(self, stream: RunnerStream, final: End | BaseException | None) -> None:
        """Under the lock: free the slot and end the consumer's stream."""
        if self._active.get(stream.request.request_id) is stream:
            del self._active[stream.request.request_id]
            self._free_slots.append(stream.slot)
            if stream.chunking is not None and self._audio is not None:
                self._audio.close(stream.request.request_id)
        stream.cache = None
        stream.hidden = None
        self._finish(stream, final)

    def _finish(self, stream: RunnerStream, final: End | BaseException | None) -> None:
        stream.closed = True
        if final is not None:
            stream.post(final)
        with contextlib.suppress(RuntimeError):  # the consumer's loop is gone
            stream.loop.call_soon_threadsafe(stream.released.set)

    def _fail_all(self, error: TalkerError, cause: BaseException | None) -> None:
        """Fail every waiting and running request; the worker then starts clean."""

        def fresh() -> TalkerError:
            # one exception object per consumer: tracebacks attach to it
            copy = TalkerError(str(error))
            copy.__cause__ = cause
            return copy

        with self._lock:
            for stream in list(self._active.values()):
                self._release(stream, fresh())
            for stream in self._waiting:
                self._finish(stream, fresh())
            self._waiting.clear()
