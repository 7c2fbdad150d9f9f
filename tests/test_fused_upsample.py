"""The fused upsampling (one Triton kernel for a block's activation, transposed
convolution, partial sums, bias and start mask), run here through Triton's CPU
interpreter: it equals the layers computed in PyTorch for any widths, stride,
length, output blocking and start mask, and the reference is the module's own
transposed convolution. The codec streaming with it is tested with the fused
units (tests/test_fused_unit.py, mode ``"narrow"``)."""

from __future__ import annotations

from typing import cast

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from realtime_engine.codec.causal import CausalDac
from realtime_engine.codec.dac import DacDecoder, DecoderBlock
from realtime_engine.codec.fused_upsample import (
    FUSED_IN_CHANNELS,
    MAX_FUSED_IN_CHANNELS,
    UpsampleWeights,
    fused_upsample,
    upsample_reference,
    upsample_tile,
)
from realtime_engine.codec.layout import CodecDims

pytest.importorskip("triton", reason="the kernel is Triton's (a vLLM dependency)")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(autouse=True)
def interpreted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def random_block(in_channels: int, out_channels: int, stride: int, seed: int) -> DecoderBlock:
    torch.manual_seed(seed)
    block = DecoderBlock(in_channels, out_channels, stride)
    with torch.no_grad():
        block.snake1.alpha.uniform_(0.2, 2.0)
    return block.eval()


def step_inputs(
    w: UpsampleWeights, batch: int, n: int, head: int, seed: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, w.in_channels, n, generator=g).to(dtype)
    partial = torch.randn(batch, w.out_channels, w.stride, generator=g).to(dtype)
    keep = (torch.rand(batch, head, generator=g) > 0.5).to(dtype)
    return x, partial, keep


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    # (a start mask may zero every sample)
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-12))


@settings(max_examples=16, deadline=None)
@given(
    in_channels=st.sampled_from([4, 8, 24, 64, 160]),
    out_channels=st.sampled_from([4, 16, 40, 160]),
    stride=st.sampled_from([2, 3, 4, 5, 8]),
    n=st.integers(1, 80),
    batch=st.integers(1, 3),
    head_share=st.floats(0, 1),
    narrow_blocks=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_the_kernel_is_the_layers_computed_in_pytorch(
    in_channels: int,
    out_channels: int,
    stride: int,
    n: int,
    batch: int,
    head_share: float,
    narrow_blocks: bool,
    seed: int,
) -> None:
    """Output and new partial sums, with the output channels in one block or in
    blocks of 16 (several programs a slot and tile)."""
    w = UpsampleWeights.of(random_block(in_channels, out_channels, stride, seed))
    head = round(head_share * n * stride)
    x, partial, keep = step_inputs(w, batch, n, head, seed, torch.float32)
    out_block = 16 if narrow_blocks else None
    y, carry = fused_upsample(w, x, partial, keep, out_block=out_block)
    want_y, want_carry = upsample_reference(w, x, partial, keep)
    assert rel(y, want_y) < 1e-5
    assert rel(carry, want_carry) < 1e-5


def test_the_reference_is_the_modules_transposed_convolution_in_pieces() -> None:
    """Two steps of upsample_reference, from zero partial sums, give the block's
    own activation and ConvTranspose1d over the whole signal (without its
    padding's crop, which the codec's delay accounts for)."""
    block = random_block(8, 6, 5, seed=2)
    w = UpsampleWeights.of(block)
    signal = torch.randn(2, 8, 23)
    none = torch.ones(2, 0)
    with torch.no_grad():
        whole = F.conv_transpose1d(
            block.snake1(signal), block.conv_t1.weight, block.conv_t1.bias, stride=5
        )
        first, partial = upsample_reference(w, signal[..., :9], torch.zeros(2, 6, 5), none)
        second, partial = upsample_reference(w, signal[..., 9:], partial, none)
        streamed = torch.cat([first, second, partial + block.conv_t1.bias[:, None]], -1)
    assert rel(streamed, whole) < 1e-5


def test_float16_multiplies_in_float16_and_stays_close() -> None:
    w = UpsampleWeights.of(random_block(64, 32, 3, seed=3).half())
    x, partial, keep = step_inputs(w, 2, 70, 50, seed=3, dtype=torch.float16)
    y, carry = fused_upsample(w, x, partial, keep)
    want_y, want_carry = upsample_reference(w, x, partial, keep)
    assert y.dtype == carry.dtype == torch.float16
    assert rel(y, want_y) < 2e-3
    assert rel(carry, want_carry) < 2e-3


def test_tiles_cover_a_step_where_the_accumulator_allows() -> None:
    assert [upsample_tile(32, n) for n in (1, 15, 16, 40, 320)] == [16, 16, 32, 64, 128]
    assert [upsample_tile(128, n) for n in (8, 40, 160)] == [16, 64, 64]
    w = UpsampleWeights.of(random_block(8, 8, 2, seed=0))
    x, partial, keep = step_inputs(w, 1, 10, 0, 0, torch.float32)
    with pytest.raises(ValueError, match="tile must be a power of two"):
        fused_upsample(w, x, partial, keep, tile=24)
    with pytest.raises(ValueError, match="out_block may be at most the 16"):
        fused_upsample(w, x, partial, keep, out_block=32)
    with pytest.raises(ValueError, match="a block of 8 -> 8 channels, stride 2"):
        fused_upsample(w, x[:, :4], partial, keep)


def test_only_the_upsample_mode_on_a_kernel_device_fuses_blocks_up_to_the_width(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dac = DacDecoder(CodecDims(decoder_channels=(32, 256, 16, 16, 8, 8)))
    fits, too_wide = (cast(DecoderBlock, b) for b in list(dac.block)[:2])  # 32 and 256 in
    # the kernel takes the wider block too (the bench times it), a codec does not
    assert fits.conv_t1.in_channels <= FUSED_IN_CHANNELS < too_wide.conv_t1.in_channels
    assert too_wide.conv_t1.in_channels <= MAX_FUSED_IN_CHANNELS
    x = torch.zeros(1, 32, 1)
    net = CausalDac(dac, fused_units="narrow")
    assert net.upsample_weights(fits, x) is not None
    assert net.upsample_weights(too_wide, torch.zeros(1, 256, 1)) is None
    for mode in (False, True, "activation"):
        assert CausalDac(dac, fused_units=mode).upsample_weights(fits, x) is None
    assert net.upsample_weights(fits, x.double()) is None
    monkeypatch.delenv("TRITON_INTERPRET")
    assert net.upsample_weights(fits, x) is None
