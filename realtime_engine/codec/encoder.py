"""Reference audio -> codec codes (voice cloning), and its strict loader.

    wav 24 kHz mono, padded to a whole number of codec frames (>= 1 s)
    semantic: 16 kHz -> HuBERT (all hidden states averaged, 25 Hz) -> encoder_semantic
    acoustic: DAC encoder
    e = fc(cat[acoustic, semantic]); residual VQ: argmin per codebook

One codec frame per 960 input samples: ``frames = ceil(samples / 960)``.
Everything runs in float32 and is deterministic for a given input.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import soxr
import torch
from torch import nn

from realtime_engine.codec.encoder_layout import encoder_key_shapes
from realtime_engine.codec.encoder_modules import DacEncoder, EncodingRVQ, SemanticEncoder
from realtime_engine.codec.errors import CodecInputError
from realtime_engine.codec.hubert import (
    IGNORED_KEYS,
    SEMANTIC_PREFIX,
    SEMANTIC_SAMPLE_RATE,
    build_hubert,
    hubert_state_keys,
    normalize_weight_norm_keys,
    semantic_features,
)
from realtime_engine.codec.layout import CodecDims, decoder_key_shapes, unused_key_shapes
from realtime_engine.errors import (
    CheckpointError,
    MissingKeyError,
    ShapeMismatchError,
    UnexpectedKeyError,
)

MIN_REFERENCE_SECONDS = 1.0
# The semantic and acoustic paths disagree on length only for inputs that are
# not a whole number of frames; the acoustic path is then re-run on this much
# padding each side and truncated.
ACOUSTIC_REALIGN_PAD = 480
# No tensor shape reveals HuBERT's head count; the HuBERT family keeps 64 per
# head (base 768/12), and hidden sizes below 64 (test models) use 8 per head.
_HUBERT_HEAD_DIM, _SMALL_HEAD_DIM = 64, 8


def hubert_heads(semantic_dim: int) -> int:
    head_dim = _HUBERT_HEAD_DIM if semantic_dim >= _HUBERT_HEAD_DIM else _SMALL_HEAD_DIM
    if semantic_dim % head_dim:
        raise ShapeMismatchError(
            f"HuBERT hidden size {semantic_dim} is not a multiple of {head_dim}",
            key=SEMANTIC_PREFIX + "feature_projection.projection.weight",
        )
    return semantic_dim // head_dim


def encoder_required_shapes(dims: CodecDims) -> dict[str, tuple[int, ...]]:
    """Every tensor encoding reads (bundled names, relative to the codec root)."""
    shapes = {
        k: v
        for k, v in encoder_key_shapes(dims).items()
        if not k.startswith("decoder_semantic.") and k not in IGNORED_KEYS
    }
    shapes["fc.weight"] = (dims.latent_dim, dims.acoustic_dim + dims.semantic_dim)
    shapes["fc.bias"] = (dims.latent_dim,)
    for q in range(dims.num_quantizers):
        p = f"quantizer.quantizers.{q}."
        shapes[p + "codebook.embed"] = (dims.codebook_size, dims.codebook_dim)
        shapes[p + "project_in.weight"] = (dims.codebook_dim, dims.latent_dim)
        shapes[p + "project_in.bias"] = (dims.codebook_dim,)
        shapes[p + "project_out.weight"] = (dims.latent_dim, dims.codebook_dim)
        shapes[p + "project_out.bias"] = (dims.latent_dim,)
    return shapes


class CodecEncoder(nn.Module):
    """wav [B, L] at 24 kHz -> codes [B, Q, T]; submodule names are the bundled ones."""

    def __init__(self, dims: CodecDims) -> None:
        super().__init__()
        self.dims = dims
        self.semantic_model = build_hubert(dims)
        self.encoder_semantic = SemanticEncoder(dims.semantic_dim)
        self.acoustic_encoder = DacEncoder(dims)
        self.fc = nn.Linear(dims.acoustic_dim + dims.semantic_dim, dims.latent_dim)
        self.quantizer = EncodingRVQ(dims)

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    @torch.inference_mode()
    def encode(self, wav24: torch.Tensor, wav16: torch.Tensor) -> torch.Tensor:
        """Codes of ``wav24`` [B, L] (a multiple of hop) with its 16 kHz copy ``wav16``."""
        semantic = self.encoder_semantic(semantic_features(self.semantic_model, wav16))
        acoustic = self.acoustic_encoder(wav24[:, None])
        if acoustic.shape[-1] != semantic.shape[-1]:
            pad = ACOUSTIC_REALIGN_PAD
            acoustic = self.acoustic_encoder(nn.functional.pad(wav24, (pad, pad))[:, None])
            frames = min(acoustic.shape[-1], semantic.shape[-1])
            acoustic, semantic = acoustic[..., :frames], semantic[..., :frames]
        latent = self.fc(torch.cat([acoustic, semantic], dim=1).transpose(1, 2))
        return self.quantizer(latent)

    def encode_clip(self, pcm: np.ndarray, sample_rate: int = 24_000) -> np.ndarray:
        """Mono float32 PCM -> codes ``[ceil(samples / hop), Q]`` int64 (blocking)."""
        if sample_rate != self.dims.sample_rate:
            raise CodecInputError(
                f"reference audio must be {self.dims.sample_rate} Hz, got {sample_rate}"
            )
        samples = np.asarray(pcm, dtype=np.float32).reshape(-1)
        if samples.size < MIN_REFERENCE_SECONDS * sample_rate:
            raise CodecInputError(
                f"reference audio must be at least {MIN_REFERENCE_SECONDS:g} s long, "
                f"got {samples.size / sample_rate:.2f} s"
            )
        if not np.isfinite(samples).all():
            raise CodecInputError("reference audio has NaN or infinite samples")
        hop = self.dims.hop
        frames = math.ceil(samples.size / hop)
        wav24 = np.zeros(frames * hop, dtype=np.float32)
        wav24[: samples.size] = samples
        wav16 = np.asarray(
            soxr.resample(wav24, sample_rate, SEMANTIC_SAMPLE_RATE, quality="HQ"),
            dtype=np.float32,
        )
        device = self.device
        codes = self.encode(
            torch.from_numpy(wav24)[None].to(device), torch.from_numpy(wav16)[None].to(device)
        )
        return codes[0].T.contiguous().cpu().numpy().astype(np.int64)


def validate_encoder_state(state: Mapping[str, torch.Tensor]) -> tuple[CodecDims, list[str]]:
    """Check the encoder side of a bundled codec; returns its sizes and the
    tensors encoding reads. Missing, misshapen and unknown tensors raise
    typed ``CheckpointError``s naming the key."""
    sd = normalize_weight_norm_keys(dict(state))
    base = CodecDims.from_state_dict(sd)
    dims = CodecDims.from_state_dict(sd, base=_with_heads(base))
    required = encoder_required_shapes(dims)
    known = {**decoder_key_shapes(dims), **unused_key_shapes(dims)}
    for key in sd:
        if key not in known:
            raise UnexpectedKeyError(f"unknown codec tensor {key!r}", key=key)
    for key in required:
        if key not in sd:
            raise MissingKeyError(f"codec encoder tensor {key!r} is missing", key=key)
    for key, tensor in sd.items():
        got, want = tuple(tensor.shape), known[key]
        if got != want:
            raise ShapeMismatchError(
                f"codec tensor {key!r} has shape {list(got)}; expected {list(want)}", key=key
            )
    return dims, list(required)


def _with_heads(dims: CodecDims) -> CodecDims:
    from dataclasses import replace

    return replace(dims, hubert_heads=hubert_heads(dims.semantic_dim))


def load_codec_encoder(
    state: Mapping[str, torch.Tensor], device: str | torch.device = "cpu"
) -> CodecEncoder:
    """Build the encoder from bundled-layout tensors (keys relative to the codec root)."""
    dims, required = validate_encoder_state(state)
    sd = normalize_weight_norm_keys(dict(state))
    with torch.device("meta"):  # no random init of ~160 M parameters
        module = CodecEncoder(dims)
    hubert_names = hubert_state_keys(module.semantic_model)
    tensors: dict[str, torch.Tensor] = {}
    for key in required:
        value = sd[key]
        if not value.is_floating_point():
            raise CheckpointError(f"codec tensor {key!r} is {value.dtype}, not float", key=key)
        value = value.detach().to(torch.float32)
        if not bool(torch.isfinite(value).all()):
            raise CheckpointError(f"codec tensor {key!r} has non-finite values", key=key)
        name = key
        if key.startswith(SEMANTIC_PREFIX):
            name = SEMANTIC_PREFIX + hubert_names[key]
        tensors[name] = value
    module.load_state_dict(tensors, strict=True, assign=True)
    return module.to(device).eval()
