"""Talker prompts (no chat template).

- zero-shot: ``<|tts|> <|text|> tok(text) <|audio|>``
- voice clone: ``<|tts|> [<|ref_text|> tok(ref_text)] <|ref_audio|> [-100] × (T_ref + 7)
  <|text|> tok(text) <|audio|>``

The ``-100`` placeholders stand for the delay-patterned reference code rows,
which travel beside the ids in :class:`TalkerPrompt` and are embedded with the
fused audio embedding at prefill. The prompt ends on ``<|audio|>``: the hidden
state there yields the first code row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from realtime_engine.codec.delay import apply_delay
from realtime_engine.format import CODEBOOK_SIZE, NUM_CODEBOOKS
from realtime_engine.model.config import AUDIO_PLACEHOLDER_ID
from realtime_engine.model.tokenizer import HiggsTokenizer


@dataclass(frozen=True)
class TalkerPrompt:
    """Token ids of a prompt; ``-100`` entries are audio placeholders.

    ``ref_rows`` holds the delay-patterned reference code rows, one per
    placeholder, in order ([n_placeholders, 8]); ``None`` for zero-shot prompts.
    """

    token_ids: tuple[int, ...]
    ref_rows: np.ndarray | None = None


class PromptError(ValueError):
    """Text or reference audio cannot form a talker prompt."""


def _encode_user_text(tokenizer: HiggsTokenizer, text: str, what: str) -> list[int]:
    if not text.strip():
        raise PromptError(f"{what} must not be empty")
    ids = tokenizer.encode(text)
    # Structure tokens typed by a user would let text rewrite the prompt.
    forbidden = tokenizer.specials.all().intersection(ids)
    if forbidden:
        names = sorted(tokenizer.decode([i]) for i in forbidden)
        raise PromptError(f"{what} contains reserved tokens: {', '.join(names)}")
    return ids


def build_zero_shot_prompt(tokenizer: HiggsTokenizer, text: str) -> TalkerPrompt:
    """``<|tts|> <|text|> tok(text) <|audio|>``; :class:`PromptError` for empty text."""
    sp = tokenizer.specials
    ids = [sp.tts, sp.text, *_encode_user_text(tokenizer, text, "text"), sp.audio]
    return TalkerPrompt(token_ids=tuple(ids), ref_rows=None)


def build_clone_prompt(
    tokenizer: HiggsTokenizer,
    text: str,
    ref_codes: np.ndarray,
    ref_text: str | None = None,
) -> TalkerPrompt:
    """Voice-clone prompt from raw reference codes ``[T_ref, 8]`` (codec frames, values 0..1023).

    The codes are delay-patterned here into ``T_ref + 7`` rows, one per
    placeholder. ``ref_text`` (the reference transcript) is optional.
    """
    codes = np.asarray(ref_codes)
    if codes.ndim != 2 or codes.shape[1] != NUM_CODEBOOKS or codes.shape[0] < 1:
        raise PromptError(
            f"reference codes must be [frames >= 1, {NUM_CODEBOOKS}], got shape {codes.shape}"
        )
    if not np.issubdtype(codes.dtype, np.integer):
        raise PromptError(f"reference codes must be integers, got {codes.dtype}")
    if codes.min() < 0 or codes.max() >= CODEBOOK_SIZE:
        raise PromptError(f"reference codes must lie in [0, {CODEBOOK_SIZE})")
    rows = apply_delay(codes.astype(np.int64))
    sp = tokenizer.specials
    ids = [sp.tts]
    if ref_text is not None:
        ids += [sp.ref_text, *_encode_user_text(tokenizer, ref_text, "reference text")]
    ids += [sp.ref_audio, *([AUDIO_PLACEHOLDER_ID] * rows.shape[0])]
    ids += [sp.text, *_encode_user_text(tokenizer, text, "text"), sp.audio]
    return TalkerPrompt(token_ids=tuple(ids), ref_rows=rows)
