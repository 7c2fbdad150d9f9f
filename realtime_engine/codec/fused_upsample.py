"""A streaming decoder block's upsampling as one kernel (an experiment).

A block of the codec starts with Snake and a transposed convolution of kernel
``2 * stride``: input sample ``i`` adds ``W[:, :, r]`` times its activation to
output ``i * stride + r`` and ``W[:, :, stride + r]`` times it to output
``(i + 1) * stride + r``. Streamed, a step's output is the new inputs' sums
plus the partial sums the previous step's last input left (the state), and
the last input leaves new partial sums. Run layer by layer that is an
activation pass, a matrix product whose columns are twice the output, an
overlap-add of its halves, the partial sums, the bias and the start mask: at
256 slots, passes over small tensors far from the GPU's bandwidth
(docs/bench/RESULTS.md, sections 29-32).

:func:`fused_upsample` does it in one Triton kernel. A program takes one
slot, a tile of input positions ``i`` (``0..n``: position ``n`` is the new
partial sums), a block of output channels and one phase ``r``. It sums,
over the input channels in blocks, the two products ``W_r · a[i]`` and
``W_{stride+r} · a[i - 1]`` on tensor cores, with Snake applied to each
input as it is read; then adds the cached partial sums at ``i = 0``, the
bias and the start mask, and writes output ``i * stride + r``, or the new
partial sums at ``i = n``. The activation's output never reaches memory.
The phases are programs of their own rather than a loop in one: unrolled,
the loop made each kernel 3-6 times slower for Triton to build (19 s
against 3.4 s for the 256-channel block's, sm_90 from this host's CPU),
and the step's first call builds every kernel.

Channels are padded to powers of two of at least 16 (the products' least
size). A tile of inputs is at least 16 wide, so a block whose step brings few
inputs a slot (the real codec's first two, 1 and 8 a frame) would waste most
of its products: the kernel takes blocks of up to :data:`MAX_FUSED_IN_CHANNELS`
input channels (the real codec's last three, 40 to 320 inputs a frame), and a
codec fuses those of up to :data:`FUSED_IN_CHANNELS` (its last two). Runs on CUDA, or
on the CPU through Triton's interpreter (tests). :func:`upsample_reference`
is the same computation in PyTorch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from realtime_engine.codec.dac import DecoderBlock
from realtime_engine.codec.fused_unit import (
    MIN_DOT,
    built_on_first_use,
    dot_precision,
    fast_sine,
    padded_channels,
    padded_vector,
    snake_constants,
)
from realtime_engine.codec.kernel_launch import dense_aligned, launch

# Blocks of up to this many input channels can be fused (the real codec's last
# three: 256, 128 and 64 in; 40, 160 and 320 inputs a frame).
MAX_FUSED_IN_CHANNELS = 256
# A codec fuses blocks of up to this many: on an H200 at 256 slots the
# 256-channel block ran slower fused than layer by layer at every launch
# (docs/bench/RESULTS.md, section 36), the 128- and 64-channel ones faster.
FUSED_IN_CHANNELS = 128
_IN_BLOCK = 64  # input channels summed per product
_OUT_BLOCK = 128  # output channels a program takes at most
_TILE_ELEMENTS = 8192  # output channels x input positions of one accumulator


@dataclass(frozen=True)
class UpsampleWeights:
    """A block's activation and transposed convolution laid out for the kernel:
    ``alpha`` and ``1 / (alpha + 1e-9)`` in float32 over the padded input
    channels, the weight as ``[2 * stride, out, in]`` (zero-padded), the bias in
    float32."""

    device: torch.device
    dtype: torch.dtype
    in_channels: int
    out_channels: int
    stride: int
    alpha: torch.Tensor
    inverse: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor

    @property
    def in_padded(self) -> int:
        return int(self.weight.shape[2])

    @property
    def out_padded(self) -> int:
        return int(self.weight.shape[1])

    @classmethod
    def of(cls, block: DecoderBlock) -> UpsampleWeights:
        conv = block.conv_t1
        in_channels, out_channels, taps = conv.weight.shape
        stride = int(conv.stride[0])
        if taps != 2 * stride:
            raise ValueError(f"needs kernel = 2 * stride; got {taps} and {stride}")
        in_padded, out_padded = padded_channels(in_channels), padded_channels(out_channels)
        with torch.no_grad():
            w = conv.weight.new_zeros(taps, out_padded, in_padded)
            w[:, :out_channels, :in_channels] = conv.weight.detach().permute(2, 1, 0)
            alpha, inverse = snake_constants(block.snake1.alpha, in_padded)
            return cls(
                device=conv.weight.device,
                dtype=conv.weight.dtype,
                in_channels=in_channels,
                out_channels=out_channels,
                stride=stride,
                alpha=alpha,
                inverse=inverse,
                weight=w.contiguous(),
                bias=padded_vector(conv.bias, out_padded, 0.0),
            )

    def matches(self, block: DecoderBlock) -> bool:
        weight = block.conv_t1.weight
        return self.device == weight.device and self.dtype == weight.dtype


def upsample_reference(
    w: UpsampleWeights, x: torch.Tensor, partial: torch.Tensor, keep: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`fused_upsample` in PyTorch (float32 arithmetic): the raw new input
    ``x`` ``[B, in, n]``, the cached partial sums ``[B, out, stride]``, ``keep``
    ``[B, head]`` (1 where an output is at or after the utterance's start) ->
    (the output ``[B, out, n * stride]``, the new partial sums)."""
    f32, s = torch.float32, w.stride
    ci, co = w.in_channels, w.out_channels
    v = x.to(f32)
    sine = torch.sin(w.alpha[:ci, None] * v)
    a = v + sine * sine * w.inverse[:ci, None]
    weight = w.weight[:, :co, :ci].permute(2, 1, 0).to(f32)  # [in, out, 2s]
    y = F.conv_transpose1d(a, weight, stride=s)  # [B, out, (n + 1) * s]
    y[..., :s] += partial.to(f32)
    n = x.shape[-1]
    out = y[..., : n * s] + w.bias[:co, None]
    head = keep.shape[-1]
    out[..., :head] *= keep[:, None, :].to(f32)
    return out.to(partial.dtype), y[..., n * s :].to(partial.dtype)


