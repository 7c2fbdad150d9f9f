"""Codec sizes and the exact tensor names of the bundled codec checkpoint.

The Higgs Audio v3 talker checkpoint bundles its codec under
``CODEC_PREFIX``; every key below is relative to that root. The decoder side
(RVQ ``project_out`` + codebooks, ``fc2``, ``acoustic_decoder``) is what the
streaming path needs; the rest (quantizer training buffers, ``project_in``,
``fc``/``fc1``, the acoustic and semantic encoders and the HuBERT model) is
listed so that synthetic checkpoints look like the real one and so that the
strict loader can tell "known but unused" from "unknown".
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

import torch

from realtime_engine.codec.encoder_layout import encoder_key_shapes
from realtime_engine.errors import MissingKeyError, ShapeMismatchError
from realtime_engine.format import CODEBOOK_SIZE, NUM_CODEBOOKS, SAMPLE_RATE

CODEC_PREFIX = "tied.embedding.modality_embeddings.0.model."

Shape = tuple[int, ...]

# Prefixes of encoder-side modules: present in the bundled checkpoint, unused
# when decoding codes to audio.
ENCODER_PREFIXES = (
    "acoustic_encoder.",
    "encoder_semantic.",
    "decoder_semantic.",
    "semantic_model.",
    "fc.",
    "fc1.",
)
# Per-quantizer tensors that only matter for training or for encoding.
QUANTIZER_UNUSED_SUFFIXES = (
    "codebook.embed_avg",
    "codebook.cluster_size",
    "codebook.inited",
    "project_in.weight",
    "project_in.bias",
)


@dataclass(frozen=True)
class CodecDims:
    """Sizes of the codec; ``hop`` follows from the strides."""

    num_quantizers: int = NUM_CODEBOOKS
    codebook_size: int = CODEBOOK_SIZE
    codebook_dim: int = 64
    latent_dim: int = 1024  # RVQ output (sum of project_out)
    acoustic_dim: int = 256  # fc2 output, DAC decoder input
    semantic_dim: int = 768  # fc1 output, HuBERT hidden size
    decoder_channels: tuple[int, ...] = (1024, 512, 256, 128, 64, 32)
    strides: tuple[int, ...] = (8, 5, 4, 2, 3)
    sample_rate: int = SAMPLE_RATE
    # Encoder side (voice-clone reference encoding).
    encoder_channels: int = 64  # doubles per block: 64 -> 2048
    hubert_conv_dim: int = 512
    hubert_layers: int = 12
    hubert_heads: int = 12
    hubert_intermediate: int = 3072
    hubert_pos_kernel: int = 128
    hubert_pos_groups: int = 16

    def __post_init__(self) -> None:
        if len(self.decoder_channels) != len(self.strides) + 1:
            raise ValueError("decoder_channels needs one entry more than strides")

    @property
    def hop(self) -> int:
        return math.prod(self.strides)

    @classmethod
    def higgs_v3(cls) -> CodecDims:
        return cls()

    @classmethod
    def tiny(cls) -> CodecDims:
        """Small channels, real strides and kernels: hop 960 and the +-10
        frame receptive field are the real ones."""
        return cls(
            codebook_dim=8,
            latent_dim=32,
            acoustic_dim=16,
            semantic_dim=16,
            decoder_channels=(32, 16, 8, 8, 8, 8),
            encoder_channels=2,
            hubert_conv_dim=8,
            hubert_layers=1,
            hubert_heads=2,
            hubert_intermediate=32,
            hubert_pos_kernel=16,
            hubert_pos_groups=4,
        )

    @classmethod
    def from_state_dict(
        cls, sd: dict[str, torch.Tensor], base: CodecDims | None = None
    ) -> CodecDims:
        """Infer the sizes from tensor shapes (bundled names).

        Decoder-side sizes are required; encoder-side ones are read when their
        tensors are present. Sizes no shape reveals (HuBERT head count) are
        taken from ``base`` (default: the real codec).
        """

        def get(key: str) -> torch.Tensor:
            if key not in sd:
                raise MissingKeyError(f"codec tensor {key!r} is missing", key=key)
            return sd[key]

        embed = get("quantizer.quantizers.0.codebook.embed")
        # Highest quantizer index named by any key: a quantizer with some
        # tensors missing is then reported as missing, not silently dropped.
        num_q = 1 + max(
            int(m[1]) for k in sd if (m := re.match(r"quantizer\.quantizers\.(\d+)\.", k))
        )
        project_out = get("quantizer.quantizers.0.project_out.weight")
        fc2 = get("fc2.weight")
        conv1 = get("acoustic_decoder.conv1.weight")
        channels = [int(conv1.shape[0])]
        strides: list[int] = []
        block = 0
        while f"acoustic_decoder.block.{block}.conv_t1.weight" in sd:
            w = sd[f"acoustic_decoder.block.{block}.conv_t1.weight"]
            if w.ndim != 3 or w.shape[2] % 2:
                raise ShapeMismatchError(
                    f"acoustic_decoder.block.{block}.conv_t1.weight has shape "
                    f"{tuple(w.shape)}; expected [Cin, Cout, 2*stride]",
                    key=f"acoustic_decoder.block.{block}.conv_t1.weight",
                )
            channels.append(int(w.shape[1]))
            strides.append(int(w.shape[2]) // 2)
            block += 1
        if not strides:
            raise MissingKeyError(
                "codec has no acoustic_decoder.block.0.conv_t1.weight",
                key="acoustic_decoder.block.0.conv_t1.weight",
            )
        fc1 = sd.get("fc1.weight")
        base = base or cls()
        enc = sd.get("acoustic_encoder.conv1.weight")
        hubert_conv = sd.get("semantic_model.feature_extractor.conv_layers.0.conv.weight")
        ffn = sd.get("semantic_model.encoder.layers.0.feed_forward.intermediate_dense.weight")
        pos = sd.get("semantic_model.encoder.pos_conv_embed.conv.parametrizations.weight.original1")
        hubert_layers = 0
        while f"semantic_model.encoder.layers.{hubert_layers}.final_layer_norm.weight" in sd:
            hubert_layers += 1
        return replace(
            base,
            encoder_channels=int(enc.shape[0]) if enc is not None else base.encoder_channels,
            hubert_conv_dim=(
                int(hubert_conv.shape[0]) if hubert_conv is not None else base.hubert_conv_dim
            ),
            hubert_layers=hubert_layers or base.hubert_layers,
            hubert_intermediate=(
                int(ffn.shape[0]) if ffn is not None else base.hubert_intermediate
            ),
            hubert_pos_kernel=int(pos.shape[2]) if pos is not None else base.hubert_pos_kernel,
            hubert_pos_groups=(
                int(pos.shape[0]) // int(pos.shape[1])
                if pos is not None
                else base.hubert_pos_groups
            ),
            num_quantizers=num_q,
            codebook_size=int(embed.shape[0]),
            codebook_dim=int(embed.shape[1]),
            latent_dim=int(project_out.shape[0]),
            acoustic_dim=int(fc2.shape[0]),
            semantic_dim=int(fc1.shape[0]) if fc1 is not None else base.semantic_dim,
            decoder_channels=tuple(channels),
            strides=tuple(strides),
        )


def _snake(shapes: dict[str, Shape], name: str, channels: int) -> None:
    shapes[f"{name}.alpha"] = (1, channels, 1)


def _conv(shapes: dict[str, Shape], name: str, shape: Shape, bias: bool = True) -> None:
    shapes[f"{name}.weight"] = shape
    if bias:
        # Conv1d bias has out_channels entries; ConvTranspose1d's is dim 1.
        shapes[f"{name}.bias"] = (shape[1] if "conv_t" in name else shape[0],)


def decoder_key_shapes(dims: CodecDims) -> dict[str, Shape]:
    """Every tensor the decoder loads, with its shape (bundled names)."""
    shapes: dict[str, Shape] = {}
    for q in range(dims.num_quantizers):
        p = f"quantizer.quantizers.{q}."
        shapes[p + "codebook.embed"] = (dims.codebook_size, dims.codebook_dim)
        shapes[p + "project_out.weight"] = (dims.latent_dim, dims.codebook_dim)
        shapes[p + "project_out.bias"] = (dims.latent_dim,)
    shapes["fc2.weight"] = (dims.acoustic_dim, dims.latent_dim)
    shapes["fc2.bias"] = (dims.acoustic_dim,)
    ch = dims.decoder_channels
    _conv(shapes, "acoustic_decoder.conv1", (ch[0], dims.acoustic_dim, 7))
    for i, stride in enumerate(dims.strides):
        cin, cout = ch[i], ch[i + 1]
        p = f"acoustic_decoder.block.{i}."
        _snake(shapes, p + "snake1", cin)
        _conv(shapes, p + "conv_t1", (cin, cout, 2 * stride))
        for r in (1, 2, 3):
            _snake(shapes, f"{p}res_unit{r}.snake1", cout)
            _conv(shapes, f"{p}res_unit{r}.conv1", (cout, cout, 7))
            _snake(shapes, f"{p}res_unit{r}.snake2", cout)
            _conv(shapes, f"{p}res_unit{r}.conv2", (cout, cout, 1))
    _snake(shapes, "acoustic_decoder.snake1", ch[-1])
    _conv(shapes, "acoustic_decoder.conv2", (1, ch[-1], 7))
    return shapes


def unused_key_shapes(dims: CodecDims) -> dict[str, Shape]:
    """Tensors of the bundled codec that decoding does not read."""
    shapes: dict[str, Shape] = {}
    for q in range(dims.num_quantizers):
        p = f"quantizer.quantizers.{q}."
        shapes[p + "codebook.embed_avg"] = (dims.codebook_size, dims.codebook_dim)
        shapes[p + "codebook.cluster_size"] = (dims.codebook_size,)
        shapes[p + "codebook.inited"] = (1,)
        shapes[p + "project_in.weight"] = (dims.codebook_dim, dims.latent_dim)
        shapes[p + "project_in.bias"] = (dims.codebook_dim,)
    shapes["fc.weight"] = (dims.latent_dim, dims.acoustic_dim + dims.semantic_dim)
    shapes["fc.bias"] = (dims.latent_dim,)
    shapes["fc1.weight"] = (dims.semantic_dim, dims.latent_dim)
    shapes["fc1.bias"] = (dims.semantic_dim,)
    shapes.update(encoder_key_shapes(dims))
    return shapes


def is_unused_key(key: str, num_quantizers: int) -> bool:
    """True for bundled keys that are known but not needed to decode."""
    if key.startswith(ENCODER_PREFIXES):
        return True
    parts = key.split(".", 3)
    if len(parts) == 4 and parts[0] == "quantizer" and parts[1] == "quantizers":
        return (
            parts[2].isdigit()
            and int(parts[2]) < num_quantizers
            and (parts[3] in QUANTIZER_UNUSED_SUFFIXES)
        )
    return False


def _random_tensor(key: str, shape: Shape, g: torch.Generator) -> torch.Tensor:
    """One tensor with a scale that keeps decoded audio in a sane range."""
    if key.endswith(".alpha"):
        return 0.5 + torch.rand(shape, generator=g)
    if key.endswith("codebook.inited"):
        return torch.ones(shape)
    if key.endswith("codebook.cluster_size"):
        return torch.rand(shape, generator=g) * 10
    if key.endswith("codebook.embed") or key.endswith("codebook.embed_avg"):
        return torch.randn(shape, generator=g)
    if key.endswith("weight.original0"):  # weight-norm magnitude
        return torch.ones(shape)
    if key.endswith("masked_spec_embed"):
        return torch.rand(shape, generator=g)
    if "layer_norm" in key or key.endswith("norm.weight"):
        if key.endswith(".weight"):
            return torch.ones(shape)
        return torch.zeros(shape)
    if key.endswith(".bias"):
        return 0.02 * torch.randn(shape, generator=g)
    if len(shape) >= 2:
        fan_in = math.prod(shape[1:])
        if "conv_t" in key:
            # ConvTranspose1d weight is [Cin, Cout, k]; each output sums
            # Cin * k / stride inputs, about Cin * 2.
            fan_in = shape[0] * 2
        gain = 1.0
        if ".res_unit" in key and key.endswith("conv2.weight"):
            gain = 0.5  # residual branches: keep the sum from growing per unit
        if key == "acoustic_decoder.conv2.weight":
            gain = 0.01  # waveform out: roughly +-1 rather than +-100
        return torch.randn(shape, generator=g) * (gain / math.sqrt(fan_in))
    return torch.randn(shape, generator=g)


def random_codec_state_dict(
    dims: CodecDims, generator: torch.Generator, *, include_encoder: bool = True
) -> dict[str, torch.Tensor]:
    """A random codec with the real bundled key names (relative to
    ``CODEC_PREFIX``), scaled so that decoded audio is neither silent nor
    exploding. ``include_encoder=False`` leaves out the unused tensors."""
    shapes = dict(decoder_key_shapes(dims))
    if include_encoder:
        shapes.update(unused_key_shapes(dims))
    return {
        key: _random_tensor(key, shape, generator).to(torch.float32)
        for key, shape in shapes.items()
    }
