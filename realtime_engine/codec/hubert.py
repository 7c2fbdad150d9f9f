"""The codec's HuBERT-base semantic model, built with transformers' ``HubertModel``.

The bundled checkpoint stores it under ``semantic_model.`` with transformers'
own names. Its positional conv carries weight norm, saved either as
``parametrizations.weight.original0/1`` (current PyTorch) or
``weight_g``/``weight_v`` (older releases); both are accepted and renamed to
the form the installed model uses. ``masked_spec_embed`` only matters for
training and is ignored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from realtime_engine.codec.encoder_layout import HUBERT_CONV_LAYERS

if TYPE_CHECKING:
    from transformers import HubertModel

    from realtime_engine.codec.layout import CodecDims

SEMANTIC_PREFIX = "semantic_model."
POS_CONV = SEMANTIC_PREFIX + "encoder.pos_conv_embed.conv."
# weight-norm storage forms: (magnitude, direction)
PARAMETRIZED = ("parametrizations.weight.original0", "parametrizations.weight.original1")
LEGACY = ("weight_g", "weight_v")
IGNORED_KEYS = (SEMANTIC_PREFIX + "masked_spec_embed",)
SEMANTIC_SAMPLE_RATE = 16_000
# HuBERT's 320x feature extractor sees 400 samples per frame; 160 each side
# centres the frames so the 50 Hz output has exactly 2 frames per codec frame.
SEMANTIC_PAD = 160


def normalize_weight_norm_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``weight_g``/``weight_v`` renamed to ``parametrizations.weight.original0/1``."""
    if POS_CONV + LEGACY[0] not in state and POS_CONV + LEGACY[1] not in state:
        return state
    out = dict(state)
    for legacy, modern in zip(LEGACY, PARAMETRIZED, strict=True):
        if POS_CONV + legacy in out:
            if POS_CONV + modern in out:
                raise ValueError(f"both {POS_CONV + legacy!r} and {POS_CONV + modern!r} are stored")
            out[POS_CONV + modern] = out.pop(POS_CONV + legacy)
    return out


def build_hubert(dims: CodecDims) -> HubertModel:
    """An untrained HuBERT of ``dims``' sizes (group-norm feature extractor, no conv bias)."""
    from transformers import HubertConfig, HubertModel

    config = HubertConfig(
        hidden_size=dims.semantic_dim,
        num_hidden_layers=dims.hubert_layers,
        num_attention_heads=dims.hubert_heads,
        intermediate_size=dims.hubert_intermediate,
        conv_dim=(dims.hubert_conv_dim,) * len(HUBERT_CONV_LAYERS),
        conv_kernel=tuple(k for k, _ in HUBERT_CONV_LAYERS),
        conv_stride=tuple(s for _, s in HUBERT_CONV_LAYERS),
        conv_bias=False,
        feat_extract_norm="group",
        do_stable_layer_norm=False,
        num_conv_pos_embeddings=dims.hubert_pos_kernel,
        num_conv_pos_embedding_groups=dims.hubert_pos_groups,
        # no masking: masked_spec_embed is training-only and not created
        mask_time_prob=0.0,
        mask_feature_prob=0.0,
    )
    return HubertModel(config).eval()


def hubert_state_keys(model: torch.nn.Module) -> dict[str, str]:
    """Bundled key (``semantic_model.`` + name) -> the model's own name.

    The installed PyTorch decides the weight-norm form; a checkpoint in the
    parametrized form maps onto a legacy model too.
    """
    names = {SEMANTIC_PREFIX + k: k for k in model.state_dict()}
    for legacy, modern in zip(LEGACY, PARAMETRIZED, strict=True):
        if POS_CONV + legacy in names:
            names[POS_CONV + modern] = names.pop(POS_CONV + legacy)
    return names


def semantic_features(hubert: torch.nn.Module, wav16: torch.Tensor) -> torch.Tensor:
    """wav at 16 kHz [B, L] -> [B, D, frames / 2]: mean of all hidden states, every 2nd frame."""
    padded = torch.nn.functional.pad(wav16, (SEMANTIC_PAD, SEMANTIC_PAD))
    out = hubert(padded, output_hidden_states=True)
    stacked = torch.stack(tuple(out.hidden_states), dim=1)  # [B, layers + 1, F, D]
    return stacked.mean(dim=1)[:, ::2].transpose(1, 2)
