"""Strict loading of the real checkpoint layout (tiny sizes)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from realtime_engine.codec.layout import CODEC_PREFIX
from realtime_engine.errors import (
    CheckpointError,
    MissingKeyError,
    ShapeMismatchError,
    UnexpectedKeyError,
)
from realtime_engine.model.checkpoint import (
    CodecView,
    SafetensorsCheckpoint,
    TalkerKeyChecker,
    expected_talker_shapes,
    validate_talker_shapes,
)
from realtime_engine.model.config import HiggsTalkerConfig
from realtime_engine.model.loader import load_talker
from realtime_engine.model.tiny import write_tiny_checkpoint

Edit = Callable[[dict[str, torch.Tensor]], object]


def _edited_copy(src: Path, dst: Path, edit: Edit) -> Path:
    shutil.copytree(src, dst)
    state = load_file(str(dst / "model.safetensors"))
    edit(state)
    save_file(state, str(dst / "model.safetensors"))
    return dst


def _params(path: Path) -> dict[str, torch.Tensor]:
    return dict(load_talker(path, with_codec=False).model.state_dict())


def test_single_file_and_sharded_load_the_same_weights(
    tiny_checkpoint: Path, tiny_sharded_checkpoint: Path
) -> None:
    assert len(list(tiny_sharded_checkpoint.glob("model-*.safetensors"))) == 3
    single, sharded = _params(tiny_checkpoint), _params(tiny_sharded_checkpoint)
    assert single.keys() == sharded.keys()
    for name, value in single.items():
        assert torch.equal(value, sharded[name]), name
    raw = load_file(str(tiny_checkpoint / "model.safetensors"))
    assert torch.equal(
        single["body.layers.1.mlp.up_proj.weight"], raw["body.layers.1.mlp.up_proj.weight"]
    )
    assert torch.equal(
        single["audio_embedding.weight"],
        raw["tied.embedding.modality_embeddings.0.embedding.weight"],
    )


def test_loaded_talker_comes_with_codec_and_tokenizer(tiny_checkpoint: Path) -> None:
    loaded = load_talker(tiny_checkpoint)
    assert loaded.codec is not None
    assert loaded.path == tiny_checkpoint
    assert loaded.config.num_hidden_layers == 2
    assert not any(p.requires_grad for p in loaded.model.parameters())
    assert not loaded.model.training
    codes = torch.randint(0, 1024, (1, 8, 3), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        audio = loaded.codec(codes)
    assert audio.shape[-1] == 3 * 960


@pytest.mark.parametrize(
    ("edit", "error", "key"),
    [
        (
            lambda s: s.pop("body.layers.1.self_attn.k_norm.weight"),
            MissingKeyError,
            "body.layers.1.self_attn.k_norm.weight",
        ),
        (lambda s: s.pop("body.norm.weight"), MissingKeyError, "body.norm.weight"),
        (
            lambda s: s.pop("tied.embedding.modality_embeddings.0.embedding.weight"),
            MissingKeyError,
            "tied.embedding.modality_embeddings.0.embedding.weight",
        ),
        (
            lambda s: s.update({"lm_head.weight": torch.zeros(2048, 64)}),
            UnexpectedKeyError,
            "lm_head.weight",
        ),
        (
            lambda s: s.update({"body.layers.2.mlp.up_proj.weight": torch.zeros(128, 64)}),
            UnexpectedKeyError,
            "body.layers.2.mlp.up_proj.weight",
        ),
        (
            lambda s: s.update({"body.layers.0.self_attn.q_proj.bias": torch.zeros(128)}),
            UnexpectedKeyError,
            "body.layers.0.self_attn.q_proj.bias",
        ),
        (
            lambda s: s.update({"body.layers.0.self_attn.k_proj.weight": torch.zeros(32, 64)}),
            ShapeMismatchError,
            "body.layers.0.self_attn.k_proj.weight",
        ),
        (
            lambda s: s.update({"tied.head.text_head.weight": torch.zeros(2047, 64)}),
            ShapeMismatchError,
            "tied.head.text_head.weight",
        ),
    ],
    ids=[
        "missing-layer-key",
        "missing-norm",
        "missing-audio-embedding",
        "unknown-prefix",
        "layer-beyond-config",
        "bias",
        "wrong-shape",
        "wrong-optional-shape",
    ],
)
def test_layout_errors_name_the_key(
    tiny_checkpoint: Path, tmp_path: Path, edit: Edit, error: type[CheckpointError], key: str
) -> None:
    broken = _edited_copy(tiny_checkpoint, tmp_path / "broken", edit)
    with pytest.raises(error) as info:
        load_talker(broken)
    assert info.value.key == key
    assert key in str(info.value)


@pytest.mark.parametrize(
    ("edit", "error", "key"),
    [
        (
            lambda s: s.pop(CODEC_PREFIX + "fc2.weight"),
            MissingKeyError,
            "fc2.weight",
        ),
        (
            lambda s: s.update({CODEC_PREFIX + "mystery.weight": torch.zeros(3)}),
            UnexpectedKeyError,
            "mystery.weight",
        ),
    ],
    ids=["missing-codec-key", "unknown-codec-key"],
)
def test_codec_errors_come_from_the_codec_loader(
    tiny_checkpoint: Path, tmp_path: Path, edit: Edit, error: type[CheckpointError], key: str
) -> None:
    broken = _edited_copy(tiny_checkpoint, tmp_path / "broken", edit)
    with pytest.raises(error) as info:
        load_talker(broken)
    assert info.value.key == key
    # The talker alone does not need the codec.
    assert load_talker(broken, with_codec=False).codec is None


def test_optional_heads_are_accepted_and_ignored(tiny_checkpoint: Path, tmp_path: Path) -> None:
    with_heads = write_tiny_checkpoint(tmp_path / "heads", seed=0, with_optional_heads=True)
    keys = SafetensorsCheckpoint(with_heads).keys()
    assert {"tied.head.text_head.weight", "tied.head.modality_heads.0.weight"} <= set(keys)
    plain, headed = _params(tiny_checkpoint), _params(with_heads)
    assert plain.keys() == headed.keys()
    assert all(torch.equal(plain[k], headed[k]) for k in plain)


def test_untied_audio_head_is_required_and_loaded(tiny_checkpoint: Path, tmp_path: Path) -> None:
    head = torch.randn(8 * 1026, 64, generator=torch.Generator().manual_seed(3))

    def add_head(state: dict[str, torch.Tensor]) -> None:
        state["tied.head.modality_heads.0.weight"] = head

    untied = _edited_copy(tiny_checkpoint, tmp_path / "untied", add_head)
    config = json.loads((untied / "config.json").read_text())
    config["audio_encoder_config"]["tie_word_embeddings"] = False
    (untied / "config.json").write_text(json.dumps(config))
    model = load_talker(untied, with_codec=False).model
    assert model.audio_head is not None and torch.equal(model.audio_head_weight, head)
    assert not torch.equal(model.audio_head_weight, model.audio_embedding.weight)

    state = load_file(str(untied / "model.safetensors"))
    del state["tied.head.modality_heads.0.weight"]
    save_file(state, str(untied / "model.safetensors"))
    with pytest.raises(MissingKeyError) as info:
        load_talker(untied, with_codec=False)
    assert info.value.key == "tied.head.modality_heads.0.weight"


def _rewrite_index(path: Path, edit: Callable[[dict[str, str]], object]) -> None:
    index = json.loads((path / "model.safetensors.index.json").read_text())
    edit(index["weight_map"])
    (path / "model.safetensors.index.json").write_text(json.dumps(index))


def test_sharded_index_must_match_the_shards(tiny_sharded_checkpoint: Path, tmp_path: Path) -> None:
    listed_elsewhere = shutil.copytree(tiny_sharded_checkpoint, tmp_path / "a")
    _rewrite_index(
        listed_elsewhere,
        lambda m: m.update({"body.norm.weight": "model-00009-of-00009.safetensors"}),
    )
    with pytest.raises(MissingKeyError, match="model-00009-of-00009"):
        SafetensorsCheckpoint(listed_elsewhere)

    unlisted = shutil.copytree(tiny_sharded_checkpoint, tmp_path / "b")
    _rewrite_index(unlisted, lambda m: m.pop("body.norm.weight"))
    with pytest.raises(UnexpectedKeyError) as info:
        SafetensorsCheckpoint(unlisted)
    assert info.value.key == "body.norm.weight"

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(MissingKeyError, match=r"neither model\.safetensors"):
        SafetensorsCheckpoint(empty)


def test_codec_view_strips_the_prefix(tiny_checkpoint: Path) -> None:
    checkpoint = SafetensorsCheckpoint(tiny_checkpoint)
    view = CodecView(checkpoint)
    codec_keys = [k for k in checkpoint if k.startswith(CODEC_PREFIX)]
    assert len(view) == len(codec_keys) > 0
    assert "fc2.weight" in view and CODEC_PREFIX + "fc2.weight" not in view
    assert torch.equal(view["fc2.weight"], checkpoint[CODEC_PREFIX + "fc2.weight"])


def _released_config() -> HiggsTalkerConfig:
    return HiggsTalkerConfig(
        hidden_size=2560,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=9728,
        vocab_size=151936,
    )


def test_released_layout_key_count_and_shapes() -> None:
    shapes = expected_talker_shapes(_released_config())
    # text embedding + 36 layers × 11 tensors + final norm + audio embedding
    assert len(shapes) == 1 + 36 * 11 + 1 + 1
    assert shapes["tied.embedding.text_embedding.weight"] == (151936, 2560)
    assert shapes["tied.embedding.modality_embeddings.0.embedding.weight"] == (8208, 2560)
    assert shapes["body.layers.35.self_attn.q_proj.weight"] == (4096, 2560)
    assert shapes["body.layers.0.self_attn.k_proj.weight"] == (1024, 2560)
    assert shapes["body.layers.7.self_attn.o_proj.weight"] == (2560, 4096)
    assert shapes["body.layers.3.self_attn.q_norm.weight"] == (128,)
    assert shapes["body.layers.3.mlp.down_proj.weight"] == (2560, 9728)


def test_streaming_checker_enforces_the_same_rules() -> None:
    config = _released_config()
    shapes = expected_talker_shapes(config)
    validate_talker_shapes(
        {**shapes, "tied.head.text_head.weight": (151936, 2560), CODEC_PREFIX + "fc2.weight": (1,)},
        config,
    )
    checker = TalkerKeyChecker(config)
    checker.see("body.norm.weight", (2560,))
    with pytest.raises(CheckpointError, match="appears twice"):
        checker.see("body.norm.weight", (2560,))
    with pytest.raises(UnexpectedKeyError):
        checker.see("model.norm.weight", (2560,))
    with pytest.raises(ShapeMismatchError):
        checker.see("body.layers.0.mlp.up_proj.weight", (2560, 9728))
    with pytest.raises(MissingKeyError) as info:
        checker.finish()
    assert info.value.key == "tied.embedding.text_embedding.weight"
