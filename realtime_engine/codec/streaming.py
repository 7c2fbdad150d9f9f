"""Streaming codec decoder of one utterance (sans-I/O), on the stateful codec.

Rows arrive in the talker's delay pattern: codebook ``c`` of raw frame ``t``
sits in row ``t + c``, so frame ``t`` is complete once row ``t + 7`` exists.
Complete frames go to a :class:`~realtime_engine.codec.stream_core.StreamingCodec`
slot, which keeps every layer's state and so decodes each frame once, with
all the left context of the utterance; its committed audio lags the frames
by the codec's delay (9.85 frames), so it equals whole-utterance decoding.

Chunks follow the presets (``presets.next_chunk_frames``): a chunk of frames
``[emitted, target)`` with ``target = available - H`` (``H`` =
``right_holdback_frames``) is planned as soon as it reaches the next chunk
size. With ``H >= 10`` its samples are already committed. With a shorter
holdback its right edge is decoded speculatively: the slot's state is
copied and flushed as if the utterance ended at the last available frame
(``StreamingCodec.peek``), the audio a window decode ending there would give;
the committed computation continues unchanged, so committed samples are
still computed once. ``left_context_frames`` no longer matters: the state
always holds the whole left context.

End of utterance: the stream ends at the first raw frame whose codebook-0 code
is EOC (the talker's stop marker), or at ``finish()``, whichever comes first.
Frames from that marker on are never decoded; all earlier complete frames
are, with no trailing frame dropped: under the talker's delay state machine a
``T``-frame utterance is ``T + 7`` rows and all of its ``T`` frames carry real
codes in every codebook. The last chunk has no holdback (nothing follows).
Inside a frame, BOC/EOC or negative codes become 0 (never clamped: 1025 ->
1023 would be a valid, audible code).

Decoding is split from planning so that many streams can share one codec
call: ``plan_feed``/``plan_finish`` return ``DecodeJob``s, ``decode_jobs``
runs the jobs of many streams in batched codec calls (on whatever thread owns
the codec), and ``complete`` turns a job's decoded audio into the chunk to
play. ``feed``/``finish`` compose these for a single stream.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from realtime_engine.codec.decoder import CodecDecoder
from realtime_engine.codec.errors import CodecInputError, StreamStateError
from realtime_engine.codec.presets import next_chunk_frames, validate_chunking
from realtime_engine.codec.stream_core import StreamingCodec
from realtime_engine.format import CODEBOOK_SIZE, EOC, NUM_CODEBOOKS, ChunkingParams
from realtime_engine.format import FRAME_SAMPLES as HOP  # noqa: F401  (re-exported)

_stream_ids = itertools.count()


@dataclass(frozen=True, eq=False)
class DecodeJob:
    """One codec call for one stream: step ``codes`` (the frames completed
    since the previous job), then, for ``final`` jobs, flush the slot, or
    for ``speculative`` ones, peek at its right edge."""

    stream_id: int
    seq: int
    codec: StreamingCodec
    slot: int
    codes: np.ndarray  # [Q, n] int64, clean
    first_frame: int  # raw frame index of codes[:, 0]
    emit_start: int  # the chunk's frames: [emit_start, emit_start + emit_frames)
    emit_frames: int
    speculative: bool
    final: bool
    edge_samples: int  # of the right edge the chunk needs (0: none)

    @property
    def new_frames(self) -> int:
        return int(self.codes.shape[1])


@dataclass(frozen=True)
class DecodedJob:
    """A job's audio: the samples its step committed, and the flushed or
    speculative right edge (None when the chunk is already committed)."""

    committed: np.ndarray
    edge: np.ndarray | None


def clean_codes(codes: np.ndarray, codebook_size: int = CODEBOOK_SIZE) -> np.ndarray:
    """BOC, EOC and negative padding -> 0 (never clamp)."""
    return np.where((codes < 0) | (codes >= codebook_size), 0, codes)


def rows_to_frames(rows: np.ndarray, stop_at_eoc: bool = True) -> np.ndarray:
    """Whole-utterance de-delay with the streaming decoder's end policy:
    rows [L, Q] -> cleaned raw frames [Q, T]."""
    rows = np.asarray(rows, dtype=np.int64)
    if rows.ndim != 2:
        raise CodecInputError(f"rows must be [L, Q]; got shape {rows.shape}")
    num_rows, q = rows.shape
    frames = max(0, num_rows - (q - 1))
    if stop_at_eoc:
        eoc = np.flatnonzero(rows[:, 0] == EOC)
        if eoc.size:
            frames = min(frames, int(eoc[0]))
    out = np.zeros((q, frames), dtype=np.int64)
    for c in range(q):
        out[c] = rows[c : c + frames, c]
    return clean_codes(out)


class StreamingDecoder:
    """Incremental de-delay + stateful decode of one utterance in one slot
    of a (possibly shared) :class:`StreamingCodec`."""

    def __init__(
        self,
        codec: StreamingCodec | CodecDecoder,
        chunking: ChunkingParams,
        *,
        num_codebooks: int = NUM_CODEBOOKS,
        stop_at_eoc: bool = True,
    ) -> None:
        validate_chunking(chunking)
        if isinstance(codec, CodecDecoder):
            codec = StreamingCodec(codec, max_slots=1)
        self.codec = codec
        self.chunking = chunking
        self.hop = codec.hop
        self.num_codebooks = num_codebooks
        self.stop_at_eoc = stop_at_eoc
        self.stream_id = next(_stream_ids)
        self.slot = codec.slots.acquire()
        self._closed = False
        self._raw = np.zeros((num_codebooks, 64), dtype=np.int64)
        self._rows = 0
        self._end_frame: int | None = None  # first frame at/after the EOC marker
        self._emitted = 0
        self._stepped = 0  # frames handed to planned jobs
        self._planned = 0
        self._completed = 0
        self._done = False
        self._finish_called = False
        # committed samples not yet played; _pcm[0] is whole-decode sample _pcm_at
        self._pcm = np.zeros(0, dtype=np.float32)
        self._pcm_at = -codec.delay

    # -- state -------------------------------------------------------------
    @property
    def rows_fed(self) -> int:
        return self._rows

    @property
    def frames_available(self) -> int:
        """Complete raw frames (before the end marker, if seen)."""
        frames = max(0, self._rows - (self.num_codebooks - 1))
        return frames if self._end_frame is None else min(frames, self._end_frame)

    @property
    def emitted_frames(self) -> int:
        return self._emitted

    @property
    def done(self) -> bool:
        """True once the final chunk has been planned."""
        return self._done

    def close(self) -> None:
        """Give the slot back (end, abort). Jobs already planned may still
        run: they keep their slot's order, and the next stream's first job
        resets the slot before stepping it."""
        if not self._closed:
            self._closed = True
            self.codec.slots.release(self.slot)

    # -- planning ----------------------------------------------------------
    def plan_feed(self, row: object) -> list[DecodeJob]:
        """Take one delay-patterned row (8 ints); return the jobs it enables."""
        if self._finish_called:
            raise StreamStateError("row fed after finish()")
        if self._done:
            return []  # rows after the end marker are the talker's ramp-down
        if self._closed:
            raise StreamStateError("row fed after close()")
        codes = self._check_row(row)
        r = self._rows
        if self._end_frame is None and self.stop_at_eoc and codes[0] == EOC:
            self._end_frame = r
        if r + 1 > self._raw.shape[1]:
            grown = np.zeros((self.num_codebooks, 2 * self._raw.shape[1]), dtype=np.int64)
            grown[:, : self._raw.shape[1]] = self._raw
            self._raw = grown
        for c in range(min(self.num_codebooks, r + 1)):
            self._raw[c, r - c] = codes[c]  # cells with r < c are BOC ramp-up
        self._rows += 1
        if self._end_frame is not None and self.frames_available == self._end_frame:
            return self._plan(final=True)
        return self._plan(final=False)

    def plan_finish(self) -> list[DecodeJob]:
        """End of rows: plan the last chunk (no holdback)."""
        self._finish_called = True
        if self._done or self._closed:
            return []
        return self._plan(final=True)

    def _check_row(self, row: object) -> np.ndarray:
        try:
            codes = np.asarray(row)
        except (TypeError, ValueError) as e:
            raise CodecInputError(f"row is not an array of codes: {e}") from e
        if codes.shape != (self.num_codebooks,):
            raise CodecInputError(f"row must have shape ({self.num_codebooks},); got {codes.shape}")
        if not np.issubdtype(codes.dtype, np.integer):
            raise CodecInputError(f"row must hold integers; got {codes.dtype}")
        return codes.astype(np.int64)

    def _plan(self, final: bool) -> list[DecodeJob]:
        available = self.frames_available
        holdback = 0 if final else self.chunking.right_holdback_frames
        target = available - holdback
        pending = target - self._emitted
        if final:
            self._done = True
        need = next_chunk_frames(self.chunking, self._emitted)
        if pending <= 0 or (not final and pending < need):
            if final:
                self.close()  # nothing left to play; no job will touch the slot
            return []
        committed_end = available * self.hop - self.codec.delay
        speculative = not final and target * self.hop > committed_end
        job = DecodeJob(
            stream_id=self.stream_id,
            seq=self._planned,
            codec=self.codec,
            slot=self.slot,
            codes=clean_codes(self._raw[:, self._stepped : available]),
            first_frame=self._stepped,
            emit_start=self._emitted,
            emit_frames=pending,
            speculative=speculative,
            final=final,
            # a flush returns the whole edge; a peek only up to the chunk's end
            edge_samples=self.codec.delay if final else max(0, target * self.hop - committed_end),
        )
        self._stepped = available
        self._emitted = target
        self._planned += 1
        return [job]

    # -- completion --------------------------------------------------------
    def complete(self, job: DecodeJob, decoded: DecodedJob) -> np.ndarray:
        """Turn a job's decoded audio into its chunk (jobs complete in order)."""
        if job.stream_id != self.stream_id:
            raise StreamStateError("job belongs to another stream")
        if job.seq != self._completed:
            raise StreamStateError(f"job {job.seq} completed out of order (next {self._completed})")
        committed = np.asarray(decoded.committed, dtype=np.float32).reshape(-1)
        if committed.size != job.new_frames * self.hop:
            raise CodecInputError(
                f"decoded {committed.size} samples; expected {job.new_frames * self.hop}"
            )
        self._completed += 1
        self._pcm = np.concatenate([self._pcm, committed])
        lo = job.emit_start * self.hop - self._pcm_at
        hi = lo + job.emit_frames * self.hop
        available = self._pcm
        if job.edge_samples:
            if decoded.edge is None or decoded.edge.size != job.edge_samples:
                raise CodecInputError(f"the job needs {job.edge_samples} samples of right edge")
            available = np.concatenate([self._pcm, np.asarray(decoded.edge, np.float32)])
        chunk = available[lo:hi].copy()
        # Committed samples before the next chunk's start are never played:
        # samples emitted speculatively are not re-emitted.
        drop = min(hi, self._pcm.size)
        self._pcm = self._pcm[drop:]
        self._pcm_at += drop
        if job.final:
            self.close()
        return chunk

    # -- one stream, decode inline -----------------------------------------
    def feed(self, row: object) -> list[np.ndarray]:
        return self._run(self.plan_feed(row))

    def finish(self) -> list[np.ndarray]:
        return self._run(self.plan_finish())

    def _run(self, jobs: list[DecodeJob]) -> list[np.ndarray]:
        if not jobs:
            return []
        decoded = decode_jobs(jobs)
        return [self.complete(job, d) for job, d in zip(jobs, decoded, strict=True)]


