"""A tiny synthetic Higgs Audio v3 checkpoint: real layout and key names, random weights.

Used by tests and by ``--model tiny`` everywhere. Same seed → byte-identical
files. Weights are scaled so that greedy decoding gives varied codes and the
bundled codec gives audible, bounded audio.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from realtime_engine.codec.layout import CODEC_PREFIX, CodecDims, random_codec_state_dict
from realtime_engine.model.checkpoint import (
    AUDIO_HEAD_KEY,
    INDEX_FILE,
    SINGLE_FILE,
    TEXT_HEAD_KEY,
    expected_talker_shapes,
)
from realtime_engine.model.config import HiggsTalkerConfig
from realtime_engine.model.control_tags import CONTROL_TAGS
from realtime_engine.model.tokenizer import STRUCTURAL_TOKENS, TOKENIZER_FILE

TINY_VOCAB_SIZE = 2048
_BPE_VOCAB = 1200

_WORDS_TEXT = (
    "the of and to a in is you that it he was for on are as with his they I at be this have "
    "from or one had by word but not what all were we when your can said there use an each "
    "which she do how their if will up other about out many then them these so some her would "
    "make like him into time has look two more write go see number no way could people my than "
    "first water been call who oil its now find long down day did get come made may part hello "
    "world speech voice audio sound stream gateway text today morning evening thank please yes "
    "quick brown fox jumps over lazy dog question answer music laugh whisper story house city"
)


def tiny_config() -> HiggsTalkerConfig:
    """Hidden 64, 2 layers, 4 heads / 2 kv heads of 32, intermediate 128, 8 × 1026 audio rows."""
    return HiggsTalkerConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=128,
        vocab_size=TINY_VOCAB_SIZE,
        rms_norm_eps=1e-6,
        max_position_embeddings=4096,
    )


def _corpus() -> list[str]:
    # Deterministic sentences mixing words, capitals, digits and ASCII punctuation.
    words_all = _WORDS_TEXT.split()
    lines = []
    for i in range(0, len(words_all), 7):
        words = words_all[i : i + 7]
        lines.append(" ".join(words).capitalize() + ". " + " ".join(reversed(words)) + "?")
    lines.append("".join(chr(c) for c in range(32, 127)))
    lines.append("0 1 2 3 4 5 6 7 8 9 10 100 2024 3.14 ...")
    return lines


def build_tiny_tokenizer() -> Tokenizer:
    """Byte-level BPE covering all of ASCII, plus the structure specials and the 43 control tags."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_BPE_VOCAB,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer)
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in STRUCTURAL_TOKENS]
    )
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in CONTROL_TAGS])
    if tok.get_vocab_size(with_added_tokens=True) > TINY_VOCAB_SIZE:
        raise RuntimeError("tiny tokenizer outgrew the tiny vocabulary")
    return tok


def _tokenizer_config() -> dict[str, object]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "additional_special_tokens": [t for t in STRUCTURAL_TOKENS if t != "<|endoftext|>"],
    }


def _random_talker_tensor(key: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    if len(shape) == 1:
        # Norm gains near 1 but not exactly 1, so a misplaced norm changes results.
        return 1.0 + 0.2 * torch.randn(shape, generator=g)
    if key == "tied.embedding.modality_embeddings.0.embedding.weight":
        # The head is tied to this matrix: if a row's own embedding dominated the
        # residual stream, greedy decoding would just repeat the row. Small audio
        # embeddings (logit std ≈ 1.2) keep the codes varied.
        return 0.15 * torch.randn(shape, generator=g)
    if "embedding" in key:
        return torch.randn(shape, generator=g)
    gain = 6.0 if key.endswith(("o_proj.weight", "down_proj.weight")) else 1.0
    return torch.randn(shape, generator=g) * (gain / math.sqrt(shape[1]))


def random_talker_state_dict(
    config: HiggsTalkerConfig, generator: torch.Generator, *, with_optional_heads: bool = False
) -> dict[str, torch.Tensor]:
    """Random talker tensors under their checkpoint names (codec excluded)."""
    shapes = expected_talker_shapes(config)
    state = {key: _random_talker_tensor(key, shape, generator) for key, shape in shapes.items()}
    if with_optional_heads:
        state[TEXT_HEAD_KEY] = state["tied.embedding.text_embedding.weight"].clone()
        state[AUDIO_HEAD_KEY] = state[
            "tied.embedding.modality_embeddings.0.embedding.weight"
        ].clone()
    return state


def write_tiny_checkpoint(
    out_dir: str | Path, *, seed: int = 0, with_optional_heads: bool = False
) -> Path:
    """Write config.json, model.safetensors (talker + codec) and the tokenizer files."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = tiny_config()
    g = torch.Generator().manual_seed(seed)
    state = random_talker_state_dict(config, g, with_optional_heads=with_optional_heads)
    for key, tensor in random_codec_state_dict(CodecDims.tiny(), g).items():
        state[CODEC_PREFIX + key] = tensor
    state = {k: v.to(torch.float32).contiguous() for k, v in sorted(state.items())}
    save_file(state, str(out / SINGLE_FILE), metadata={"format": "pt"})
    _write_json(out / "config.json", config.to_dict())
    _write_json(out / "tokenizer_config.json", _tokenizer_config())
    (out / TOKENIZER_FILE).write_text(build_tiny_tokenizer().to_str(pretty=True), encoding="utf-8")
    return out


def write_sharded_copy(src_dir: str | Path, out_dir: str | Path, *, num_shards: int = 3) -> Path:
    """Copy a single-file checkpoint as ``num_shards`` shards plus the index json."""
    from safetensors.torch import load_file

    src, out = Path(src_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = load_file(str(src / SINGLE_FILE))
    keys = sorted(state)
    weight_map: dict[str, str] = {}
    for shard in range(num_shards):
        name = f"model-{shard + 1:05d}-of-{num_shards:05d}.safetensors"
        part = {k: state[k] for k in keys[shard::num_shards]}
        save_file(part, str(out / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, name))
    total = sum(t.numel() * t.element_size() for t in state.values())
    _write_json(out / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": weight_map})
    for name in ("config.json", "tokenizer_config.json", TOKENIZER_FILE):
        shutil.copyfile(src / name, out / name)
    return out


def _write_json(path: Path, obj: object) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")
