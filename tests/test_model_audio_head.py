"""Fused multi-codebook audio embedding and the tied audio head."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from realtime_engine.model.audio_head import AudioCodeError, audio_logits, fused_audio_embedding
from realtime_engine.model.config import HiggsTalkerConfig
from realtime_engine.model.prompts import PromptError
from realtime_engine.model.talker import HiggsTalker


def _one_hot_weight(num_codebooks: int, vocab: int) -> torch.Tensor:
    """Row r is the unit vector e_r: an embedding sum shows exactly which rows were read."""
    return torch.eye(num_codebooks * vocab)


@pytest.mark.parametrize("codes", list(itertools.product(range(3), repeat=2)))
def test_embedding_reads_codebook_major_rows_exhaustive(codes: tuple[int, int]) -> None:
    vocab = 3
    out = fused_audio_embedding(_one_hot_weight(2, vocab), torch.tensor(codes), vocab)
    expected = torch.zeros(6)
    expected[codes[0]] += 1  # codebook 0: rows 0..2
    expected[vocab + codes[1]] += 1  # codebook 1: rows 3..5
    assert torch.equal(out, expected)


@settings(max_examples=50, deadline=None)
@given(
    rows=st.lists(st.lists(st.integers(0, 1025), min_size=8, max_size=8), min_size=1, max_size=6)
)
def test_embedding_is_the_sum_of_offset_rows(rows: list[list[int]]) -> None:
    weight = torch.randn(8 * 1026, 16, generator=torch.Generator().manual_seed(0))
    codes = torch.tensor(rows)
    out = fused_audio_embedding(weight, codes, 1026)
    for r, row in enumerate(rows):
        expected = sum(weight[q * 1026 + c] for q, c in enumerate(row))
        torch.testing.assert_close(out[r], expected)
        # A row's embedding does not depend on the rows embedded with it.
        assert torch.equal(fused_audio_embedding(weight, codes[r], 1026), out[r])


@pytest.mark.parametrize("bad", [-1, 1026, 5000])
def test_out_of_range_code_is_rejected(bad: int) -> None:
    weight = torch.zeros(8 * 1026, 4)
    codes = torch.zeros(8, dtype=torch.long)
    codes[7] = bad
    with pytest.raises(AudioCodeError, match="codes must lie in"):
        fused_audio_embedding(weight, codes, 1026)


def test_wrong_row_width_is_rejected() -> None:
    with pytest.raises(AudioCodeError, match="8 codes"):
        fused_audio_embedding(torch.zeros(8 * 1026, 4), torch.zeros(7, dtype=torch.long), 1026)


def test_logits_are_hidden_times_weight_per_codebook() -> None:
    g = torch.Generator().manual_seed(1)
    weight = torch.randn(2 * 5, 3, generator=g)
    hidden = torch.randn(4, 3, generator=g)
    logits = audio_logits(hidden.bfloat16(), weight.bfloat16(), 5)
    assert logits.shape == (4, 2, 5) and logits.dtype == torch.float32
    for q, c in itertools.product(range(2), range(5)):
        expected = hidden.bfloat16() @ weight[q * 5 + c].bfloat16()
        torch.testing.assert_close(logits[:, q, c], expected.float(), atol=0.05, rtol=0.02)
    per_row = audio_logits(hidden, weight, 5, per_row=True)
    assert torch.equal(per_row[2], audio_logits(hidden[2], weight, 5))


def _small_config(tie: bool) -> HiggsTalkerConfig:
    return HiggsTalkerConfig(
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=4,
        intermediate_size=16,
        vocab_size=32,
        tie_audio_head=tie,
    )


def test_tied_head_uses_the_embedding_matrix() -> None:
    model = HiggsTalker(_small_config(tie=True))
    assert model.audio_head is None
    assert model.audio_head_weight is model.audio_embedding.weight
    untied = HiggsTalker(_small_config(tie=False))
    assert untied.audio_head is not None
    assert untied.audio_head_weight is untied.audio_head.weight


def test_embed_prompt_places_reference_rows_in_order() -> None:
    torch.manual_seed(0)
    model = HiggsTalker(_small_config(tie=True))
    ids = torch.tensor([3, -100, -100, 4, -100, 5])
    rows = torch.tensor([[1] * 8, [2] * 8, [1024] * 8])
    with torch.no_grad():
        embeds = model.embed_prompt(ids, rows)
        for position, token in ((0, 3), (3, 4), (5, 5)):
            assert torch.equal(embeds[position], model.text_embedding.weight[token])
        for position, row in ((1, rows[0]), (2, rows[1]), (4, rows[2])):
            assert torch.equal(embeds[position], model.embed_audio_rows(row))


def test_embed_prompt_counts_must_match() -> None:
    model = HiggsTalker(_small_config(tie=True))
    ids = torch.tensor([3, -100, -100, 4])
    with pytest.raises(PromptError, match="2 audio placeholders but 1 reference rows"):
        model.embed_prompt(ids, torch.zeros(1, 8, dtype=torch.long))
    with pytest.raises(PromptError, match="2 audio placeholders but 0 reference rows"):
        model.embed_prompt(ids, None)
    with pytest.raises(PromptError, match="outside the text vocabulary"):
        model.embed_prompt(torch.tensor([3, 32]))