def upsample_tile(out_block: int, inputs: int) -> int:
    """Input positions per program: enough for a step's ``inputs + 1`` where the
    accumulator allows (a power of two, 16 to 128)."""
    cap = max(MIN_DOT, min(128, _TILE_ELEMENTS // out_block))
    return max(MIN_DOT, min(cap, 1 << inputs.bit_length()))


def fused_upsample(
    w: UpsampleWeights,
    x: torch.Tensor,
    partial: torch.Tensor,
    keep: torch.Tensor,
    *,
    tile: int | None = None,
    out_block: int | None = None,
    warps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The block's activation and transposed convolution over a step's new input
    as one kernel (see the module's notes; arguments and results as
    :func:`upsample_reference`'s; outputs in ``partial``'s dtype). Products in
    TF32 when PyTorch's matrix products may use it, else in full float32;
    float16 weights multiply in float16 and accumulate in float32. The launch:
    ``out_block`` output channels a program (a power of two >= 16, by default
    all of them up to 128), ``tile`` input positions (by default
    :func:`upsample_tile`), ``warps`` (8 from 64 output channels, else 4: the
    faster at those tiles on an H200, docs/bench/RESULTS.md, section 36).

    The kernel is an opaque operator to ``torch.compile``: a compiled step
    calls it as it is, and a CUDA graph captures its launch."""
    _, in_channels, n = x.shape
    if in_channels != w.in_channels or partial.shape[1:] != (w.out_channels, w.stride):
        raise ValueError(
            f"a block of {w.in_channels} -> {w.out_channels} channels, stride {w.stride};"
            f" got x {tuple(x.shape)} and partial sums {tuple(partial.shape)}"
        )
    out_block = min(w.out_padded, _OUT_BLOCK) if out_block is None else out_block
    tile = upsample_tile(out_block, n) if tile is None else tile
    for name, value in (("tile", tile), ("out_block", out_block)):
        if value < MIN_DOT or value & (value - 1):
            raise ValueError(f"{name} must be a power of two of at least {MIN_DOT}; got {value}")
    if out_block > w.out_padded:
        raise ValueError(f"out_block may be at most the {w.out_padded} padded output channels")
    warps = (8 if out_block >= 64 else 4) if warps is None else warps
    return _upsample_op(
        x, partial, keep, w.alpha, w.inverse, w.weight, w.bias, tile, out_block, warps
    )


@torch.library.custom_op("realtime_engine::fused_upsample", mutates_args=())
def _upsample_op(
    x: torch.Tensor,
    partial: torch.Tensor,
    keep: torch.Tensor,
    alpha: torch.Tensor,
    inverse: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    tile: int,
    out_block: int,
    warps: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, in_channels, n = x.shape
    _, out_channels, stride = partial.shape
    y = partial.new_empty(batch, out_channels, n * stride)
    carry = partial.new_empty(partial.shape)
    if batch == 0 or n == 0:
        carry.copy_(partial)
        return y, carry
    x, partial, keep = (dense_aligned(t) for t in (x, partial, keep))
    # one program per slot, input tile, output-channel block and stride phase
    grid = (batch, -(-(n + 1) // tile), -(-out_channels // out_block) * stride)
    ran = launch(
        _upsample_kernel(),
        grid,
        x,
        partial,
        keep,
        y,
        carry,
        alpha,
        inverse,
        weight,
        bias,
        n,
        keep.shape[-1],
        IN_CHANNELS=in_channels,
        IN_PADDED=weight.shape[2],
        OUT_CHANNELS=out_channels,
        OUT_PADDED=weight.shape[1],
        STRIDE=stride,
        TILE=tile,
        OUT_BLOCK=out_block,
        IN_BLOCK=min(_IN_BLOCK, weight.shape[2]),
        PRECISION=dot_precision(),
        FAST_SINE=fast_sine(x.dtype),
        num_warps=warps,
    )
    return (y, carry) if ran else (y.zero_(), carry.zero_())


@_upsample_op.register_fake
def _(x: torch.Tensor, partial: torch.Tensor, *rest: object) -> tuple[torch.Tensor, torch.Tensor]:
    batch, _, n = x.shape
    _, out_channels, stride = partial.shape
    return partial.new_empty(batch, out_channels, n * stride), partial.new_empty(partial.shape)


@built_on_first_use
def _upsample_kernel() -> Any:
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice

    @triton.jit(do_not_specialize=["n", "head"])
    def upsample_kernel(
        x_ptr,
        partial_ptr,
        keep_ptr,
        y_ptr,
        carry_ptr,
        a_ptr,
        inv_ptr,
        w_ptr,
        b_ptr,
        n,
        head,
        IN_CHANNELS: tl.constexpr,
        IN_PADDED: tl.constexpr,
        OUT_CHANNELS: tl.constexpr,
        OUT_PADDED: tl.constexpr,
        STRIDE: tl.constexpr,
        TILE: tl.constexpr,
        OUT_BLOCK: tl.constexpr,
        IN_BLOCK: tl.constexpr,
        PRECISION: tl.constexpr,
        FAST_SINE: tl.constexpr,
    ):
        slot = tl.program_id(0).to(tl.int64)
        i = tl.program_id(1) * TILE + tl.arange(0, TILE)  # input positions, n: the carry
        r = tl.program_id(2) % STRIDE  # the phase: outputs i * STRIDE + r
        co = (tl.program_id(2) // STRIDE) * OUT_BLOCK + tl.arange(0, OUT_BLOCK)
        co_in = co < OUT_CHANNELS
        x_rows = x_ptr + slot * IN_CHANNELS * n
        length = n * STRIDE
        out_rows = y_ptr + slot * OUT_CHANNELS * length + co[:, None] * length
        # a partial sum's place, broadcast over the tile (only i = 0 or n is used)
        state = slot * OUT_CHANNELS * STRIDE + co[:, None] * STRIDE + 0 * i[None, :]
        first = (i == 0)[None, :]
        outputs = co_in[:, None] & (i < n)[None, :]
        carried = co_in[:, None] & (i == n)[None, :]
        bias = tl.load(b_ptr + co, mask=co_in, other=0.0)[:, None]
        # (not tl.zeros: see fused_unit's kernel)
        acc = tl.full((OUT_BLOCK, TILE), 0.0, tl.float32)
        for k0 in tl.static_range(0, IN_PADDED, IN_BLOCK):
            ci = k0 + tl.arange(0, IN_BLOCK)
            ci_in = (ci < IN_CHANNELS)[:, None]
            rows = x_rows + ci[:, None] * n
            alpha = tl.load(a_ptr + ci)[:, None]
            inverse = tl.load(inv_ptr + ci)[:, None]
            # Snake of a masked (zero) input is zero, as the sums need
            now = tl.load(rows + i[None, :], mask=ci_in & (i < n)[None, :], other=0.0)
            now = now.to(tl.float32)
            sine = libdevice.fast_sinf(alpha * now) if FAST_SINE else tl.sin(alpha * now)
            now = now + sine * sine * inverse
            before = tl.load(
                rows + (i - 1)[None, :], mask=ci_in & ((i >= 1) & (i <= n))[None, :], other=0.0
            )
            before = before.to(tl.float32)
            sine = libdevice.fast_sinf(alpha * before) if FAST_SINE else tl.sin(alpha * before)
            before = before + sine * sine * inverse
            square = co[:, None] * IN_PADDED + ci[None, :]
            w_now = tl.load(w_ptr + r * OUT_PADDED * IN_PADDED + square)
            w_before = tl.load(w_ptr + (STRIDE + r) * OUT_PADDED * IN_PADDED + square)
            acc = tl.dot(w_now, now.to(w_now.dtype), acc, input_precision=PRECISION)
            acc = tl.dot(w_before, before.to(w_now.dtype), acc, input_precision=PRECISION)
        old = tl.load(partial_ptr + state + r, mask=co_in[:, None] & first, other=0.0)
        y = acc + old.to(tl.float32) + bias
        at = i * STRIDE + r
        keep = tl.load(keep_ptr + slot * head + at, mask=at < head, other=1.0)
        y = y * keep.to(tl.float32)[None, :]
        tl.store(out_rows + at[None, :], y.to(y_ptr.dtype.element_ty), mask=outputs)
        carry = acc.to(carry_ptr.dtype.element_ty)
        tl.store(carry_ptr + state + r, carry, mask=carried)

    return upsample_kernel
