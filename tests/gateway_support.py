"""Shared pieces for the gateway tests: a small sentence segmenter and WS helpers."""

from __future__ import annotations

import re

from gateway.protocol import SessionConfig

_SENTENCE_END = re.compile(r"[.!?]+\s+")


class SentenceSegmenter:
    """Implements ``gateway.session.Segmenter``: sentence ends, else the buffer delay."""

    def __init__(self, max_delay_s: float) -> None:
        self.max_delay_s = max_delay_s
        self.buffer = ""
        self.first_unspoken_at: float | None = None

    def feed(self, text: str, now: float) -> list[str]:
        if text and not self.buffer:
            self.first_unspoken_at = now
        self.buffer += text
        out: list[str] = []
        while match := _SENTENCE_END.search(self.buffer):
            out.append(self.buffer[: match.end()])
            self.buffer = self.buffer[match.end() :]
        if out:
            self.first_unspoken_at = now if self.buffer else None
        return out

    def poll(self, now: float) -> list[str]:
        deadline = self.next_deadline()
        if deadline is None or now < deadline:
            return []
        cut = self.buffer.rfind(" ")
        if cut <= 0:
            return []
        head, self.buffer = self.buffer[: cut + 1], self.buffer[cut + 1 :]
        self.first_unspoken_at = now if self.buffer else None
        return [head]

    def flush(self) -> list[str]:
        out = [self.buffer] if self.buffer else []
        self.buffer, self.first_unspoken_at = "", None
        return out

    def next_deadline(self) -> float | None:
        if self.first_unspoken_at is None or " " not in self.buffer.strip():
            return None
        return self.first_unspoken_at + self.max_delay_s


def sentence_segmenter(config: SessionConfig) -> SentenceSegmenter:
    return SentenceSegmenter(config.text_buffering.max_buffer_delay_ms / 1000)
