"""One call from a model id to a ready talker, codec decoder, tokenizer and config.

    loaded = load_talker("tiny", device="cpu", dtype=torch.float32)
    loaded.model        # HiggsTalker, eval mode, no grads
    loaded.codec        # codec decoder from the bundled weights (None if absent or not asked for)
    loaded.tokenizer    # HiggsTokenizer
    loaded.config       # HiggsTalkerConfig

Everything is checked before any weight is read: config, tokenizer specials,
then every tensor name and shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from realtime_engine.errors import TokenizerError
from realtime_engine.model.checkpoint import (
    CodecView,
    SafetensorsCheckpoint,
    talker_param_name,
    validate_talker_shapes,
)
from realtime_engine.model.config import HiggsTalkerConfig
from realtime_engine.model.hub import resolve_model
from realtime_engine.model.talker import HiggsTalker
from realtime_engine.model.tokenizer import HiggsTokenizer

if TYPE_CHECKING:
    from realtime_engine.codec.decoder import CodecDecoder


@dataclass
class LoadedTalker:
    model: HiggsTalker
    codec: CodecDecoder | None
    tokenizer: HiggsTokenizer
    config: HiggsTalkerConfig
    path: Path


def load_talker_weights(
    checkpoint: SafetensorsCheckpoint,
    config: HiggsTalkerConfig,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    batch_invariant: bool = True,
) -> HiggsTalker:
    """Build a :class:`HiggsTalker` from a checked checkpoint; raises the typed key errors."""
    validate_talker_shapes(checkpoint.shapes(), config)
    with torch.device("meta"):
        model = HiggsTalker(config, batch_invariant=batch_invariant)
    wanted = {key: name for key in checkpoint if (name := talker_param_name(key, config))}
    state = {
        wanted[key]: tensor.to(device=device, dtype=dtype)
        for key, tensor in checkpoint.iter_tensors(wanted)
    }
    # Validation above guarantees a one-to-one match; strict=True double-checks the module side.
    model.load_state_dict(state, strict=True, assign=True)
    return model.requires_grad_(False).eval()


def load_codec(
    checkpoint: SafetensorsCheckpoint, *, device: torch.device | str = "cpu"
) -> CodecDecoder | None:
    """The bundled codec decoder (always float32: transposed convs are unstable in bf16)."""
    view = CodecView(checkpoint)
    if not len(view):
        return None
    from realtime_engine.codec.decoder import load_codec_decoder

    # The codec loader checks every key (encoder side included), so it gets them all.
    return load_codec_decoder(dict(view), device=device)


def load_talker(
    model: str | Path,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    with_codec: bool = True,
    batch_invariant: bool = True,
) -> LoadedTalker:
    """Load ``model`` (``tiny``, a directory or a cached HF repo id) for inference."""
    path = resolve_model(model)
    config = HiggsTalkerConfig.from_json_file(path / "config.json")
    tokenizer = HiggsTokenizer.from_dir(path)
    if tokenizer.vocab_size > config.vocab_size:
        raise TokenizerError(
            f"tokenizer has {tokenizer.vocab_size} ids, the model embeds only {config.vocab_size}"
        )
    checkpoint = SafetensorsCheckpoint(path)
    talker = load_talker_weights(
        checkpoint, config, device=device, dtype=dtype, batch_invariant=batch_invariant
    )
    codec = load_codec(checkpoint, device=device) if with_codec else None
    return LoadedTalker(model=talker, codec=codec, tokenizer=tokenizer, config=config, path=path)
