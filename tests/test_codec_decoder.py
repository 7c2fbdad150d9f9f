"""Codec decoder: wiring against an independent functional reference, the
+-10 frame receptive field, and the strict bundled / standalone loaders."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from realtime_engine.codec.boson import (
    boson_to_bundled,
    bundled_to_boson,
    fold_weight_norm,
    load_boson_codec,
)
from realtime_engine.codec.decoder import CodecDecoder, extract_codec_state, load_codec_decoder
from realtime_engine.codec.errors import CodecInputError
from realtime_engine.codec.layout import CODEC_PREFIX, CodecDims, random_codec_state_dict
from realtime_engine.errors import (
    CheckpointError,
    MissingKeyError,
    ShapeMismatchError,
    UnexpectedKeyError,
)

HOP = 960


# Small convolutions are fastest single-threaded on a shared machine.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny_state() -> dict[str, torch.Tensor]:
    return random_codec_state_dict(CodecDims.tiny(), torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def tiny_codec(tiny_state: dict[str, torch.Tensor]) -> CodecDecoder:
    return load_codec_decoder(tiny_state)


def random_codes(frames: int, seed: int, batch: int = 1) -> torch.Tensor:
    return torch.randint(0, 1024, (batch, 8, frames), generator=torch.Generator().manual_seed(seed))


def reference_decode(sd: dict[str, torch.Tensor], codes: torch.Tensor) -> torch.Tensor:
    """The codec written out from its description with torch.nn.functional."""

    def snake(x: torch.Tensor, name: str) -> torch.Tensor:
        alpha = sd[f"{name}.alpha"]
        return x + torch.sin(alpha * x) ** 2 / (alpha + 1e-9)

    def conv(x: torch.Tensor, name: str, dilation: int = 1) -> torch.Tensor:
        w = sd[f"{name}.weight"]
        pad = (w.shape[-1] - 1) // 2 * dilation
        return F.conv1d(x, w, sd[f"{name}.bias"], padding=pad, dilation=dilation)

    latent = sum(
        F.linear(
            sd[f"quantizer.quantizers.{q}.codebook.embed"][codes[:, q]],
            sd[f"quantizer.quantizers.{q}.project_out.weight"],
            sd[f"quantizer.quantizers.{q}.project_out.bias"],
        )
        for q in range(8)
    )
    assert isinstance(latent, torch.Tensor)
    x = F.linear(latent, sd["fc2.weight"], sd["fc2.bias"]).transpose(1, 2)
    x = conv(x, "acoustic_decoder.conv1")
    for i, s in enumerate((8, 5, 4, 2, 3)):
        p = f"acoustic_decoder.block.{i}"
        x = snake(x, f"{p}.snake1")
        x = F.conv_transpose1d(
            x,
            sd[f"{p}.conv_t1.weight"],
            sd[f"{p}.conv_t1.bias"],
            stride=s,
            padding=math.ceil(s / 2),
            output_padding=s % 2,
        )
        for r, d in ((1, 1), (2, 3), (3, 9)):
            u = f"{p}.res_unit{r}"
            y = conv(snake(x, f"{u}.snake1"), f"{u}.conv1", dilation=d)
            x = x + conv(snake(y, f"{u}.snake2"), f"{u}.conv2")
    return conv(snake(x, "acoustic_decoder.snake1"), "acoustic_decoder.conv2")


def test_decoder_matches_functional_reference(
    tiny_state: dict[str, torch.Tensor], tiny_codec: CodecDecoder
) -> None:
    codes = random_codes(13, seed=1, batch=2)
    pcm = tiny_codec.decode(codes)
    assert pcm.shape == (2, 1, 13 * HOP)
    assert pcm.dtype == torch.float32
    ref = reference_decode(tiny_state, codes)
    assert torch.allclose(pcm, ref, atol=1e-5 * float(ref.abs().max()))


def test_random_codec_output_is_audio_like(tiny_codec: CodecDecoder) -> None:
    pcm = tiny_codec.decode(random_codes(25, seed=2))
    assert bool(torch.isfinite(pcm).all())
    assert 0.01 < float(pcm.std()) < 2.0
    # Different codes give different audio (the codebooks are not ignored).
    assert not torch.allclose(pcm, tiny_codec.decode(random_codes(25, seed=3)))


def test_batch_rows_decode_independently(tiny_codec: CodecDecoder) -> None:
    codes = random_codes(12, seed=4, batch=3)
    batched = tiny_codec.decode(codes)
    for b in range(3):
        single = tiny_codec.decode(codes[b : b + 1])
        peak = float(single.abs().max())
        assert float((batched[b] - single[0]).abs().max()) < 1e-5 * peak


def test_one_frame_change_reaches_exactly_ten_frames_each_way(tiny_codec: CodecDecoder) -> None:
    frames, t = 41, 20
    codes = random_codes(frames, seed=5)
    changed = codes.clone()
    changed[:, :, t] = (changed[:, :, t] + 1) % 1024
    diff = (tiny_codec.decode(changed) - tiny_codec.decode(codes)).abs().reshape(frames, HOP)
    touched = [f for f in range(frames) if float(diff[f].max()) > 0]
    assert touched == list(range(t - 10, t + 11))


@pytest.mark.parametrize(("left", "right"), [(10, 10), (9, 10), (10, 9)])
def test_window_context_of_ten_frames_is_exact_and_nine_is_not(
    tiny_codec: CodecDecoder, left: int, right: int
) -> None:
    frames, lo, hi = 60, 25, 35
    codes = random_codes(frames, seed=6)
    whole = tiny_codec.decode(codes)[0, 0]
    window = tiny_codec.decode(codes[:, :, lo - left : hi + right])[0, 0]
    part = window[left * HOP : (left + hi - lo) * HOP]
    err = float((part - whole[lo * HOP : hi * HOP]).abs().max()) / float(whole.abs().max())
    if left >= 10 and right >= 10:
        assert err < 1e-5
    else:
        assert err > 1e-4


def test_window_starting_at_frame_zero_needs_no_left_context(tiny_codec: CodecDecoder) -> None:
    codes = random_codes(40, seed=7)
    whole = tiny_codec.decode(codes)[0, 0]
    head = tiny_codec.decode(codes[:, :, :15])[0, 0][: 5 * HOP]
    assert float((head - whole[: 5 * HOP]).abs().max()) < 1e-5 * float(whole.abs().max())


@pytest.mark.parametrize(
    "codes",
    [
        torch.zeros(1, 7, 4, dtype=torch.long),
        torch.zeros(8, 4, dtype=torch.long),
        torch.zeros(1, 8, 4),
        torch.full((1, 8, 4), 1024, dtype=torch.long),
        torch.full((1, 8, 4), -1, dtype=torch.long),
    ],
    ids=["7-codebooks", "2-d", "float", "boc", "negative"],
)
def test_bad_codes_are_rejected(tiny_codec: CodecDecoder, codes: torch.Tensor) -> None:
    with pytest.raises(CodecInputError):
        tiny_codec.decode(codes)


def test_decode_numpy_matches_torch(tiny_codec: CodecDecoder) -> None:
    codes = random_codes(6, seed=8, batch=2)
    out = tiny_codec.decode_numpy(codes.numpy())
    assert out.shape == (2, 6 * HOP)
    assert torch.allclose(torch.from_numpy(out), tiny_codec.decode(codes)[:, 0])


# -- strict bundled loader -------------------------------------------------


def test_talker_prefix_is_stripped(tiny_state: dict[str, torch.Tensor]) -> None:
    talker = {CODEC_PREFIX + k: v for k, v in tiny_state.items()}
    talker["body.norm.weight"] = torch.ones(4)
    assert extract_codec_state(talker).keys() == tiny_state.keys()


@pytest.mark.parametrize(
    "key",
    [
        "quantizer.quantizers.5.codebook.embed",
        "quantizer.quantizers.0.project_out.bias",
        "fc2.weight",
        "acoustic_decoder.conv1.bias",
        "acoustic_decoder.block.3.res_unit2.conv1.bias",
        "acoustic_decoder.block.1.snake1.alpha",
        "acoustic_decoder.snake1.alpha",
        "acoustic_decoder.conv2.weight",
    ],
)
def test_missing_decoder_tensor_is_named(tiny_state: dict[str, torch.Tensor], key: str) -> None:
    sd = {k: v for k, v in tiny_state.items() if k != key}
    with pytest.raises(MissingKeyError) as err:
        load_codec_decoder(sd)
    assert err.value.key == key


def test_embed_avg_never_stands_in_for_the_codebook(tiny_state: dict[str, torch.Tensor]) -> None:
    sd = {k: v for k, v in tiny_state.items() if k != "quantizer.quantizers.2.codebook.embed"}
    with pytest.raises(MissingKeyError):
        load_codec_decoder(sd)
    codec = load_codec_decoder(tiny_state)
    loaded = codec.state_dict()["quantizer.quantizers.2.codebook.embed"]
    assert torch.equal(loaded, tiny_state["quantizer.quantizers.2.codebook.embed"])
    assert not torch.equal(loaded, tiny_state["quantizer.quantizers.2.codebook.embed_avg"])


def test_wrong_shape_is_named(tiny_state: dict[str, torch.Tensor]) -> None:
    sd = dict(tiny_state)
    sd["acoustic_decoder.block.2.res_unit1.conv2.weight"] = torch.zeros(8, 8, 3)
    with pytest.raises(ShapeMismatchError) as err:
        load_codec_decoder(sd)
    assert err.value.key == "acoustic_decoder.block.2.res_unit1.conv2.weight"


@pytest.mark.parametrize(
    "key",
    [
        "unknown_decoder_module.weight",
        "acoustic_decoder.block.0.extra.weight",
        "quantizer.quantizers.0.codebook.weight",
        "fc3.weight",
    ],
)
def test_unknown_tensor_is_an_error(tiny_state: dict[str, torch.Tensor], key: str) -> None:
    sd = dict(tiny_state)
    sd[key] = torch.zeros(3)
    with pytest.raises(UnexpectedKeyError) as err:
        load_codec_decoder(sd)
    assert err.value.key == key


def test_encoder_side_tensors_are_accepted_and_ignored(tiny_state: dict[str, torch.Tensor]) -> None:
    decoder_only = random_codec_state_dict(
        CodecDims.tiny(), torch.Generator().manual_seed(0), include_encoder=False
    )
    assert len(decoder_only) < len(tiny_state)
    codes = random_codes(5, seed=9)
    a = load_codec_decoder(tiny_state).decode(codes)
    b = load_codec_decoder(decoder_only).decode(codes)
    assert torch.equal(a, b)


def test_nine_quantizers_are_refused(tiny_state: dict[str, torch.Tensor]) -> None:
    sd = dict(tiny_state)
    for name in ("codebook.embed", "project_out.weight", "project_out.bias"):
        sd[f"quantizer.quantizers.8.{name}"] = sd[f"quantizer.quantizers.0.{name}"]
    with pytest.raises(ShapeMismatchError):
        load_codec_decoder(sd)


def test_non_finite_weights_are_refused(tiny_state: dict[str, torch.Tensor]) -> None:
    sd = dict(tiny_state)
    bad = sd["fc2.bias"].clone()
    bad[0] = float("nan")
    sd["fc2.bias"] = bad
    with pytest.raises(CheckpointError) as err:
        load_codec_decoder(sd)
    assert err.value.key == "fc2.bias"


def test_bfloat16_checkpoint_decodes_in_float32(tiny_state: dict[str, torch.Tensor]) -> None:
    sd = {k: v.to(torch.bfloat16) for k, v in tiny_state.items()}
    codec = load_codec_decoder(sd)
    assert all(p.dtype == torch.float32 for p in codec.parameters())
    assert codec.decode(random_codes(3, seed=10)).dtype == torch.float32


# -- standalone (weight-norm) layout ---------------------------------------


def test_standalone_layout_names_and_weight_norm(tiny_state: dict[str, torch.Tensor]) -> None:
    boson = bundled_to_boson(tiny_state)
    for key in (
        "decoder_2.model.0.weight_g",
        "decoder_2.model.0.weight_v",
        "decoder_2.model.1.block.0.alpha",
        "decoder_2.model.1.block.1.weight_v",
        "decoder_2.model.5.block.4.block.3.weight_g",
        "decoder_2.model.6.alpha",
        "decoder_2.model.7.bias",
        "quantizer.vq.layers.7._codebook.embed",
        "quantizer.vq.layers.7._codebook.embed_avg",
        "quantizer.vq.layers.0.project_out.weight",
        "fc_prior.weight",
        "fc_post1.weight",
        "fc_post2.bias",
        "encoder.block.0.weight_g",
        "encoder.block.3.block.2.block.1.weight_v",
        "encoder.block.5.block.4.weight_g",
        "encoder.block.7.bias",
        "encoder_semantic.conv.conv.weight",
        "decoder_semantic.conv_blocks.1.res_units.0.conv1.conv.weight",
    ):
        assert key in boson, key
    assert not any(k.startswith(("acoustic_decoder.", "fc2.")) for k in boson)


def test_standalone_layout_decodes_like_the_bundled_one(
    tiny_state: dict[str, torch.Tensor], tiny_codec: CodecDecoder
) -> None:
    codes = random_codes(9, seed=11)
    standalone = load_boson_codec(bundled_to_boson(tiny_state))
    a, b = standalone.decode(codes), tiny_codec.decode(codes)
    assert torch.allclose(a, b, atol=1e-5 * float(b.abs().max()))


def test_standalone_round_trip_restores_every_tensor(tiny_state: dict[str, torch.Tensor]) -> None:
    back = boson_to_bundled(bundled_to_boson(tiny_state))
    assert back.keys() == tiny_state.keys()
    for key, value in tiny_state.items():
        assert torch.allclose(back[key], value, atol=1e-6), key


def test_weight_norm_folding_normalises_v() -> None:
    v = torch.tensor([[[3.0, 4.0]], [[0.0, 2.0]]])
    g = torch.tensor([[[10.0]], [[1.0]]])
    w = fold_weight_norm(g, v, "x")
    assert torch.allclose(w, torch.tensor([[[6.0, 8.0]], [[0.0, 1.0]]]))


def test_standalone_without_weight_v_is_named(tiny_state: dict[str, torch.Tensor]) -> None:
    boson = bundled_to_boson(tiny_state)
    del boson["decoder_2.model.2.block.1.weight_v"]
    with pytest.raises(MissingKeyError) as err:
        load_boson_codec(boson)
    assert err.value.key == "decoder_2.model.2.block.1.weight_v"


def test_standalone_unknown_tensor_is_an_error(tiny_state: dict[str, torch.Tensor]) -> None:
    boson = bundled_to_boson(tiny_state)
    boson["decoder_2.model.9.weight"] = torch.zeros(1)
    with pytest.raises(UnexpectedKeyError):
        load_boson_codec(boson)


def test_precision_switches_and_rejects_unknown_names(tiny_state: dict[str, torch.Tensor]) -> None:
    codec = load_codec_decoder(tiny_state)
    codes = random_codes(6, seed=5)
    fp32 = codec.decode(codes)
    for precision in ("tf32", "bf16", "fp16", "fp32"):
        codec.set_precision(precision)
        assert codec.precision == precision
        assert codec.allow_tf32 == (precision == "tf32")
        assert codec.autocast_bf16 == (precision == "bf16")
        # CPU has neither TF32 nor CUDA autocast, and keeps float32 weights for fp16:
        # every setting computes fp32 here
        assert not codec.half_weights
        assert torch.equal(codec.decode(codes), fp32)
    with pytest.raises(ValueError, match="fp8"):
        codec.set_precision("fp8")
    assert codec.precision == "fp32"


def test_a_float16_codec_decodes_to_float32_and_cannot_switch_back(
    tiny_state: dict[str, torch.Tensor],
) -> None:
    # what set_precision("fp16") does on CUDA, done by hand on the CPU
    codec = load_codec_decoder(tiny_state)
    exact = load_codec_decoder(tiny_state).double()
    codec.half()
    assert codec.precision == "fp16"  # its weights say so, however they were cast
    codec.set_precision("fp16")
    assert codec.half_weights and codec.precision == "fp16"
    codes = random_codes(6, seed=5)
    pcm = codec.decode(codes)
    assert pcm.dtype == torch.float32
    reference = exact.decode(codes)
    assert float((pcm - reference).abs().max() / reference.abs().max()) < 5e-2
    for other in ("fp32", "tf32", "bf16"):
        with pytest.raises(ValueError, match="rounded to float16"):
            codec.set_precision(other)
    assert codec.precision == "fp16"


def test_tf32_matmul_scope_sets_high_inside_and_restores_the_process_setting() -> None:
    # vLLM's worker asks for IEEE float32 matmuls process-wide; the codec's TF32
    # scope must lift that for its own products only, and put it back even on error
    from realtime_engine.codec.decoder import _tf32_matmuls

    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        with pytest.raises(RuntimeError, match="inside"), _tf32_matmuls():
            assert torch.get_float32_matmul_precision() == "high"
            raise RuntimeError("inside")
        assert torch.get_float32_matmul_precision() == "highest"
    finally:
        torch.set_float32_matmul_precision(before)


def test_cpu_compute_context_leaves_matmul_precision_alone(
    tiny_state: dict[str, torch.Tensor],
) -> None:
    codec = load_codec_decoder(tiny_state)
    codec.set_precision("tf32")
    before = torch.get_float32_matmul_precision()
    with codec.compute_context():
        assert torch.get_float32_matmul_precision() == before
