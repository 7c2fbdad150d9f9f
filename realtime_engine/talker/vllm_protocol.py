"""What crosses between the serving process and the engine workers (no I/O here).

Requests carry their talker settings in ``SamplingParams.extra_args`` (msgpack:
only plain ints, floats, strings, lists and dicts). Workers send code rows
back as one message per decode step and destination: a JSON header naming
each row's request (correlation id), row index and whether it is the last,
plus the rows as little-endian int16 ``[k, 8]``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from realtime_engine.talker.types import CODEBOOK_VOCAB, NUM_CODEBOOKS

EXTRA_ARGS_KEY = "higgs_talker"
# Longest repetition-aware-sampling window the device buffers hold.
MAX_RAS_WINDOW = 32
_ROW_DTYPE = np.dtype("<i2")


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

    def to_extra_args(self) -> dict[str, Any]:
        raw = asdict(self)
        raw["ref_rows"] = [list(r) for r in self.ref_rows]
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


_ROWS = b"R"
_FAILURE = b"E"


def encode_rows(headers: Sequence[RowHeader], rows: np.ndarray) -> list[bytes]:
    """One step's rows for one destination → multipart frames."""
    if rows.shape != (len(headers), NUM_CODEBOOKS):
        raise RowMessageError(f"rows shape {rows.shape} does not match {len(headers)} headers")
    head = json.dumps([[h.correlation_id, h.index, int(h.last)] for h in headers]).encode()
    return [_ROWS, head, np.ascontiguousarray(rows, dtype=_ROW_DTYPE).tobytes()]


def encode_failure(correlation_id: str, reason: str) -> list[bytes]:
    return [_FAILURE, json.dumps([correlation_id, reason]).encode(), b""]


def decode_message(frames: Sequence[bytes]) -> list[RowEvent | FailureEvent]:
    if len(frames) != 3:
        raise RowMessageError(f"expected 3 frames, got {len(frames)}")
    kind, head_raw, body_raw = frames
    try:
        head = json.loads(head_raw)
        if kind == _FAILURE:
            return [FailureEvent(str(head[0]), str(head[1]))]
        if kind != _ROWS:
            raise RowMessageError(f"unknown message kind {kind!r}")
        headers = [RowHeader(str(c), int(i), bool(last)) for c, i, last in head]
    except (ValueError, TypeError, IndexError) as e:
        raise RowMessageError(f"bad message header: {e}") from e
    body = np.frombuffer(body_raw, dtype=_ROW_DTYPE)
    if body.size != len(headers) * NUM_CODEBOOKS:
        raise RowMessageError(f"row body holds {body.size} codes for {len(headers)} rows")
    rows = body.reshape(len(headers), NUM_CODEBOOKS).astype(np.int64)
    return [RowEvent(h, r) for h, r in zip(headers, rows, strict=True)]
