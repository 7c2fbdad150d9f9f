"""Configuration of the Higgs Audio v3 talker (HF ``model_type`` ``higgs_multimodal_qwen3``).

Only the fields the talker needs are kept; speech-recognition (Whisper) fields
that some releases carry are ignored on purpose, since the talker never runs
them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from realtime_engine.errors import CheckpointError
from realtime_engine.format import CODEBOOK_VOCAB, NUM_CODEBOOKS

MODEL_TYPE = "higgs_multimodal_qwen3"
ARCHITECTURE = "HiggsMultimodalQwen3ForConditionalGeneration"
# Qwen3 releases ship ``rope_theta: null`` in this config; the backbone was trained with 1e6.
DEFAULT_ROPE_THETA = 1_000_000.0
AUDIO_PLACEHOLDER_ID = -100


class ConfigError(CheckpointError):
    """config.json is missing a field or holds a value the talker cannot run."""


@dataclass(frozen=True)
class HiggsTalkerConfig:
    """Talker dimensions: a Qwen3 decoder plus a fused multi-codebook audio embedding/head."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = DEFAULT_ROPE_THETA
    max_position_embeddings: int = 32768
    num_codebooks: int = NUM_CODEBOOKS
    codebook_vocab: int = CODEBOOK_VOCAB
    audio_token_id: int = AUDIO_PLACEHOLDER_ID
    # Audio head shares the fused audio embedding matrix (the released model does).
    tie_audio_head: bool = True
    tie_word_embeddings: bool = True

    def __post_init__(self) -> None:
        positive = {
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "num_codebooks": self.num_codebooks,
            "codebook_vocab": self.codebook_vocab,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ConfigError(f"config: {name} must be > 0, got {value}", key=name)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"config: num_attention_heads ({self.num_attention_heads}) must be a multiple "
                f"of num_key_value_heads ({self.num_key_value_heads})",
                key="num_key_value_heads",
            )
        if self.head_dim % 2:
            raise ConfigError(f"config: head_dim must be even, got {self.head_dim}", key="head_dim")

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def audio_rows(self) -> int:
        """Rows of the fused audio embedding: codebook-major ``q * codebook_vocab + code``."""
        return self.num_codebooks * self.codebook_vocab

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> HiggsTalkerConfig:
        """Parse the HF config.json structure (``text_config`` + ``audio_encoder_config``)."""
        model_type = raw.get("model_type")
        if model_type is not None and model_type != MODEL_TYPE:
            raise ConfigError(
                f"config: model_type {model_type!r} is not {MODEL_TYPE!r}", key="model_type"
            )
        text = raw.get("text_config")
        if not isinstance(text, Mapping):
            raise ConfigError("config: text_config is missing", key="text_config")
        audio = raw.get("audio_encoder_config") or {}
        if not isinstance(audio, Mapping):
            raise ConfigError(
                "config: audio_encoder_config is not an object", key="audio_encoder_config"
            )
        encoder_type = audio.get("encoder_type", "discrete")
        if encoder_type != "discrete":
            raise ConfigError(
                f"config: audio encoder_type {encoder_type!r} is not 'discrete'",
                key="audio_encoder_config.encoder_type",
            )
        if text.get("hidden_act", "silu") != "silu":
            raise ConfigError(
                f"config: hidden_act {text.get('hidden_act')!r} is not 'silu'",
                key="text_config.hidden_act",
            )
        if text.get("attention_bias", False):
            raise ConfigError(
                "config: attention_bias is not supported", key="text_config.attention_bias"
            )

        def need(name: str) -> Any:
            if text.get(name) is None:
                raise ConfigError(
                    f"config: text_config.{name} is missing", key=f"text_config.{name}"
                )
            return text[name]

        hidden = int(need("hidden_size"))
        heads = int(need("num_attention_heads"))
        out_dim = audio.get("out_dim")
        if out_dim is not None and int(out_dim) != hidden:
            raise ConfigError(
                f"config: audio out_dim {out_dim} differs from hidden_size {hidden}",
                key="audio_encoder_config.out_dim",
            )
        head_dim = text.get("head_dim")
        rope_theta = text.get("rope_theta")
        if rope_theta is None and isinstance(text.get("rope_parameters"), Mapping):
            rope_theta = text["rope_parameters"].get("rope_theta")
        return cls(
            hidden_size=hidden,
            num_hidden_layers=int(need("num_hidden_layers")),
            num_attention_heads=heads,
            num_key_value_heads=int(text.get("num_key_value_heads") or heads),
            head_dim=int(head_dim) if head_dim is not None else hidden // heads,
            intermediate_size=int(need("intermediate_size")),
            vocab_size=int(need("vocab_size")),
            rms_norm_eps=float(text.get("rms_norm_eps") or 1e-6),
            rope_theta=float(rope_theta) if rope_theta is not None else DEFAULT_ROPE_THETA,
            max_position_embeddings=int(text.get("max_position_embeddings") or 32768),
            num_codebooks=int(audio.get("num_codebooks", NUM_CODEBOOKS)),
            codebook_vocab=int(audio.get("vocab_size", CODEBOOK_VOCAB)),
            audio_token_id=int(raw.get("audio_token_id", AUDIO_PLACEHOLDER_ID)),
            tie_audio_head=bool(audio.get("tie_word_embeddings", True)),
            tie_word_embeddings=bool(text.get("tie_word_embeddings", True)),
        )

    @classmethod
    def from_json_file(cls, path: str | Path) -> HiggsTalkerConfig:
        path = Path(path)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as e:
            raise ConfigError(f"config: {path} does not exist", key=str(path)) from e
        except json.JSONDecodeError as e:
            raise ConfigError(f"config: {path} is not valid JSON: {e}", key=str(path)) from e
        if not isinstance(raw, Mapping):
            raise ConfigError(f"config: {path} does not hold a JSON object", key=str(path))
        return cls.from_dict(raw)

    def to_dict(self) -> dict[str, Any]:
        """The HF config.json structure; ``from_dict(to_dict())`` round-trips.

        ``rope_theta`` is written as given (the released file has null, which
        reads back as the default).
        """
        text: dict[str, Any] = {
            "model_type": "qwen3",
            "architectures": ["Qwen3ForCausalLM"],
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": "silu",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "tie_word_embeddings": self.tie_word_embeddings,
            "torch_dtype": "bfloat16",
        }
        return {
            "model_type": MODEL_TYPE,
            "architectures": [ARCHITECTURE],
            "audio_token_id": self.audio_token_id,
            "audio_encoder_config": {
                "encoder_type": "discrete",
                "num_codebooks": self.num_codebooks,
                "vocab_size": self.codebook_vocab,
                "tie_word_embeddings": self.tie_audio_head,
                "out_dim": self.hidden_size,
            },
            "text_config": text,
            "torch_dtype": "bfloat16",
        }

    def fields(self) -> dict[str, Any]:
        """Flat field values (for logs and comparisons)."""
        return asdict(self)
