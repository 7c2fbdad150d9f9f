"""The codec encoder: strict layout, codes from audio, and the VQ argmin."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from realtime_engine.codec.decoder import load_codec_decoder
from realtime_engine.codec.encoder import CodecEncoder, hubert_heads, load_codec_encoder
from realtime_engine.codec.encoder_modules import EncodingRVQ, nearest_code
from realtime_engine.codec.errors import CodecInputError
from realtime_engine.codec.hubert import LEGACY, PARAMETRIZED, POS_CONV
from realtime_engine.codec.layout import CodecDims, random_codec_state_dict
from realtime_engine.errors import MissingKeyError, ShapeMismatchError, UnexpectedKeyError

HOP = 960
RATE = 24_000


@pytest.fixture(scope="module")
def state() -> dict[str, torch.Tensor]:
    return random_codec_state_dict(CodecDims.tiny(), torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def encoder(state: dict[str, torch.Tensor]) -> CodecEncoder:
    return load_codec_encoder(state)


def _voice_like(seconds: float, seed: int = 0) -> np.ndarray:
    """A harmonic tone with noise: varied enough that codes differ frame to frame."""
    n = round(seconds * RATE)
    t = np.arange(n) / RATE
    rng = np.random.default_rng(seed)
    tone = 0.3 * np.sin(2 * np.pi * (140 + 40 * np.sin(2 * np.pi * 0.7 * t)) * t)
    return (tone + 0.05 * rng.standard_normal(n)).astype(np.float32)


# ---------------------------------------------------------------- layout


def test_a_missing_encoder_tensor_is_named(state: dict[str, torch.Tensor]) -> None:
    for key in (
        "acoustic_encoder.block.2.conv1.weight",
        "encoder_semantic.conv_blocks.1.conv.bias",
        "semantic_model.encoder.layers.0.attention.q_proj.weight",
        "quantizer.quantizers.5.project_in.weight",
        "fc.bias",
    ):
        broken = {k: v for k, v in state.items() if k != key}
        with pytest.raises(MissingKeyError) as caught:
            load_codec_encoder(broken)
        assert caught.value.key == key
        assert key in str(caught.value)


@pytest.mark.parametrize(
    "key",
    [
        "acoustic_encoder.block.9.conv1.weight",
        "semantic_model.encoder.layers.7.attention.q_proj.weight",
        "encoder_semantic.extra.weight",
        "quantizer.quantizers.0.project_in.scale",
    ],
)
def test_an_unknown_tensor_is_named(state: dict[str, torch.Tensor], key: str) -> None:
    with pytest.raises(UnexpectedKeyError) as caught:
        load_codec_encoder({**state, key: torch.zeros(3)})
    assert caught.value.key == key


@pytest.mark.parametrize(
    "key",
    [
        "acoustic_encoder.conv2.weight",
        "semantic_model.feature_projection.layer_norm.bias",
        "fc.weight",
        "quantizer.quantizers.3.project_in.bias",
    ],
)
def test_a_wrong_shape_is_named(state: dict[str, torch.Tensor], key: str) -> None:
    bad = torch.zeros(*state[key].shape[:-1], state[key].shape[-1] + 1)
    with pytest.raises(ShapeMismatchError) as caught:
        load_codec_encoder({**state, key: bad})
    assert caught.value.key == key


def test_both_weight_norm_forms_load_to_the_same_encoder(
    state: dict[str, torch.Tensor], encoder: CodecEncoder
) -> None:
    legacy = dict(state)
    for old, new in zip(LEGACY, PARAMETRIZED, strict=True):
        legacy[POS_CONV + old] = legacy.pop(POS_CONV + new)
    other = load_codec_encoder(legacy)
    pcm = _voice_like(1.5)
    assert np.array_equal(other.encode_clip(pcm), encoder.encode_clip(pcm))


def test_masked_spec_embed_is_optional(state: dict[str, torch.Tensor]) -> None:
    trimmed = {k: v for k, v in state.items() if not k.endswith("masked_spec_embed")}
    assert len(trimmed) == len(state) - 1
    load_codec_encoder(trimmed)


def test_hubert_heads_follow_the_head_size() -> None:
    assert hubert_heads(768) == 12
    assert hubert_heads(1024) == 16
    assert hubert_heads(CodecDims.tiny().semantic_dim) == CodecDims.tiny().hubert_heads


# ---------------------------------------------------------------- audio -> codes -> audio


@pytest.mark.parametrize("samples", [RATE, RATE + 1, RATE + HOP - 1, 2 * RATE + 480, 3 * RATE])
def test_round_trip_shapes_and_frame_count(
    encoder: CodecEncoder, state: dict[str, torch.Tensor], samples: int
) -> None:
    codes = encoder.encode_clip(_voice_like(samples / RATE))
    frames = math.ceil(samples / HOP)
    assert codes.shape == (frames, 8)
    assert codes.dtype == np.int64
    assert codes.min() >= 0 and codes.max() < 1024
    pcm = load_codec_decoder(state).decode_numpy(codes.T[None])
    assert pcm.shape == (1, frames * HOP)
    assert np.isfinite(pcm).all()


def test_encoding_is_deterministic_and_depends_on_the_audio(encoder: CodecEncoder) -> None:
    pcm = _voice_like(2.0)
    first = encoder.encode_clip(pcm)
    assert np.array_equal(first, encoder.encode_clip(pcm.copy()))
    assert not np.array_equal(first, encoder.encode_clip(_voice_like(2.0, seed=1)))
    # codes vary along the clip (not one row repeated)
    assert len({tuple(r) for r in first}) > 1


def test_bad_clips_are_typed_errors(encoder: CodecEncoder) -> None:
    with pytest.raises(CodecInputError, match="at least 1 s"):
        encoder.encode_clip(_voice_like(0.5))
    nan = _voice_like(1.2)
    nan[100] = np.nan
    with pytest.raises(CodecInputError, match="NaN"):
        encoder.encode_clip(nan)
    with pytest.raises(CodecInputError, match="24000 Hz"):
        encoder.encode_clip(_voice_like(1.2), sample_rate=16_000)


# ---------------------------------------------------------------- VQ argmin


def _brute_force_rvq(rvq: EncodingRVQ, latent: np.ndarray) -> np.ndarray:
    """Residual VQ by explicit loops over frames and codes, in float64."""
    codes = np.zeros((len(rvq.quantizers), latent.shape[0]), dtype=np.int64)
    for t in range(latent.shape[0]):
        residual = latent[t].astype(np.float64)
        for q, layer in enumerate(rvq.quantizers):
            w_in = layer.project_in.weight.detach().double().numpy()
            b_in = layer.project_in.bias.detach().double().numpy()
            w_out = layer.project_out.weight.detach().double().numpy()
            b_out = layer.project_out.bias.detach().double().numpy()
            embed = layer.codebook.embed.double().numpy()
            z = w_in @ residual + b_in
            best, best_d = -1, math.inf
            for k in range(embed.shape[0]):
                d = float(((z - embed[k]) ** 2).sum())
                if d < best_d:
                    best, best_d = k, d
            codes[q, t] = best
            residual = residual - (w_out @ embed[best] + b_out)
    return codes


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), frames=st.integers(1, 6))
def test_vq_argmin_equals_brute_force(seed: int, frames: int) -> None:
    dims = CodecDims.tiny()
    g = torch.Generator().manual_seed(seed)
    rvq = EncodingRVQ(dims).double()
    with torch.no_grad():
        for layer in rvq.quantizers:
            layer.codebook.embed.copy_(torch.randn(layer.codebook.embed.shape, generator=g))
            for p in (*layer.project_in.parameters(), *layer.project_out.parameters()):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
        latent = torch.randn(1, frames, dims.latent_dim, generator=g, dtype=torch.float64)
        got = rvq(latent)[0].numpy()
    assert np.array_equal(got, _brute_force_rvq(rvq, latent[0].numpy()))


def test_nearest_code_picks_the_exact_entry() -> None:
    embed = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
    picks = torch.tensor([5, 0, 63, 17])
    assert torch.equal(nearest_code(embed[picks], embed), picks)
