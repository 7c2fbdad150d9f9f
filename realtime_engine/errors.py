"""Typed errors shared across the engine packages."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint does not match the layout the loader expects.

    ``key`` names the offending tensor (or file) so the message is actionable.
    """

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class MissingKeyError(CheckpointError):
    """A required tensor is absent."""


class UnexpectedKeyError(CheckpointError):
    """A tensor the layout does not know about is present."""


class ShapeMismatchError(CheckpointError):
    """A tensor has the wrong shape."""


class TokenizerError(ValueError):
    """The tokenizer lacks special tokens the prompt format needs."""
