"""Sliding-window streaming codec decoder (sans-I/O).

Rows arrive in the talker's delay pattern: codebook ``c`` of raw frame ``t``
sits in row ``t + c``, so frame ``t`` is complete once row ``t + 7`` exists.
Every chunk decodes the window of raw frames ``[emitted - L, target + H)``
(clipped to the frames that exist), then keeps only ``[emitted, target)``:
``L`` frames of left context and ``H`` frames of right holdback give the codec
the neighbours it would have seen in a whole-utterance decode. The DAC
decoder's receptive field is +-10 frames, so ``L >= 10`` and ``H >= 10`` make
the concatenated chunks equal to a whole-utterance decode; smaller ``H``
trades exactness at chunk edges for earlier audio.

Chunk sizes follow ``presets.next_chunk_frames``: ``first_chunk_frames``,
then a geometric ramp (``chunk_growth``) up to ``chunk_frames``, so that the
client's playback buffer grows after the first chunk instead of draining.
The sizes only decide where chunk edges fall; which samples are emitted
does not depend on them when the context is exact.

End of utterance: the stream ends at the first raw frame whose codebook-0 code
is EOC (the talker's stop marker), or at ``finish()``, whichever comes first.
Frames from that marker on are never decoded; all earlier complete frames
are, with no trailing frame dropped: under the talker's delay state machine a
``T``-frame utterance is ``T + 7`` rows and all of its ``T`` frames carry real
codes in every codebook. The last chunk has no holdback (nothing follows).
Inside a frame, BOC/EOC or negative codes become 0 (never clamped: 1025 ->
1023 would be a valid, audible code).

Decoding is split from planning so that many streams can share one batched
codec call: ``plan_feed``/``plan_finish`` return ``DecodeJob``s,
``decode_jobs_batched`` runs them in as few calls as exactness allows
(left-padding windows whose context covers the receptive field), and
``complete`` trims a job's PCM into the chunk to play. ``feed``/``finish`` compose these
for a single stream.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from realtime_engine.codec.errors import CodecInputError, StreamStateError
from realtime_engine.codec.presets import (
    RECEPTIVE_FIELD_FRAMES,
    next_chunk_frames,
    validate_chunking,
)
from realtime_engine.format import CODEBOOK_SIZE, EOC, NUM_CODEBOOKS, ChunkingParams
from realtime_engine.format import FRAME_SAMPLES as HOP

# codes [B, Q, W] int64 -> pcm [B, hop * W] (or [B, 1, hop * W]) float32
DecodeFn = Callable[[np.ndarray], np.ndarray]

_stream_ids = itertools.count()


@dataclass(frozen=True, eq=False)
class DecodeJob:
    """One codec call: decode ``codes`` and keep ``emit_frames`` frames after
    the first ``trim_frames``."""

    stream_id: int
    seq: int
    codes: np.ndarray  # [Q, W] int64, only real codes
    window_start: int  # raw frame index of codes[:, 0]
    trim_frames: int
    emit_frames: int
    final: bool

    @property
    def window_frames(self) -> int:
        return int(self.codes.shape[1])


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
    """Incremental de-delay + sliding-window decode of one utterance."""

    def __init__(
        self,
        decode_fn: DecodeFn,
        chunking: ChunkingParams,
        *,
        hop: int = HOP,
        num_codebooks: int = NUM_CODEBOOKS,
        stop_at_eoc: bool = True,
    ) -> None:
        validate_chunking(chunking)
        self.decode_fn = decode_fn
        self.chunking = chunking
        self.hop = hop
        self.num_codebooks = num_codebooks
        self.stop_at_eoc = stop_at_eoc
        self.stream_id = next(_stream_ids)
        self._raw = np.zeros((num_codebooks, 64), dtype=np.int64)
        self._rows = 0
        self._end_frame: int | None = None  # first frame at/after the EOC marker
        self._emitted = 0
        self._planned = 0
        self._completed = 0
        self._done = False
        self._finish_called = False

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

    # -- planning ----------------------------------------------------------
    def plan_feed(self, row: object) -> list[DecodeJob]:
        """Take one delay-patterned row (8 ints); return the jobs it enables."""
        if self._finish_called:
            raise StreamStateError("row fed after finish()")
        if self._done:
            return []  # rows after the end marker are the talker's ramp-down
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
        if self._done:
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
        p = self.chunking
        available = self.frames_available
        holdback = 0 if final else p.right_holdback_frames
        target = available - holdback
        pending = target - self._emitted
        if final:
            self._done = True
        need = next_chunk_frames(p, self._emitted)
        if pending <= 0 or (not final and pending < need):
            return []
        start = max(0, self._emitted - p.left_context_frames)
        end = target + holdback  # <= available by construction
        job = DecodeJob(
            stream_id=self.stream_id,
            seq=self._planned,
            codes=clean_codes(self._raw[:, start:end]),
            window_start=start,
            trim_frames=self._emitted - start,
            emit_frames=pending,
            final=final,
        )
        self._emitted = target
        self._planned += 1
        return [job]

    # -- completion --------------------------------------------------------
    def complete(self, job: DecodeJob, pcm: np.ndarray) -> np.ndarray:
        """Trim a job's decoded window to its chunk (jobs complete in order)."""
        if job.stream_id != self.stream_id:
            raise StreamStateError("job belongs to another stream")
        if job.seq != self._completed:
            raise StreamStateError(f"job {job.seq} completed out of order (next {self._completed})")
        flat = np.asarray(pcm, dtype=np.float32).reshape(-1)
        if flat.size != job.window_frames * self.hop:
            raise CodecInputError(
                f"decoded window has {flat.size} samples; expected {job.window_frames * self.hop}"
            )
        self._completed += 1
        lo = job.trim_frames * self.hop
        return flat[lo : lo + job.emit_frames * self.hop].copy()

    # -- one stream, decode inline -----------------------------------------
    def feed(self, row: object) -> list[np.ndarray]:
        return self._run(self.plan_feed(row))

    def finish(self) -> list[np.ndarray]:
        return self._run(self.plan_finish())

    def _run(self, jobs: list[DecodeJob]) -> list[np.ndarray]:
        if not jobs:
            return []
        pcms = decode_jobs_batched(self.decode_fn, jobs)
        return [self.complete(job, pcm) for job, pcm in zip(jobs, pcms, strict=True)]


