"""Benchmark texts and how they are fed: token by token like an LLM, or at once."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

# Plain sentences of everyday length (80-100 characters, ~5-7 s of speech).
TEXTS: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog, and then it runs back home before night.",
    "Hello world. Today's weather forecast is sunny in the afternoon, with a light wind.",
    "Every morning the old man walked along the river to watch the boats and the birds.",
    "Please remember to close the door when you leave the room, because the air is cold.",
    "She found a small blue book under the table and began to read the first page aloud.",
    "The children played music in the school hall while their mother and father listened.",
    "A great ship moved slowly across the ocean toward the island in the south.",
    "We should study the problem together and write down every answer we find.",
    "The train to the city leaves at seven, so we must be ready early in the morning.",
    "He told a long story about the mountain, the snow, and the strong cold wind.",
    "Listen carefully: the next step is simple, but it is easy to miss if you move too fast.",
    "Our family planted four green trees near the house during the warm spring week.",
    "The machine made a strange sound, then stopped, and the whole room was quiet again.",
    "If you want to learn a new language, read a little every day and speak it often.",
    "They drove north for an hour, crossed the river, and reached the farm before noon.",
    "This is a streaming speech synthesis benchmark that measures latency and throughput.",
)

# Word-piece-like tokens: a word with its leading space, a run of punctuation,
# or the whitespace left over. Long words are cut into pieces of at most 6
# letters, as subword tokenizers do.
_TOKEN = re.compile(r"\s?[^\W\d_]{1,6}|\s?\d{1,3}|\s?[^\w\s]+|\s+")


def tokenize(text: str) -> list[str]:
    """Split ``text`` into LLM-like pieces whose concatenation is ``text``."""
    pieces = _TOKEN.findall(text)
    if "".join(pieces) != text:  # characters the pattern does not cover (e.g. "_")
        return _cover(text)
    return pieces


def _cover(text: str) -> list[str]:
    pieces: list[str] = []
    pos = 0
    for m in _TOKEN.finditer(text):
        if m.start() > pos:
            pieces.append(text[pos : m.start()])
        pieces.append(m.group())
        pos = m.end()
    if pos < len(text):
        pieces.append(text[pos:])
    return pieces


@dataclass(frozen=True)
class TextPiece:
    offset_s: float  # when to send it, after the first piece
    text: str


def schedule(text: str, tokens_per_s: float | None) -> list[TextPiece]:
    """When each piece of ``text`` is sent: one token every ``1/tokens_per_s``
    seconds, or the whole text at offset 0 when ``tokens_per_s`` is ``None``."""
    if not text:
        return []
    if tokens_per_s is None:
        return [TextPiece(0.0, text)]
    if tokens_per_s <= 0:
        raise ValueError(f"tokens_per_s must be > 0, got {tokens_per_s}")
    return [TextPiece(i / tokens_per_s, piece) for i, piece in enumerate(tokenize(text))]


def pick_texts(count: int, seed: int, pool: tuple[str, ...] = TEXTS) -> list[str]:
    """``count`` texts drawn from ``pool``, reproducibly for a given seed."""
    rng = random.Random(seed)
    return [rng.choice(pool) for _ in range(count)]
