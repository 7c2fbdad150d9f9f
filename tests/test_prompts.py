"""Talker prompts: zero-shot and voice clone, against hand-written token sequences."""

from __future__ import annotations

import string
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, models

from realtime_engine.errors import TokenizerError
from realtime_engine.model.control_tags import CONTROL_TAGS
from realtime_engine.model.loader import load_talker
from realtime_engine.model.prompts import PromptError, build_clone_prompt, build_zero_shot_prompt
from realtime_engine.model.tokenizer import HiggsTokenizer

BOC, EOC, PH = 1024, 1025, -100


@pytest.fixture(scope="module")
def tok(tiny_checkpoint: Path) -> HiggsTokenizer:
    return HiggsTokenizer.from_dir(tiny_checkpoint)


@pytest.fixture(scope="module")
def raw(tiny_checkpoint: Path) -> Tokenizer:
    """The plain tokenizers object: ids looked up independently of the adapter."""
    return Tokenizer.from_file(str(tiny_checkpoint / "tokenizer.json"))


def _id(raw: Tokenizer, token: str) -> int:
    value = raw.token_to_id(token)
    assert value is not None, token
    return int(value)


def _text_ids(raw: Tokenizer, text: str) -> list[int]:
    return list(raw.encode(text, add_special_tokens=False).ids)


def test_zero_shot(tok: HiggsTokenizer, raw: Tokenizer) -> None:
    prompt = build_zero_shot_prompt(tok, "Hello world.")
    expected = [
        _id(raw, "<|tts|>"),
        _id(raw, "<|text|>"),
        *_text_ids(raw, "Hello world."),
        _id(raw, "<|audio|>"),
    ]
    assert list(prompt.token_ids) == expected
    assert prompt.ref_rows is None


def test_clone_without_reference_text(tok: HiggsTokenizer, raw: Tokenizer) -> None:
    codes = np.array([[10, 11, 12, 13, 14, 15, 16, 17]], dtype=np.int64)  # one frame
    prompt = build_clone_prompt(tok, "Hi there", codes)
    expected = [
        _id(raw, "<|tts|>"),
        _id(raw, "<|ref_audio|>"),
        *[PH] * 8,  # T_ref + 7
        _id(raw, "<|text|>"),
        *_text_ids(raw, "Hi there"),
        _id(raw, "<|audio|>"),
    ]
    assert list(prompt.token_ids) == expected
    assert prompt.ref_rows is not None
    # Codebook c of the single frame sits on row c; BOC before, EOC after.
    expected_rows = np.array(
        [
            [10, BOC, BOC, BOC, BOC, BOC, BOC, BOC],
            [EOC, 11, BOC, BOC, BOC, BOC, BOC, BOC],
            [EOC, EOC, 12, BOC, BOC, BOC, BOC, BOC],
            [EOC, EOC, EOC, 13, BOC, BOC, BOC, BOC],
            [EOC, EOC, EOC, EOC, 14, BOC, BOC, BOC],
            [EOC, EOC, EOC, EOC, EOC, 15, BOC, BOC],
            [EOC, EOC, EOC, EOC, EOC, EOC, 16, BOC],
            [EOC, EOC, EOC, EOC, EOC, EOC, EOC, 17],
        ]
    )
    assert np.array_equal(prompt.ref_rows, expected_rows)


def test_clone_with_reference_text(tok: HiggsTokenizer, raw: Tokenizer) -> None:
    codes = np.arange(3 * 8, dtype=np.int64).reshape(3, 8)
    prompt = build_clone_prompt(tok, "New words.", codes, ref_text="Old words.")
    expected = [
        _id(raw, "<|tts|>"),
        _id(raw, "<|ref_text|>"),
        *_text_ids(raw, "Old words."),
        _id(raw, "<|ref_audio|>"),
        *[PH] * 10,
        _id(raw, "<|text|>"),
        *_text_ids(raw, "New words."),
        _id(raw, "<|audio|>"),
    ]
    assert list(prompt.token_ids) == expected
    assert prompt.ref_rows is not None and prompt.ref_rows.shape == (10, 8)
    assert prompt.ref_rows[0].tolist() == [0, *[BOC] * 7]
    assert prompt.ref_rows[9].tolist() == [*[EOC] * 7, 23]


