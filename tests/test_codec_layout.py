"""Codec sizes, bundled key names and the random synthetic codec."""

from __future__ import annotations

import pytest
import torch

from realtime_engine.codec.layout import (
    CodecDims,
    decoder_key_shapes,
    is_unused_key,
    random_codec_state_dict,
    unused_key_shapes,
)
from realtime_engine.errors import MissingKeyError


@pytest.mark.parametrize("dims", [CodecDims.tiny(), CodecDims.higgs_v3()], ids=["tiny", "real"])
def test_hop_is_960_and_shapes_match_layout(dims: CodecDims) -> None:
    assert dims.hop == 960
    # The real encoder side is ~180 M parameters: materialise it only when tiny.
    full = dims == CodecDims.tiny()
    sd = random_codec_state_dict(dims, torch.Generator().manual_seed(0), include_encoder=full)
    expected = dict(decoder_key_shapes(dims))
    if full:
        expected.update(unused_key_shapes(dims))
    assert set(sd) == set(expected)
    for key, shape in expected.items():
        assert tuple(sd[key].shape) == shape, key
        assert sd[key].dtype == torch.float32


def test_real_sizes_follow_the_published_table() -> None:
    shapes = {**decoder_key_shapes(CodecDims.higgs_v3()), **unused_key_shapes(CodecDims.higgs_v3())}
    table = {
        "quantizer.quantizers.7.codebook.embed": (1024, 64),
        "quantizer.quantizers.0.project_in.weight": (64, 1024),
        "quantizer.quantizers.0.project_in.bias": (64,),
        "quantizer.quantizers.3.project_out.weight": (1024, 64),
        "quantizer.quantizers.3.project_out.bias": (1024,),
        "fc.weight": (1024, 1024),
        "fc1.weight": (768, 1024),
        "fc2.weight": (256, 1024),
        "acoustic_decoder.conv1.weight": (1024, 256, 7),
        "acoustic_decoder.block.0.snake1.alpha": (1, 1024, 1),
        "acoustic_decoder.block.0.conv_t1.weight": (1024, 512, 16),
        "acoustic_decoder.block.0.conv_t1.bias": (512,),
        "acoustic_decoder.block.1.conv_t1.weight": (512, 256, 10),
        "acoustic_decoder.block.4.conv_t1.weight": (64, 32, 6),
        "acoustic_decoder.block.2.res_unit3.snake2.alpha": (1, 128, 1),
        "acoustic_decoder.block.2.res_unit1.conv1.weight": (128, 128, 7),
        "acoustic_decoder.block.2.res_unit1.conv2.weight": (128, 128, 1),
        "acoustic_decoder.snake1.alpha": (1, 32, 1),
        "acoustic_decoder.conv2.weight": (1, 32, 7),
        "acoustic_decoder.conv2.bias": (1,),
        "acoustic_encoder.conv2.weight": (256, 2048, 3),
        "semantic_model.encoder.layers.11.attention.q_proj.weight": (768, 768),
    }
    for key, shape in table.items():
        assert shapes[key] == shape, key


@pytest.mark.parametrize("dims", [CodecDims.tiny(), CodecDims.higgs_v3()], ids=["tiny", "real"])
def test_dims_round_trip_through_shapes(dims: CodecDims) -> None:
    shapes = {**decoder_key_shapes(dims), **unused_key_shapes(dims)}
    meta = {k: torch.empty(s, device="meta") for k, s in shapes.items()}
    assert CodecDims.from_state_dict(meta, base=dims) == dims


def test_dims_inference_names_the_missing_key() -> None:
    shapes = decoder_key_shapes(CodecDims.tiny())
    meta = {k: torch.empty(s, device="meta") for k, s in shapes.items() if not k.startswith("fc2")}
    with pytest.raises(MissingKeyError) as err:
        CodecDims.from_state_dict(meta)
    assert err.value.key == "fc2.weight"


def test_unused_keys_are_recognised_and_decoder_keys_are_not() -> None:
    dims = CodecDims.tiny()
    assert all(is_unused_key(k, dims.num_quantizers) for k in unused_key_shapes(dims))
    assert not any(is_unused_key(k, dims.num_quantizers) for k in decoder_key_shapes(dims))
    assert not is_unused_key("quantizer.quantizers.8.codebook.embed_avg", 8)
    assert not is_unused_key("acoustic_decoder.extra.weight", 8)


def test_random_codec_is_seeded() -> None:
    a = random_codec_state_dict(CodecDims.tiny(), torch.Generator().manual_seed(3))
    b = random_codec_state_dict(CodecDims.tiny(), torch.Generator().manual_seed(3))
    c = random_codec_state_dict(CodecDims.tiny(), torch.Generator().manual_seed(4))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["fc2.weight"], c["fc2.weight"])
