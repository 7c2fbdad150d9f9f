"""What crosses between the serving process and the engine workers (no I/O here).

Requests carry their talker settings in ``SamplingParams.extra_args`` (msgpack:
only plain ints, floats, strings, lists and dicts). A request with chunking
settings gets audio: the worker decodes it beside the talker and sends PCM
chunks, one message per decode batch and destination: a JSON header naming
each chunk's request (correlation id), first frame, sample count, whether it
is the last, and (first chunk only) the worker's stage stamps, plus the
samples as little-endian float32. A request without chunking gets its code
rows instead (tools, tests): a JSON header naming each row's request, row
index and whether it is the last, plus the rows as little-endian int16
``[k, 8]``. About twice a second an engine core with requests also sends its
step counters (:class:`StepStats`) to their destinations, for ``/metrics``.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from realtime_engine.codec.errors import InvalidChunkingError
from realtime_engine.codec.presets import validate_chunking
from realtime_engine.format import ChunkingParams
from realtime_engine.model.config import AUDIO_PLACEHOLDER_ID
from realtime_engine.model.tokenizer import SpecialIds
from realtime_engine.talker.types import (
    CODEBOOK_VOCAB,
    NUM_CODEBOOKS,
    PcmChunk,
    TalkerError,
    TalkerRequest,
)

EXTRA_ARGS_KEY = "higgs_talker"
# vLLM ``additional_config`` entry with the engine core's codec settings.
CODEC_CONFIG_KEY = "higgs_codec"
# ``additional_config`` entry with the code sampler's settings: ``{"compiled": bool}``
# (default True: the sampler step goes through torch.compile before its graphs
# are captured; CUDA only).
SAMPLER_CONFIG_KEY = "higgs_sampler"
# ``additional_config`` entry with playback pacing's settings
# (``realtime_engine.talker.pacing.PacingPolicy``: ``max_decode_batch``, ``min_buffer_s``).
PACING_CONFIG_KEY = "higgs_pacing"
# Longest repetition-aware-sampling window the device buffers hold.
MAX_RAS_WINDOW = 32
_ROW_DTYPE = np.dtype("<i2")
_PCM_DTYPE = np.dtype("<f4")


class TalkerArgsError(ValueError):
    """Talker settings in a request are missing or out of range."""


class RowMessageError(ValueError):
    """A row message from a worker is malformed."""


@dataclass(frozen=True)
class TalkerArgs:
    """Per-request talker settings, as the worker needs them."""

    correlation_id: str
    endpoint: str
    audio_token_id: int
    eos_token_id: int
    temperature: float
    top_k: int
    top_p: float
    ras_window: int
    ras_max_repeat: int
    seed: int
    eoc_not_before: int
    eoc_at: int
    # Delay-patterned reference rows for the voice-clone placeholders at
    # prompt positions ref_offset .. ref_offset + len(ref_rows) - 1.
    ref_offset: int = 0
    ref_rows: tuple[tuple[int, ...], ...] = ()
    # Audio instead of rows: ChunkingParams fields in order (chunk_growth may be None).
    chunking: tuple[int, int, int, int, float | None] | None = None
    # Audio requests: send the request's rows back with its final chunk.
    return_rows: bool = False

    def __post_init__(self) -> None:
        if not self.correlation_id or not self.endpoint:
            raise TalkerArgsError("correlation_id and endpoint must be set")
        if not 0 <= self.ras_window <= MAX_RAS_WINDOW:
            raise TalkerArgsError(
                f"ras_window must be in [0, {MAX_RAS_WINDOW}], got {self.ras_window}"
            )
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise TalkerArgsError(
                f"need temperature >= 0 and 0 < top_p <= 1, got {self.temperature}, {self.top_p}"
            )
        if not -(1 << 63) <= self.seed < (1 << 63):
            raise TalkerArgsError("seed must fit in a signed 64-bit integer")
        if self.ref_offset < 0:
            raise TalkerArgsError("ref_offset must be >= 0")
        for row in self.ref_rows:
            if len(row) != NUM_CODEBOOKS or not all(0 <= c < CODEBOOK_VOCAB for c in row):
                raise TalkerArgsError(
                    f"reference rows need {NUM_CODEBOOKS} codes in [0, {CODEBOOK_VOCAB})"
                )
        if self.chunking is not None:
            try:
                validate_chunking(self.chunking_params())
            except (InvalidChunkingError, TypeError) as e:
                raise TalkerArgsError(f"bad chunking: {e}") from e

    @staticmethod
    def chunking_fields(params: ChunkingParams) -> tuple[int, int, int, int, float | None]:
        return (
            params.first_chunk_frames,
            params.chunk_frames,
            params.left_context_frames,
            params.right_holdback_frames,
            params.chunk_growth,
        )

    def chunking_params(self) -> ChunkingParams:
        if self.chunking is None:
            raise TalkerArgsError("this request asks for rows, not audio")
        return ChunkingParams(*self.chunking)

    def to_extra_args(self) -> dict[str, Any]:
        raw = asdict(self)
        raw["ref_rows"] = [list(r) for r in self.ref_rows]
        raw["chunking"] = None if self.chunking is None else list(self.chunking)
        return {EXTRA_ARGS_KEY: raw}

    @classmethod
    def from_extra_args(cls, extra_args: Mapping[str, Any] | None) -> TalkerArgs | None:
        """The settings in ``extra_args``; ``None`` for a request that carries none."""
        raw = (extra_args or {}).get(EXTRA_ARGS_KEY)
        if raw is None:
            return None
        if not isinstance(raw, Mapping):
            raise TalkerArgsError(f"{EXTRA_ARGS_KEY} must be a mapping")
        fields = dict(raw)
        fields["ref_rows"] = tuple(tuple(int(c) for c in r) for r in fields.get("ref_rows", ()))
        if fields.get("chunking") is not None:
            fields["chunking"] = tuple(fields["chunking"])
        try:
            return cls(**fields)
        except TypeError as e:
            raise TalkerArgsError(f"bad {EXTRA_ARGS_KEY}: {e}") from e


@dataclass(frozen=True)
class RowHeader:
    correlation_id: str
    index: int
    last: bool


@dataclass(frozen=True)
class RowEvent:
    header: RowHeader
    row: np.ndarray


@dataclass(frozen=True)
class FailureEvent:
    correlation_id: str
    reason: str


@dataclass(frozen=True)
class PcmHeader:
    correlation_id: str
    start_frame: int
    samples: int
    final: bool
    # Worker-side time.perf_counter() stamps (first chunk only): "first_row",
    # "first_frame_row". One host, one monotonic clock for every process.
    stamps: dict[str, float] | None = None
    # The request's delay-patterned rows [n, 8] (final chunk, when asked for).
    rows: np.ndarray | None = None
    # The data-parallel rank of the engine core that decoded the chunk; None:
    # left to the sender (``encode_pcm``'s ``rank``), or not known.
    rank: int | None = None


@dataclass(frozen=True)
class PcmEvent:
    correlation_id: str
    chunk: PcmChunk
    stamps: dict[str, float] | None = None
    rank: int | None = None  # data-parallel rank of the engine core that sent it


@dataclass(frozen=True)
class StepStats:
    """One engine core's cumulative step counters (sent alongside the audio).

    ``steps``: sampling steps with audio requests; ``rows``: the audio requests
    in them, summed (a step's batch); ``timed_steps`` of them, those that
    followed another step closely (not the first after an idle gap), took
    ``step_s`` seconds together."""

    steps: int
    rows: int
    timed_steps: int
    step_s: float
    rank: int | None = None  # data-parallel rank of the engine core


@dataclass(frozen=True)
class StatsEvent:
    stats: StepStats


_ROWS = b"R"
_FAILURE = b"E"
_PCM = b"P"
_STATS = b"S"


def encode_rows(headers: Sequence[RowHeader], rows: np.ndarray) -> list[bytes]:
    """One step's rows for one destination → multipart frames."""
    if rows.shape != (len(headers), NUM_CODEBOOKS):
        raise RowMessageError(f"rows shape {rows.shape} does not match {len(headers)} headers")
    head = json.dumps([[h.correlation_id, h.index, int(h.last)] for h in headers]).encode()
    return [_ROWS, head, np.ascontiguousarray(rows, dtype=_ROW_DTYPE).tobytes()]


def encode_pcm(
    headers: Sequence[PcmHeader], pcm: Sequence[np.ndarray], rank: int | None = None
) -> list[bytes]:
    """Chunks for one destination → multipart frames.

    ``rank`` (the sending engine core's data-parallel rank) goes into every
    header that does not name its own.
    """
    if len(pcm) != len(headers) or any(
        p.size != h.samples for p, h in zip(pcm, headers, strict=True)
    ):
        raise RowMessageError("PCM chunks do not match their headers")
    head = json.dumps(
        [
            [
                h.correlation_id,
                h.start_frame,
                h.samples,
                int(h.final),
                h.stamps,
                _rows_text(h.rows),
                h.rank if h.rank is not None else rank,
            ]
            for h in headers
        ]
    ).encode()
    body = b"".join(np.ascontiguousarray(p, dtype=_PCM_DTYPE).tobytes() for p in pcm)
    return [_PCM, head, body]


def _rows_text(rows: np.ndarray | None) -> str | None:
    """Rows for a JSON header: int16 bytes in base64 (once per request, a few KB)."""
    if rows is None:
        return None
    if rows.ndim != 2 or rows.shape[1] != NUM_CODEBOOKS:
        raise RowMessageError(f"rows must be [n, {NUM_CODEBOOKS}], got {rows.shape}")
    return base64.b64encode(np.ascontiguousarray(rows, dtype=_ROW_DTYPE).tobytes()).decode()


def _rows_from_text(text: object) -> np.ndarray | None:
    if text is None:
        return None
    raw = base64.b64decode(str(text), validate=True)
    codes = np.frombuffer(raw, dtype=_ROW_DTYPE)
    if codes.size % NUM_CODEBOOKS:
        raise RowMessageError("returned rows are not whole rows")
    return codes.reshape(-1, NUM_CODEBOOKS).astype(np.int64)


def _pcm_header(fields: Sequence[Any]) -> PcmHeader:
    # Six fields from senders that predate the rank; a seventh, possibly null, after.
    c, f, n, last, s, r, *more = fields
    if len(more) > 1:
        raise RowMessageError(f"a PCM header has {len(fields)} fields")
    rank = None if not more or more[0] is None else int(more[0])
    return PcmHeader(str(c), int(f), int(n), bool(last), s, _rows_from_text(r), rank)


def _decode_pcm(head: Any, body_raw: bytes) -> list[PcmEvent]:
    headers = [_pcm_header(fields) for fields in head]
    if any(h.samples < 0 or h.start_frame < 0 for h in headers):
        raise RowMessageError("negative frame or sample count")
    if any(h.rank is not None and h.rank < 0 for h in headers):
        raise RowMessageError("negative rank")
    body = np.frombuffer(body_raw, dtype=_PCM_DTYPE)
    if body.size != sum(h.samples for h in headers):
        raise RowMessageError(f"PCM body holds {body.size} samples, headers name another count")
    events, at = [], 0
    for h in headers:
        pcm = body[at : at + h.samples].astype(np.float32)
        at += h.samples
        stamps = None if h.stamps is None else {str(k): float(v) for k, v in h.stamps.items()}
        chunk = PcmChunk(h.start_frame, pcm, h.final, h.rows)
        events.append(PcmEvent(h.correlation_id, chunk, stamps, h.rank))
    return events


def encode_failure(correlation_id: str, reason: str) -> list[bytes]:
    return [_FAILURE, json.dumps([correlation_id, reason]).encode(), b""]


def encode_stats(stats: StepStats, rank: int | None = None) -> list[bytes]:
    """An engine core's step counters; ``rank`` fills in one the counters lack."""
    own = stats.rank if stats.rank is not None else rank
    head = [stats.steps, stats.rows, stats.timed_steps, stats.step_s, own]
    return [_STATS, json.dumps(head).encode(), b""]


def _decode_stats(head: Any) -> StatsEvent:
    steps, rows, timed, seconds, rank = head
    stats = StepStats(
        int(steps), int(rows), int(timed), float(seconds), None if rank is None else int(rank)
    )
    counts = (stats.steps, stats.rows, stats.timed_steps, stats.rank or 0)
    if min(counts) < 0 or not 0.0 <= stats.step_s < float("inf") or stats.timed_steps > stats.steps:
        raise RowMessageError(f"bad step counters: {head}")
    return StatsEvent(stats)


Event = RowEvent | FailureEvent | PcmEvent | StatsEvent


def decode_message(frames: Sequence[bytes]) -> list[Event]:
    if len(frames) != 3:
        raise RowMessageError(f"expected 3 frames, got {len(frames)}")
    kind, head_raw, body_raw = frames
    try:
        head = json.loads(head_raw)
        if kind == _FAILURE:
            return [FailureEvent(str(head[0]), str(head[1]))]
        if kind == _PCM:
            return list(_decode_pcm(head, body_raw))
        if kind == _STATS:
            return [_decode_stats(head)]
        if kind != _ROWS:
            raise RowMessageError(f"unknown message kind {kind!r}")
        headers = [RowHeader(str(c), int(i), bool(last)) for c, i, last in head]
    except (ValueError, TypeError, IndexError, AttributeError, binascii.Error) as e:
        if isinstance(e, RowMessageError):
            raise
        raise RowMessageError(f"bad message header: {e}") from e
    body = np.frombuffer(body_raw, dtype=_ROW_DTYPE)
    if body.size != len(headers) * NUM_CODEBOOKS:
        raise RowMessageError(f"row body holds {body.size} codes for {len(headers)} rows")
    rows = body.reshape(len(headers), NUM_CODEBOOKS).astype(np.int64)
    return [RowEvent(h, r) for h, r in zip(headers, rows, strict=True)]


def engine_prompt(
    request: TalkerRequest, specials: SpecialIds
) -> tuple[list[int], int, tuple[tuple[int, ...], ...]]:
    """Token ids for vLLM, plus where the voice-clone rows go.

    Placeholders (-100) must form one run with one reference row each; they
    become ``<|audio|>`` ids for vLLM (whose inputs must be vocabulary ids),
    and the model embeds those positions from the rows instead.
    """
    ids = list(request.prompt.token_ids)
    holes = [i for i, t in enumerate(ids) if t == AUDIO_PLACEHOLDER_ID]
    ref = request.prompt.ref_rows
    n_ref = 0 if ref is None else int(ref.shape[0])
    if len(holes) != n_ref:
        raise TalkerError(f"prompt has {len(holes)} audio placeholders but {n_ref} reference rows")
    if not holes:
        return ids, 0, ()
    assert ref is not None
    if holes[-1] - holes[0] + 1 != len(holes):
        raise TalkerError("audio placeholders must be contiguous")
    if ref.ndim != 2 or ref.shape[1] != NUM_CODEBOOKS:
        raise TalkerError(f"reference rows must be [n, {NUM_CODEBOOKS}], got {ref.shape}")
    for i in holes:
        ids[i] = specials.audio
    rows = tuple(tuple(int(c) for c in r) for r in np.asarray(ref))
    return ids, holes[0], rows
