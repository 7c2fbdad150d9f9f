"""Parsing the released config.json structure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from realtime_engine.errors import CheckpointError
from realtime_engine.model.config import ConfigError, HiggsTalkerConfig


def released_config() -> dict[str, Any]:
    """The shape of the published config.json, ASR fields included."""
    return {
        "architectures": ["HiggsMultimodalQwen3ForConditionalGeneration"],
        "model_type": "higgs_multimodal_qwen3",
        "audio_token_id": -100,
        "audio_encoder_config": {
            "encoder_type": "discrete",
            "num_codebooks": 8,
            "vocab_size": 1026,
            "tie_word_embeddings": True,
            "out_dim": 2560,
        },
        "text_config": {
            "model_type": "qwen3",
            "hidden_size": 2560,
            "num_hidden_layers": 36,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "intermediate_size": 9728,
            "vocab_size": 151936,
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 32768,
            "rope_theta": None,
            "hidden_act": "silu",
            "tie_word_embeddings": True,
        },
        "whisper_config": {"d_model": 1280, "encoder_layers": 32},
        "asr_token_id": 151699,
        "torch_dtype": "bfloat16",
    }


def test_released_config(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(released_config()))
    cfg = HiggsTalkerConfig.from_json_file(path)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.head_dim) == (2560, 36, 128)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (32, 8)
    assert (cfg.intermediate_size, cfg.vocab_size) == (9728, 151936)
    assert cfg.rope_theta == 1_000_000.0  # shipped as null
    assert (cfg.num_codebooks, cfg.codebook_vocab, cfg.audio_rows) == (8, 1026, 8208)
    assert cfg.audio_token_id == -100 and cfg.tie_audio_head
    assert (cfg.q_size, cfg.kv_size) == (4096, 1024)


def test_explicit_rope_theta_is_kept() -> None:
    raw = released_config()
    raw["text_config"]["rope_theta"] = 5e5
    assert HiggsTalkerConfig.from_dict(raw).rope_theta == 5e5


def test_head_dim_defaults_to_hidden_over_heads() -> None:
    raw = released_config()
    del raw["text_config"]["head_dim"]
    assert HiggsTalkerConfig.from_dict(raw).head_dim == 2560 // 32


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (lambda r: r.update(model_type="qwen3"), "model_type"),
        (lambda r: r.pop("text_config"), "text_config"),
        (lambda r: r["text_config"].pop("hidden_size"), "text_config.hidden_size"),
        (lambda r: r["text_config"].update(num_key_value_heads=7), "num_key_value_heads"),
        (lambda r: r["text_config"].update(hidden_act="gelu"), "text_config.hidden_act"),
        (lambda r: r["text_config"].update(attention_bias=True), "text_config.attention_bias"),
        (lambda r: r["audio_encoder_config"].update(num_codebooks=0), "num_codebooks"),
        (
            lambda r: r["audio_encoder_config"].update(encoder_type="whisper"),
            "audio_encoder_config.encoder_type",
        ),
        (lambda r: r["audio_encoder_config"].update(out_dim=1024), "audio_encoder_config.out_dim"),
    ],
)
def test_invalid_configs_name_the_field(edit: Any, key: str) -> None:
    raw = released_config()
    edit(raw)
    with pytest.raises(ConfigError) as info:
        HiggsTalkerConfig.from_dict(raw)
    assert info.value.key == key
    assert isinstance(info.value, CheckpointError)


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        HiggsTalkerConfig.from_json_file(tmp_path / "config.json")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        HiggsTalkerConfig.from_json_file(tmp_path / "config.json")


@given(
    hidden=st.integers(1, 64),
    layers=st.integers(1, 4),
    kv_heads=st.integers(1, 4),
    group=st.integers(1, 4),
    half_head_dim=st.integers(1, 64),
    theta=st.floats(1.0, 1e7),
    tie=st.booleans(),
    codebooks=st.integers(1, 12),
)
def test_to_dict_round_trips(
    hidden: int,
    layers: int,
    kv_heads: int,
    group: int,
    half_head_dim: int,
    theta: float,
    tie: bool,
    codebooks: int,
) -> None:
    cfg = HiggsTalkerConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=kv_heads * group,
        num_key_value_heads=kv_heads,
        head_dim=2 * half_head_dim,
        intermediate_size=3 * hidden,
        vocab_size=100,
        rope_theta=theta,
        tie_audio_head=tie,
        num_codebooks=codebooks,
    )
    again = HiggsTalkerConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg
