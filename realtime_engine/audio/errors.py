"""Typed errors of the audio output path."""

from __future__ import annotations


class AudioFormatError(ValueError):
    """An output format, sample rate or frame size that cannot be produced.

    ``param`` names the offending setting so the gateway can report it.
    """

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class UnsupportedFormatError(AudioFormatError):
    """The requested format is unknown or its encoder is not available."""


class FrameFormatError(ValueError):
    """A binary audio frame cannot be packed or parsed (bad field or bytes)."""


class AudioEncodeError(RuntimeError):
    """The codec library failed to encode a frame, or the encoder was misused."""
