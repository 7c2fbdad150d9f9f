"""Typed errors of the codec package (checkpoint errors live in
``realtime_engine.errors``)."""

from __future__ import annotations


class CodecInputError(ValueError):
    """Codes or code rows of the wrong shape, type or range."""


class StreamStateError(RuntimeError):
    """A streaming decoder was used out of order (fed after finish, a decode
    job completed twice or out of sequence)."""


class InvalidChunkingError(ValueError):
    """Chunking parameters out of range, or an unknown preset name."""