def decode_jobs_batched(
    decode_fn: DecodeFn, jobs: Sequence[DecodeJob], max_batch: int | None = None
) -> list[np.ndarray]:
    """Decode jobs in as few codec calls as exactness allows (at most
    ``max_batch`` windows per call); returns each job's PCM, in job order.

    A job whose chunk starts at least the receptive field (10 frames) into
    its window is decoded left-padded with code-0 frames to the longest such
    window: the padding only reaches frames it already trims away, so one
    call serves all of them whatever their lengths (the chunk-size ramp gives
    each stream several). Jobs at an utterance's start have less context
    than that and are grouped by window length instead.
    """
    paddable = [i for i, job in enumerate(jobs) if job.trim_frames >= RECEPTIVE_FIELD_FRAMES]
    by_length: dict[int, list[int]] = {}
    for i, job in enumerate(jobs):
        if job.trim_frames < RECEPTIVE_FIELD_FRAMES:
            by_length.setdefault(job.window_frames, []).append(i)
    groups = [*by_length.values(), paddable] if paddable else list(by_length.values())
    out: list[np.ndarray | None] = [None] * len(jobs)
    for indices in groups:
        step = max_batch or len(indices)
        for lo in range(0, len(indices), step):
            group = indices[lo : lo + step]
            width = max(jobs[i].window_frames for i in group)
            codes = np.stack([_left_padded(jobs[i].codes, width) for i in group])
            pcm = np.asarray(decode_fn(codes), dtype=np.float32)
            if pcm.shape[0] != len(group):
                raise CodecInputError(
                    f"decode_fn returned batch {pcm.shape[0]} for {len(group)} windows"
                )
            pcm = pcm.reshape(len(group), -1)
            hop = pcm.shape[1] // width
            for row, i in enumerate(group):
                out[i] = pcm[row, (width - jobs[i].window_frames) * hop :]
    return [p for p in out if p is not None]


def _left_padded(codes: np.ndarray, width: int) -> np.ndarray:
    pad = width - codes.shape[1]
    return codes if pad == 0 else np.pad(codes, ((0, 0), (pad, 0)))


def run_jobs(
    decode_fn: DecodeFn,
    work: Sequence[tuple[StreamingDecoder, DecodeJob]],
    max_batch: int | None = None,
) -> list[np.ndarray]:
    """Decode jobs of many streams in batched calls and trim each into its
    chunk; per stream, jobs must be given in planning order."""
    pcms = decode_jobs_batched(decode_fn, [job for _, job in work], max_batch)
    return [decoder.complete(job, pcm) for (decoder, job), pcm in zip(work, pcms, strict=True)]
