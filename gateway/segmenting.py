"""Adapts ``realtime_engine.text.segmenter.TextSegmenter`` to the session's ``Segmenter``."""

from __future__ import annotations

from typing import Any

from gateway.protocol import SessionConfig
from gateway.session import Segmenter


def default_segmenter_factory(config: SessionConfig) -> Segmenter:
    from realtime_engine.text.segmenter import TextSegmenter

    inner = TextSegmenter(max_buffer_delay_ms=config.text_buffering.max_buffer_delay_ms)
    return TextSegmenterAdapter(inner)


def _texts(segments: Any) -> list[str]:
    return [getattr(s, "text", s) for s in segments or ()]


class TextSegmenterAdapter:
    """Times in seconds on the session clock; segments as plain strings."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def feed(self, text: str, now: float) -> list[str]:
        return _texts(self._inner.feed(text, now))

    def poll(self, now: float) -> list[str]:
        return _texts(self._inner.poll(now))

    def flush(self) -> list[str]:
        return _texts(self._inner.flush())

    def next_deadline(self) -> float | None:
        deadline: float | None = self._inner.next_deadline()
        return deadline
