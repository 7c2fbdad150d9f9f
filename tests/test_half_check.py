"""A float16 codec keeps float16 only where it holds on the weights it was loaded with."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from realtime_engine.codec.decoder import CodecDecoder, load_codec_decoder
from realtime_engine.codec.half_check import (
    FP16_FALLBACK,
    FP16_TOLERANCE,
    check_half,
    probe_codes,
    set_checked_precision,
)
from realtime_engine.codec.layout import CodecDims, random_codec_state_dict

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def codec() -> CodecDecoder:
    """The tiny codec, random weights, float32: a fresh one a test (they cast it)."""
    return load_codec_decoder(
        random_codec_state_dict(CodecDims.tiny(), torch.Generator().manual_seed(0))
    )


def overflowing(codec: CodecDecoder) -> CodecDecoder:
    """The codec with its input projection scaled so that the first activations pass
    float16's 65504 (float32 decodes it as before, only louder)."""
    with torch.no_grad():
        codec.fc2.weight.mul_(1e6)
    return codec


def test_the_probe_measures_float16_against_float32_and_leaves_the_codec_as_it_was(
    codec: CodecDecoder,
) -> None:
    codec.set_precision("tf32")
    before = {k: v.clone() for k, v in codec.state_dict().items()}
    check = check_half(codec, frames=12)
    # the tiny random codec in float16: about 1-2e-2 of its peak (docs/presets.md)
    assert 1e-4 < check.error < 5e-2
    assert check.tolerance == FP16_TOLERANCE
    assert check.passed == (check.error <= FP16_TOLERANCE)
    assert codec.precision == "tf32" and not codec.half_weights
    after = codec.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    # the same probe on every start
    assert torch.equal(probe_codes(codec, 12), probe_codes(codec, 12))


def test_an_overflow_fails_the_probe(codec: CodecDecoder) -> None:
    check = check_half(overflowing(codec), frames=12)
    assert check.error == math.inf and not check.passed


def test_a_half_codec_cannot_be_probed(codec: CodecDecoder) -> None:
    with pytest.raises(ValueError, match="float32 weights"):
        check_half(codec.half())


def test_float16_is_taken_where_the_probe_passes(
    codec: CodecDecoder, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="realtime_engine.codec"):
        taken = set_checked_precision(codec, "fp16", tolerance=1.0, casts=True)
    assert taken == "fp16" and codec.precision == "fp16"
    assert "float16 is" in caplog.text and "of the peak from float32" in caplog.text


def test_float16_falls_back_to_tf32_where_the_probe_fails(
    codec: CodecDecoder, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="realtime_engine.codec"):
        taken = set_checked_precision(overflowing(codec), "fp16", casts=True)
    assert taken == FP16_FALLBACK == codec.precision
    assert not codec.half_weights
    assert "running in tf32 instead" in caplog.text and "inf" in caplog.text


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
def test_other_precisions_and_the_cpu_are_taken_as_asked(
    codec: CodecDecoder, precision: str
) -> None:
    # no probe: nothing is cast (an overflowing codec would fail one)
    assert set_checked_precision(overflowing(codec), precision, casts=True) == precision
    assert codec.precision == precision
    # on the CPU, fp16 keeps float32 weights: nothing to check either
    assert set_checked_precision(codec, "fp16") == "fp16"
    assert not codec.half_weights
