"""The tiny synthetic checkpoint and model-id resolution."""

from __future__ import annotations

import hashlib
import json
import shutil
import string
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from realtime_engine.codec.layout import CODEC_PREFIX, CodecDims, decoder_key_shapes
from realtime_engine.model.control_tags import CONTROL_TAGS
from realtime_engine.model.hub import ModelNotFoundError, resolve_model, tiny_checkpoint_dir
from realtime_engine.model.loader import load_talker
from realtime_engine.model.prompts import build_zero_shot_prompt
from realtime_engine.model.tokenizer import STRUCTURAL_TOKENS, HiggsTokenizer
from realtime_engine.tools.make_tiny_checkpoint import main as make_tiny_main

FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def _digests(directory: Path) -> dict[str, str]:
    return {name: hashlib.sha256((directory / name).read_bytes()).hexdigest() for name in FILES}


def test_same_seed_gives_identical_bytes(tiny_checkpoint: Path, tmp_path: Path) -> None:
    assert make_tiny_main([str(tmp_path / "again")]) == 0
    assert _digests(tmp_path / "again") == _digests(tiny_checkpoint)


def test_other_seed_gives_other_weights(tiny_checkpoint: Path, tmp_path: Path) -> None:
    make_tiny_main([str(tmp_path / "seed1"), "--seed", "1"])
    a = load_file(str(tiny_checkpoint / "model.safetensors"))
    b = load_file(str(tmp_path / "seed1" / "model.safetensors"))
    assert a.keys() == b.keys()
    assert not torch.equal(
        a["body.layers.0.mlp.up_proj.weight"], b["body.layers.0.mlp.up_proj.weight"]
    )
    assert (tiny_checkpoint / "tokenizer.json").read_bytes() == (
        tmp_path / "seed1" / "tokenizer.json"
    ).read_bytes()


def test_cli_writes_shards_and_optional_heads(tmp_path: Path) -> None:
    out = tmp_path / "sharded"
    make_tiny_main([str(out), "--shards", "2", "--with-optional-heads"])
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = set(index["weight_map"].values())
    assert files == {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
    assert "tied.head.text_head.weight" in index["weight_map"]
    assert load_talker(out, with_codec=False).config.hidden_size == 64


def test_config_has_the_released_structure(tiny_checkpoint: Path) -> None:
    config = json.loads((tiny_checkpoint / "config.json").read_text())
    assert config["model_type"] == "higgs_multimodal_qwen3"
    assert config["architectures"] == ["HiggsMultimodalQwen3ForConditionalGeneration"]
    assert config["audio_token_id"] == -100
    audio = config["audio_encoder_config"]
    assert (audio["encoder_type"], audio["num_codebooks"], audio["vocab_size"]) == (
        "discrete",
        8,
        1026,
    )
    text = config["text_config"]
    assert text["model_type"] == "qwen3"
    dims = (
        text["hidden_size"],
        text["num_hidden_layers"],
        text["num_attention_heads"],
        text["num_key_value_heads"],
        text["head_dim"],
        text["intermediate_size"],
        text["vocab_size"],
    )
    assert dims == (64, 2, 4, 2, 32, 128, 2048)


def test_codec_tensors_use_the_bundled_names(tiny_checkpoint: Path) -> None:
    state = load_file(str(tiny_checkpoint / "model.safetensors"))
    for key, shape in decoder_key_shapes(CodecDims.tiny()).items():
        assert tuple(state[CODEC_PREFIX + key].shape) == shape, key
    assert not [k for k in state if k.startswith("tied.head.")]


def test_tokenizer_covers_ascii_specials_and_tags(tiny_checkpoint: Path) -> None:
    tok = HiggsTokenizer.from_dir(tiny_checkpoint)
    assert tok.vocab_size <= 2048
    text = string.printable
    assert tok.decode(tok.encode(text)) == text
    ids = {tok.added_token_id(t) for t in (*STRUCTURAL_TOKENS, *CONTROL_TAGS)}
    assert None not in ids and len(ids) == 7 + 43


def test_transformers_reads_the_tokenizer(tiny_checkpoint: Path) -> None:
    transformers = pytest.importorskip(
        "transformers", reason="loading through transformers needs it (a vLLM dependency)"
    )
    hf = transformers.AutoTokenizer.from_pretrained(str(tiny_checkpoint))
    tok = HiggsTokenizer.from_dir(tiny_checkpoint)
    text = "<|style:whispering|>Quiet, please. 42!"
    assert hf.encode(text, add_special_tokens=False) == tok.encode(text)
    assert hf.eos_token_id == tok.specials.eos
    assert hf.convert_tokens_to_ids("<|audio|>") == tok.specials.audio


def test_greedy_codes_are_varied(tiny_checkpoint: Path) -> None:
    loaded = load_talker(tiny_checkpoint, with_codec=False)
    model = loaded.model
    ids = torch.tensor(build_zero_shot_prompt(loaded.tokenizer, "Hello there, world.").token_ids)
    cache = model.new_cache()
    rows = []
    with torch.no_grad():
        hidden = model.forward_embeds(model.embed_prompt(ids)[None], [cache])[0, -1]
        for _ in range(40):
            logits = model.audio_logits(hidden)[:, :1024]  # real codes only
            row = logits.argmax(-1)
            rows.append(tuple(row.tolist()))
            hidden = model.forward_embeds(model.embed_audio_rows(row)[None, None], [cache])[0, -1]
    assert len(set(rows)) >= 30
    for q in range(8):
        assert len({r[q] for r in rows}) >= 8
    # Neither flat nor one-hot: sampling at temperature 1 has real choices.
    probs = torch.softmax(logits, dim=-1)
    assert 0.005 < float(probs.max()) < 0.9


def test_bundled_codec_makes_bounded_audible_audio(tiny_checkpoint: Path) -> None:
    codec = load_talker(tiny_checkpoint).codec
    assert codec is not None
    codes = torch.randint(0, 1024, (1, 8, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        audio = codec(codes)
    assert audio.shape[-1] == 9600
    assert torch.isfinite(audio).all()
    assert 1e-3 < float(audio.pow(2).mean().sqrt()) < 10.0


def test_resolve_tiny_uses_the_cache(tiny_checkpoint: Path, tmp_path: Path) -> None:
    assert resolve_model("tiny") == tiny_checkpoint  # the session cache
    other = tiny_checkpoint_dir(0, root=tmp_path)
    assert other != tiny_checkpoint and _digests(other) == _digests(tiny_checkpoint)
    assert tiny_checkpoint_dir(0, root=tmp_path) == other  # second call reuses it
    assert resolve_model("tiny-seed0") == tiny_checkpoint


def test_resolve_local_directories(tiny_checkpoint: Path, tmp_path: Path) -> None:
    assert resolve_model(str(tiny_checkpoint)) == tiny_checkpoint
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model(str(tmp_path / "nowhere"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(ModelNotFoundError, match="not a checkpoint directory"):
        resolve_model(str(tmp_path / "file"))


def test_resolve_hf_id_offline_from_the_cache(tiny_checkpoint: Path, tmp_path: Path) -> None:
    cache = tmp_path / "hf"
    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / "models--acme--tiny-talker"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    shutil.copytree(tiny_checkpoint, repo / "snapshots" / revision)
    path = resolve_model("acme/tiny-talker", hf_cache_dir=cache)
    assert path == repo / "snapshots" / revision
    assert load_talker(path, with_codec=False).config.num_hidden_layers == 2
    with pytest.raises(ModelNotFoundError, match="not in the local Hugging Face cache"):
        resolve_model("acme/absent", hf_cache_dir=cache)