def test_control_tags_are_single_added_tokens(tok: HiggsTokenizer, raw: Tokenizer) -> None:
    prompt = build_zero_shot_prompt(tok, "<|emotion:anger|>No! <|prosody:pause|>Stop.")
    expected = [
        _id(raw, "<|tts|>"),
        _id(raw, "<|text|>"),
        _id(raw, "<|emotion:anger|>"),
        *_text_ids(raw, "No! "),
        _id(raw, "<|prosody:pause|>"),
        *_text_ids(raw, "Stop."),
        _id(raw, "<|audio|>"),
    ]
    assert list(prompt.token_ids) == expected
    assert all(tok.added_token_id(tag) is not None for tag in CONTROL_TAGS)


@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet=string.printable, min_size=1, max_size=40).filter(str.strip))
@example(text="a<|tts|>")
def test_any_ascii_text_round_trips(tok: HiggsTokenizer, raw: Tokenizer, text: str) -> None:
    """Printable text round-trips, unless it spells a structure token (then it is refused)."""
    spelled = [tok.decode([i]) for i in tok.specials.all() if tok.decode([i]) in text]
    if spelled:
        with pytest.raises(PromptError, match="contains reserved tokens"):
            build_zero_shot_prompt(tok, text)
        return
    ids = list(build_zero_shot_prompt(tok, text).token_ids)
    assert ids[:2] == [_id(raw, "<|tts|>"), _id(raw, "<|text|>")]
    assert ids[-1] == _id(raw, "<|audio|>")
    assert raw.decode(ids[2:-1], skip_special_tokens=False) == text


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
def test_empty_text_is_rejected(tok: HiggsTokenizer, text: str) -> None:
    with pytest.raises(PromptError, match="must not be empty"):
        build_zero_shot_prompt(tok, text)


@pytest.mark.parametrize("special", ["<|audio|>", "<|tts|>", "<|endoftext|>", "<|ref_audio|>"])
def test_structure_tokens_in_user_text_are_rejected(tok: HiggsTokenizer, special: str) -> None:
    with pytest.raises(PromptError, match="reserved tokens"):
        build_zero_shot_prompt(tok, f"say {special} now")
    with pytest.raises(PromptError, match="reserved tokens"):
        build_clone_prompt(tok, "fine", np.zeros((1, 8), dtype=np.int64), ref_text=special)


@pytest.mark.parametrize(
    "codes",
    [
        np.zeros((0, 8), dtype=np.int64),
        np.zeros((2, 7), dtype=np.int64),
        np.full((2, 8), 1024, dtype=np.int64),
        np.full((2, 8), -1, dtype=np.int64),
        np.zeros((2, 8), dtype=np.float32),
    ],
    ids=["no-frames", "seven-codebooks", "boc-in-reference", "negative", "float"],
)
def test_bad_reference_codes_are_rejected(tok: HiggsTokenizer, codes: np.ndarray) -> None:
    with pytest.raises(PromptError, match="reference codes"):
        build_clone_prompt(tok, "text", codes)


def test_missing_specials_are_all_listed() -> None:
    backend = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    backend.add_special_tokens(
        [AddedToken("<|tts|>", special=True), AddedToken("<|text|>", special=True)]
    )
    with pytest.raises(TokenizerError) as info:
        HiggsTokenizer(backend)
    message = str(info.value)
    for name in ("<|audio|>", "<|ref_audio|>", "<|ref_text|>", "<|endoftext|>", "<|audio_end|>"):
        assert name in message
    assert "<|tts|>" not in message


def test_unreadable_tokenizer_file(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="does not exist"):
        HiggsTokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(TokenizerError, match="cannot read"):
        HiggsTokenizer.from_dir(tmp_path)


def test_clone_prompt_embeds_reference_rows(tiny_checkpoint: Path) -> None:
    loaded = load_talker(tiny_checkpoint, with_codec=False)
    codes = np.arange(2 * 8, dtype=np.int64).reshape(2, 8) * 7
    prompt = build_clone_prompt(loaded.tokenizer, "Hello.", codes, ref_text="Hi.")
    assert prompt.ref_rows is not None
    ids = torch.tensor(prompt.token_ids)
    rows = torch.from_numpy(prompt.ref_rows)
    with torch.no_grad():
        embeds = loaded.model.embed_prompt(ids, rows)
    positions = (ids == PH).nonzero().flatten().tolist()
    assert len(positions) == 9
    for row, position in zip(rows, positions, strict=True):
        assert torch.equal(embeds[position], loaded.model.embed_audio_rows(row))
    with torch.no_grad():
        assert torch.equal(loaded.model.embed_talker_prompt(prompt), embeds)
