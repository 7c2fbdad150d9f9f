"""Inline control tags of Higgs Audio v3, written inside the text as ``<|category:tag|>``.

Sentence-level tags (emotion, style, speed, pitch, expressiveness) go at the
start of a sentence, pause tags where the break falls, and a sound-effect tag
directly before its onomatopoeia (``<|sfx:laughter|>Haha``).
"""

from __future__ import annotations

import re

EMOTIONS = (
    "elation", "amusement", "enthusiasm", "determination", "pride", "contentment",
    "affection", "relief", "contemplation", "confusion", "surprise", "awe", "longing",
    "arousal", "anger", "fear", "disgust", "bitterness", "sadness", "shame", "helplessness",
)  # fmt: skip
STYLES = ("singing", "shouting", "whispering")
SOUND_EFFECTS = (
    "cough", "laughter", "crying", "screaming", "burping", "humming", "sigh", "sniff", "sneeze",
)  # fmt: skip
PROSODY = (
    "speed_very_slow", "speed_slow", "speed_fast", "speed_very_fast", "pitch_low",
    "pitch_high", "pause", "long_pause", "expressive_high", "expressive_low",
)  # fmt: skip

CATEGORIES: dict[str, tuple[str, ...]] = {
    "emotion": EMOTIONS,
    "style": STYLES,
    "sfx": SOUND_EFFECTS,
    "prosody": PROSODY,
}

CONTROL_TAGS: tuple[str, ...] = tuple(
    f"<|{category}:{tag}|>" for category, tags in CATEGORIES.items() for tag in tags
)

CONTROL_TAG_PATTERN = re.compile(r"<\|(emotion|style|sfx|prosody):([a-z_]+)\|>")


def is_control_tag(token: str) -> bool:
    return token in _TAG_SET


_TAG_SET = frozenset(CONTROL_TAGS)
