"""Adapts ``realtime_engine.text.segmenter.TextSegmenter`` to the session's ``Segmenter``.

The session keeps manual-mode text itself (so any segmenter works), hence the
text segmenter always runs in ``auto`` mode here; the session clock is in
seconds, the segmenter's in milliseconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.protocol import SessionConfig
from gateway.realtime.session import Segmenter

if TYPE_CHECKING:
    from realtime_engine.text.segmenter import Segment, TextSegmenter


def default_segmenter_factory(config: SessionConfig) -> Segmenter:
    from realtime_engine.text.segmenter import SegmenterConfig, TextSegmenter

    delay_ms = config.text_buffering.max_buffer_delay_ms
    return TextSegmenterAdapter(TextSegmenter(SegmenterConfig(max_buffer_delay_ms=delay_ms)))


def _texts(segments: list[Segment]) -> list[str]:
    return [s.text for s in segments]


class TextSegmenterAdapter:
    def __init__(self, inner: TextSegmenter) -> None:
        self._inner = inner

    def feed(self, text: str, now: float) -> list[str]:
        return _texts(self._inner.feed(text, now * 1000))

    def poll(self, now: float) -> list[str]:
        return _texts(self._inner.poll(now * 1000))

    def flush(self) -> list[str]:
        return _texts(self._inner.flush())

    def next_deadline(self) -> float | None:
        deadline = self._inner.next_deadline_ms()
        return None if deadline is None else deadline / 1000
