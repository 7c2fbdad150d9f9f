"""The fused output layer (one Triton kernel for the last Snake, the 7-tap
convolution to the audio channel and the start mask), run here through
Triton's CPU interpreter: it equals the layers in PyTorch for any width,
length and mask, and the reference is the module's own convolution. The codec
streaming with it is tested with the fused units (tests/test_fused_unit.py,
mode ``"narrow"``)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from realtime_engine.codec.causal import CausalDac
from realtime_engine.codec.dac import DacDecoder, Snake1d
from realtime_engine.codec.fused_output import (
    MAX_FUSED_OUTPUT_CHANNELS,
    OutputWeights,
    fused_output,
    output_reference,
    output_tile,
)
from realtime_engine.codec.layout import CodecDims

pytest.importorskip("triton", reason="the kernel is Triton's (a vLLM dependency)")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(autouse=True)
def interpreted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def output_layer(channels: int, seed: int) -> tuple[Snake1d, nn.Conv1d]:
    torch.manual_seed(seed)
    snake, conv = Snake1d(channels), nn.Conv1d(channels, 1, 7, padding=3)
    with torch.no_grad():
        snake.alpha.uniform_(0.2, 2.0)
    return snake, conv


def step_inputs(
    channels: int, batch: int, n: int, head: int, seed: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    history = torch.randn(batch, channels, 6, generator=g).to(dtype)
    x = torch.randn(batch, channels, n, generator=g).to(dtype)
    keep = (torch.rand(batch, head, generator=g) > 0.5).to(dtype)
    return history, x, keep


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    # (a start mask may zero every sample)
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-12))


@settings(max_examples=16, deadline=None)
@given(
    channels=st.sampled_from([1, 4, 8, 32, 48, 128]),
    n=st.integers(1, 300),
    batch=st.integers(1, 3),
    head_share=st.floats(0, 1),
    tile=st.sampled_from([None, 16]),
    seed=st.integers(0, 2**16),
)
def test_the_kernel_is_the_layers_computed_in_pytorch(
    channels: int, n: int, batch: int, head_share: float, tile: int | None, seed: int
) -> None:
    w = OutputWeights.of(*output_layer(channels, seed))
    history, x, keep = step_inputs(channels, batch, n, round(head_share * n), seed, torch.float32)
    got = fused_output(w, history, x, keep, tile=tile)
    assert rel(got, output_reference(w, history, x, keep)) < 1e-5


def test_the_reference_is_the_modules_own_layers() -> None:
    """From a zero history, the reference is the module's Snake and convolution
    over the signal (delayed by the convolution's right padding)."""
    snake, conv = output_layer(8, seed=1)
    w = OutputWeights.of(snake, conv)
    signal = torch.randn(2, 8, 50)
    with torch.no_grad():
        whole = conv(snake(signal))[:, 0]
        got = output_reference(w, torch.zeros(2, 8, 6), signal, torch.ones(2, 0))
    assert rel(got[:, 3:], whole[:, :-3]) < 1e-5


def test_float16_stays_close() -> None:
    snake, conv = output_layer(32, seed=3)
    w = OutputWeights.of(snake.half(), conv.half())
    history, x, keep = step_inputs(32, 2, 200, 90, seed=3, dtype=torch.float16)
    got = fused_output(w, history, x, keep)
    assert got.dtype == torch.float16
    assert rel(got, output_reference(w, history, x, keep)) < 2e-3


def test_shapes_and_launches_are_checked() -> None:
    assert [output_tile(c) for c in (1, 32, 64, 128)] == [256, 256, 128, 64]
    w = OutputWeights.of(*output_layer(8, seed=0))
    history, x, keep = step_inputs(8, 1, 10, 0, 0, torch.float32)
    with pytest.raises(ValueError, match="tile must be a power of two"):
        fused_output(w, history, x, keep, tile=48)
    with pytest.raises(ValueError, match="an output layer of 8 channels and 7 taps"):
        fused_output(w, history[..., 1:], x, keep)
    with pytest.raises(ValueError, match="one channel out, dilation 1"):
        OutputWeights.of(Snake1d(8), nn.Conv1d(8, 2, 7, padding=3))


def test_only_the_narrow_mode_on_a_kernel_device_fuses_the_output_layer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dac = DacDecoder(CodecDims.tiny())
    assert dac.conv2.in_channels <= MAX_FUSED_OUTPUT_CHANNELS
    x = torch.zeros(1, dac.conv2.in_channels, 1)
    net = CausalDac(dac, fused_units="narrow")
    assert net.output_weights(x) is not None
    for mode in (False, True, "activation"):
        assert CausalDac(dac, fused_units=mode).output_weights(x) is None
    assert net.output_weights(x.double()) is None
    monkeypatch.delenv("TRITON_INTERPRET")
    assert net.output_weights(x) is None
    wide = DacDecoder(CodecDims(decoder_channels=(32, 16, 8, 8, 8, 256)))
    assert CausalDac(wide, fused_units="narrow").output_weights(torch.zeros(1, 256, 1)) is None
