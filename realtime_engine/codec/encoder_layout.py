"""Tensor names and shapes of the codec's encoder side (bundled layout).

Used by voice-clone reference encoding: a DAC acoustic encoder, the semantic
encoder/decoder pair (ELU residual units) and a HuBERT-base model with
transformers ``HubertModel`` names. Sizes come from ``layout.CodecDims``,
which imports this module; here they are read through ``EncoderDims``.
"""

from __future__ import annotations

from typing import Protocol

Shape = tuple[int, ...]


class EncoderDims(Protocol):
    """The encoder-side sizes of ``layout.CodecDims``."""

    @property
    def strides(self) -> tuple[int, ...]: ...
    @property
    def encoder_channels(self) -> int: ...
    @property
    def acoustic_dim(self) -> int: ...
    @property
    def semantic_dim(self) -> int: ...
    @property
    def hubert_conv_dim(self) -> int: ...
    @property
    def hubert_pos_kernel(self) -> int: ...
    @property
    def hubert_pos_groups(self) -> int: ...
    @property
    def hubert_layers(self) -> int: ...
    @property
    def hubert_intermediate(self) -> int: ...


# HuBERT-base feature extractor: (kernel, stride) per conv layer; 320x in total.
HUBERT_CONV_LAYERS: tuple[tuple[int, int], ...] = (
    (10, 5),
    (3, 2),
    (3, 2),
    (3, 2),
    (3, 2),
    (2, 2),
    (2, 2),
)
SEMANTIC_BLOCKS = 2
SEMANTIC_UNITS_PER_BLOCK = 2


def acoustic_encoder_key_shapes(dims: EncoderDims) -> dict[str, Shape]:
    """DAC encoder: conv1 k7, 5 blocks (3 residual units, Snake, strided conv),
    Snake, conv2 k3 to ``acoustic_dim``."""
    shapes: dict[str, Shape] = {}
    c = dims.encoder_channels
    shapes["acoustic_encoder.conv1.weight"] = (c, 1, 7)
    shapes["acoustic_encoder.conv1.bias"] = (c,)
    for i, stride in enumerate(dims.strides):
        cin, cout = c * 2**i, c * 2 ** (i + 1)
        p = f"acoustic_encoder.block.{i}."
        for r in (1, 2, 3):
            shapes[f"{p}res_unit{r}.snake1.alpha"] = (1, cin, 1)
            shapes[f"{p}res_unit{r}.conv1.weight"] = (cin, cin, 7)
            shapes[f"{p}res_unit{r}.conv1.bias"] = (cin,)
            shapes[f"{p}res_unit{r}.snake2.alpha"] = (1, cin, 1)
            shapes[f"{p}res_unit{r}.conv2.weight"] = (cin, cin, 1)
            shapes[f"{p}res_unit{r}.conv2.bias"] = (cin,)
        shapes[p + "snake1.alpha"] = (1, cin, 1)
        shapes[p + "conv1.weight"] = (cout, cin, 2 * stride)
        shapes[p + "conv1.bias"] = (cout,)
    top = c * 2 ** len(dims.strides)
    shapes["acoustic_encoder.snake1.alpha"] = (1, top, 1)
    shapes["acoustic_encoder.conv2.weight"] = (dims.acoustic_dim, top, 3)
    shapes["acoustic_encoder.conv2.bias"] = (dims.acoustic_dim,)
    return shapes


def _semantic_units(shapes: dict[str, Shape], prefix: str, d: int) -> None:
    for u in range(SEMANTIC_UNITS_PER_BLOCK):
        shapes[f"{prefix}res_units.{u}.conv1.weight"] = (d, d, 3)
        shapes[f"{prefix}res_units.{u}.conv2.weight"] = (d, d, 1)


def semantic_key_shapes(dims: EncoderDims) -> dict[str, Shape]:
    """Semantic encoder (conv k3 no bias; blocks of ELU units then conv k3 with
    bias) and its mirror decoder (conv1, blocks, conv2; both no bias)."""
    d = dims.semantic_dim
    shapes: dict[str, Shape] = {"encoder_semantic.conv.weight": (d, d, 3)}
    for b in range(SEMANTIC_BLOCKS):
        p = f"encoder_semantic.conv_blocks.{b}."
        _semantic_units(shapes, p, d)
        shapes[p + "conv.weight"] = (d, d, 3)
        shapes[p + "conv.bias"] = (d,)
    shapes["decoder_semantic.conv1.weight"] = (d, d, 3)
    for b in range(SEMANTIC_BLOCKS):
        p = f"decoder_semantic.conv_blocks.{b}."
        shapes[p + "conv.weight"] = (d, d, 3)
        shapes[p + "conv.bias"] = (d,)
        _semantic_units(shapes, p, d)
    shapes["decoder_semantic.conv2.weight"] = (d, d, 3)
    return shapes


def hubert_key_shapes(dims: EncoderDims) -> dict[str, Shape]:
    """HuBERT-base (group-norm feature extractor, no conv bias) under
    ``semantic_model.``; the positional conv stores weight norm as
    ``parametrizations.weight.original0/1``."""
    h, c = dims.semantic_dim, dims.hubert_conv_dim
    p = "semantic_model."
    shapes: dict[str, Shape] = {p + "masked_spec_embed": (h,)}
    cin = 1
    for i, (kernel, _stride) in enumerate(HUBERT_CONV_LAYERS):
        shapes[f"{p}feature_extractor.conv_layers.{i}.conv.weight"] = (c, cin, kernel)
        cin = c
    shapes[p + "feature_extractor.conv_layers.0.layer_norm.weight"] = (c,)
    shapes[p + "feature_extractor.conv_layers.0.layer_norm.bias"] = (c,)
    shapes[p + "feature_projection.layer_norm.weight"] = (c,)
    shapes[p + "feature_projection.layer_norm.bias"] = (c,)
    shapes[p + "feature_projection.projection.weight"] = (h, c)
    shapes[p + "feature_projection.projection.bias"] = (h,)
    pos = p + "encoder.pos_conv_embed.conv."
    k = dims.hubert_pos_kernel
    shapes[pos + "parametrizations.weight.original0"] = (1, 1, k)
    shapes[pos + "parametrizations.weight.original1"] = (h, h // dims.hubert_pos_groups, k)
    shapes[pos + "bias"] = (h,)
    shapes[p + "encoder.layer_norm.weight"] = (h,)
    shapes[p + "encoder.layer_norm.bias"] = (h,)
    for n in range(dims.hubert_layers):
        lp = f"{p}encoder.layers.{n}."
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            shapes[f"{lp}attention.{proj}.weight"] = (h, h)
            shapes[f"{lp}attention.{proj}.bias"] = (h,)
        shapes[lp + "layer_norm.weight"] = (h,)
        shapes[lp + "layer_norm.bias"] = (h,)
        shapes[lp + "feed_forward.intermediate_dense.weight"] = (dims.hubert_intermediate, h)
        shapes[lp + "feed_forward.intermediate_dense.bias"] = (dims.hubert_intermediate,)
        shapes[lp + "feed_forward.output_dense.weight"] = (h, dims.hubert_intermediate)
        shapes[lp + "feed_forward.output_dense.bias"] = (h,)
        shapes[lp + "final_layer_norm.weight"] = (h,)
        shapes[lp + "final_layer_norm.bias"] = (h,)
    return shapes


def encoder_key_shapes(dims: EncoderDims) -> dict[str, Shape]:
    shapes = acoustic_encoder_key_shapes(dims)
    shapes.update(semantic_key_shapes(dims))
    shapes.update(hubert_key_shapes(dims))
    return shapes
