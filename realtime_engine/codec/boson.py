"""The standalone tokenizer layout (``model.pth``): weight norm, other names.

``boson_to_bundled`` folds weight norm (weight = g * v / ||v||, the norm over
every dim but 0) and renames keys to the bundled layout;
``bundled_to_boson`` is its inverse, used to produce standalone-layout
fixtures from a bundled state dict.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

from realtime_engine.codec.decoder import CodecDecoder, load_codec_decoder
from realtime_engine.errors import MissingKeyError, ShapeMismatchError

_UNIT = ("snake1", "conv1", "snake2", "conv2")  # residual unit's Sequential order
_SEMANTIC = ("encoder_semantic.", "decoder_semantic.")

Rename = tuple[re.Pattern[str], Callable[[re.Match[str]], str]]


def _rule(pattern: str, build: Callable[[re.Match[str]], str]) -> Rename:
    return re.compile(pattern), build


# Standalone name (module path, without the tensor name) -> bundled name.
_TO_BUNDLED: tuple[Rename, ...] = (
    _rule(r"^decoder_2\.model\.0$", lambda m: "acoustic_decoder.conv1"),
    _rule(r"^decoder_2\.model\.6$", lambda m: "acoustic_decoder.snake1"),
    _rule(r"^decoder_2\.model\.7$", lambda m: "acoustic_decoder.conv2"),
    _rule(
        r"^decoder_2\.model\.([1-5])\.block\.([01])$",
        lambda m: f"acoustic_decoder.block.{int(m[1]) - 1}.{('snake1', 'conv_t1')[int(m[2])]}",
    ),
    _rule(
        r"^decoder_2\.model\.([1-5])\.block\.([234])\.block\.([0-3])$",
        lambda m: (
            f"acoustic_decoder.block.{int(m[1]) - 1}.res_unit{int(m[2]) - 1}.{_UNIT[int(m[3])]}"
        ),
    ),
    _rule(r"^encoder\.block\.0$", lambda m: "acoustic_encoder.conv1"),
    _rule(r"^encoder\.block\.6$", lambda m: "acoustic_encoder.snake1"),
    _rule(r"^encoder\.block\.7$", lambda m: "acoustic_encoder.conv2"),
    _rule(
        r"^encoder\.block\.([1-5])\.block\.([0-2])\.block\.([0-3])$",
        lambda m: (
            f"acoustic_encoder.block.{int(m[1]) - 1}.res_unit{int(m[2]) + 1}.{_UNIT[int(m[3])]}"
        ),
    ),
    _rule(
        r"^encoder\.block\.([1-5])\.block\.([34])$",
        lambda m: f"acoustic_encoder.block.{int(m[1]) - 1}.{('snake1', 'conv1')[int(m[2]) - 3]}",
    ),
    _rule(
        r"^quantizer\.vq\.layers\.(\d+)\._codebook$",
        lambda m: f"quantizer.quantizers.{m[1]}.codebook",
    ),
    _rule(r"^quantizer\.vq\.layers\.(\d+)\.(.+)$", lambda m: f"quantizer.quantizers.{m[1]}.{m[2]}"),
    _rule(r"^fc_prior$", lambda m: "fc"),
    _rule(r"^fc_post1$", lambda m: "fc1"),
    _rule(r"^fc_post2$", lambda m: "fc2"),
)

# Bundled name -> standalone name (module path).
_TO_BOSON: tuple[Rename, ...] = (
    _rule(r"^acoustic_decoder\.conv1$", lambda m: "decoder_2.model.0"),
    _rule(r"^acoustic_decoder\.snake1$", lambda m: "decoder_2.model.6"),
    _rule(r"^acoustic_decoder\.conv2$", lambda m: "decoder_2.model.7"),
    _rule(
        r"^acoustic_decoder\.block\.(\d)\.(snake1|conv_t1)$",
        lambda m: f"decoder_2.model.{int(m[1]) + 1}.block.{0 if m[2] == 'snake1' else 1}",
    ),
    _rule(
        r"^acoustic_decoder\.block\.(\d)\.res_unit([123])\.(\w+)$",
        lambda m: (
            f"decoder_2.model.{int(m[1]) + 1}.block.{int(m[2]) + 1}.block.{_UNIT.index(m[3])}"
        ),
    ),
    _rule(r"^acoustic_encoder\.conv1$", lambda m: "encoder.block.0"),
    _rule(r"^acoustic_encoder\.snake1$", lambda m: "encoder.block.6"),
    _rule(r"^acoustic_encoder\.conv2$", lambda m: "encoder.block.7"),
    _rule(
        r"^acoustic_encoder\.block\.(\d)\.res_unit([123])\.(\w+)$",
        lambda m: f"encoder.block.{int(m[1]) + 1}.block.{int(m[2]) - 1}.block.{_UNIT.index(m[3])}",
    ),
    _rule(
        r"^acoustic_encoder\.block\.(\d)\.(snake1|conv1)$",
        lambda m: f"encoder.block.{int(m[1]) + 1}.block.{3 if m[2] == 'snake1' else 4}",
    ),
    _rule(
        r"^quantizer\.quantizers\.(\d+)\.codebook$",
        lambda m: f"quantizer.vq.layers.{m[1]}._codebook",
    ),
    _rule(r"^quantizer\.quantizers\.(\d+)\.(.+)$", lambda m: f"quantizer.vq.layers.{m[1]}.{m[2]}"),
    _rule(r"^fc$", lambda m: "fc_prior"),
    _rule(r"^fc1$", lambda m: "fc_post1"),
    _rule(r"^fc2$", lambda m: "fc_post2"),
)

# Convolutions whose weights the standalone layout stores with weight norm.
_WEIGHT_NORMED = re.compile(r"^(decoder_2|encoder)\.")


def _rename(module: str, rules: tuple[Rename, ...]) -> str:
    for pattern, build in rules:
        match = pattern.match(module)
        if match:
            return build(match)
    return module


def _split(key: str) -> tuple[str, str]:
    module, _, tensor = key.rpartition(".")
    return module, tensor


def fold_weight_norm(g: torch.Tensor, v: torch.Tensor, key: str) -> torch.Tensor:
    """weight = g * v / ||v||, the norm taken over every dim but 0."""
    if g.ndim != v.ndim or g.shape[0] != v.shape[0] or g[0].numel() != 1:
        raise ShapeMismatchError(
            f"weight norm of {key!r}: g {list(g.shape)} does not match v {list(v.shape)}", key=key
        )
    norm = v.float().flatten(1).norm(dim=1).reshape(g.shape)
    return g.float() * v.float() / norm


def boson_to_bundled(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Standalone-layout tensors -> bundled names, weight norm folded."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        module, tensor = _split(key)
        if module.startswith(_SEMANTIC):
            # The standalone semantic convs are wrapped one level deeper.
            module = module.removesuffix(".conv") if module.endswith(".conv") else module
            out[f"{module}.{tensor}"] = value
            continue
        if tensor == "weight_v":
            continue
        if tensor == "weight_g":
            v_key = f"{module}.weight_v"
            if v_key not in state_dict:
                raise MissingKeyError(f"weight norm of {module!r} lacks {v_key!r}", key=v_key)
            value = fold_weight_norm(value, state_dict[v_key], key)
            tensor = "weight"
        out[f"{_rename(module, _TO_BUNDLED)}.{tensor}"] = value
    return out


def bundled_to_boson(
    state_dict: dict[str, torch.Tensor], v_scale: float = 3.0
) -> dict[str, torch.Tensor]:
    """Bundled tensors -> standalone layout; conv weights of the acoustic
    encoder/decoder become (g, v) with ``v = v_scale * weight`` so that a
    loader that forgets to normalise by ||v|| gets visibly wrong weights."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        module, tensor = _split(key)
        if module.startswith(_SEMANTIC):
            out[f"{module}.conv.{tensor}"] = value
            continue
        new_module = _rename(module, _TO_BOSON)
        if tensor == "weight" and _WEIGHT_NORMED.match(new_module) and value.ndim == 3:
            g = value.flatten(1).norm(dim=1).reshape(-1, 1, 1)
            out[f"{new_module}.weight_g"] = g
            out[f"{new_module}.weight_v"] = value * v_scale
        else:
            out[f"{new_module}.{tensor}"] = value
    return out


def load_boson_codec(
    state_dict: dict[str, torch.Tensor], device: str | torch.device = "cpu"
) -> CodecDecoder:
    """Load the standalone ``model.pth`` layout with the same strictness as
    the bundled loader."""
    return load_codec_decoder(boson_to_bundled(state_dict), device=device)
