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

# Replies the length a chat model gives (300-400 characters, ~20 s of speech),
# for measuring how the server cuts LLM-paced text (``bench.segment_sim``).
REPLIES: tuple[str, ...] = (
    "Sure, here is a quick summary. The meeting moved to Thursday at ten, because two of "
    "the speakers could not make it on Monday. Please bring the draft report, the budget "
    "sheet and your notes from last week. If anything is unclear, send me a message before "
    "Wednesday evening, and I will update the agenda so that everyone has time to prepare.",
    "Okay. I checked the logs, and the error started yesterday around noon. It seems the "
    "cache filled up, so new requests waited for a slot and then timed out. I cleared it, "
    "restarted the worker, and watched it for an hour; everything looks normal now. Next "
    "week we should add an alert for this, so that it cannot happen again without anyone "
    "noticing.",
    "Great question! Plants turn light into food through photosynthesis: the leaves take in "
    "carbon dioxide from the air and water from the roots, and sunlight gives them the energy "
    "to make sugar. Oxygen is what is left over, and it goes back into the air. That is why "
    "forests matter so much for the air we breathe.",
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