def decode_jobs(jobs: Sequence[DecodeJob], max_batch: int | None = None) -> list[DecodedJob]:
    """Run the jobs of many streams in batched codec calls (at most
    ``max_batch`` slots per call); returns each job's audio, in job order.

    A slot's jobs run in the order given, each stream's first job resetting
    its slot first, so a slot reused by a new stream (after an abort) never
    sees the old stream's state.
    """
    waves: list[list[int]] = []
    seen: dict[tuple[int, int], int] = {}
    for i, job in enumerate(jobs):
        key = (id(job.codec), job.slot)
        k = seen.get(key, 0)
        seen[key] = k + 1
        if k == len(waves):
            waves.append([])
        waves[k].append(i)
    out: list[DecodedJob | None] = [None] * len(jobs)
    for wave in waves:
        by_codec: dict[int, list[int]] = {}
        for i in wave:
            by_codec.setdefault(id(jobs[i].codec), []).append(i)
        for group in by_codec.values():
            for lo in range(0, len(group), max_batch or len(group)):
                part = group[lo : lo + (max_batch or len(group))]
                for i, decoded in zip(part, _decode_group([jobs[i] for i in part]), strict=True):
                    out[i] = decoded
    return [d for d in out if d is not None]


def _decode_group(jobs: list[DecodeJob]) -> list[DecodedJob]:
    """Jobs of one codec, distinct slots."""
    codec = jobs[0].codec
    codec.ensure_slots(1 + max(job.slot for job in jobs))
    fresh = [job.slot for job in jobs if job.seq == 0]
    if fresh:
        codec.reset(fresh)
    committed: dict[int, np.ndarray] = {}
    by_frames: dict[int, list[DecodeJob]] = {}
    for job in jobs:
        by_frames.setdefault(job.new_frames, []).append(job)
    for n, group in by_frames.items():
        if n == 0:
            for job in group:
                committed[id(job)] = np.zeros(0, np.float32)
            continue
        codes = torch.from_numpy(np.stack([job.codes for job in group]))
        pcm = codec.step([job.slot for job in group], codes).float().cpu().numpy()
        for job, row in zip(group, pcm, strict=True):
            committed[id(job)] = row
    edges: dict[int, np.ndarray] = {}
    finals = [job for job in jobs if job.final]
    if finals:
        pcm = codec.flush([job.slot for job in finals]).float().cpu().numpy()
        edges.update((id(job), row) for job, row in zip(finals, pcm, strict=True))
    peeks: dict[int, list[DecodeJob]] = {}
    for job in jobs:
        if job.speculative:
            peeks.setdefault(job.edge_samples, []).append(job)
    for samples, group in peeks.items():
        pcm = codec.peek([job.slot for job in group], samples).float().cpu().numpy()
        edges.update((id(job), row) for job, row in zip(group, pcm, strict=True))
    return [DecodedJob(committed[id(job)], edges.get(id(job))) for job in jobs]


def run_jobs(
    work: Sequence[tuple[StreamingDecoder, DecodeJob]], max_batch: int | None = None
) -> list[np.ndarray]:
    """Decode jobs of many streams in batched calls and turn each into its
    chunk; per stream, jobs must be given in planning order."""
    decoded = decode_jobs([job for _, job in work], max_batch)
    return [decoder.complete(job, d) for (decoder, job), d in zip(work, decoded, strict=True)]
