"""A residual unit's streaming step as one Triton kernel (CUDA streaming path).

In a codec step a residual unit is, in eager PyTorch, about a dozen full
passes over its activation (two Snakes of four kernels each, the cached
state's concatenation, a layout transpose either side of each cuDNN
convolution, the skip add, the start-of-utterance mask) around two small
convolutions. At the channel counts where most samples live (32, 64, 128)
the passes dominate, so :func:`fused_residual_step` does the whole step in
one launch: a program per (batch row, tile of output samples) holds all
channels of its tile, gathers each of the dilated convolution's 7 taps from
the cached activations or from ``snake1(x)`` (recomputed on load: cheaper
than a pass), runs the taps and the 1x1 convolution as ``tl.dot`` s, and
stores ``skip + branch`` masked, once. The programs of the first tile also
write the two new caches (the last ``6 d`` activations, the last ``3 d``
inputs), so there is no second launch.

It equals ``_Pass._residual`` of :mod:`realtime_engine.codec.causal` for a
step (float32 rounding apart; ``"ieee"`` precision, as Triton's CPU
interpreter runs it in the tests, or ``"tf32"``, the CUDA default). The
kernel does not specialise on the batch size, the sample count or the mask
layout, so it compiles once per (channels, dilation, precision) on a
warm-up call and is then safe inside a CUDA graph capture (no host reads,
allocations sized from host integers only).
"""

from __future__ import annotations

from typing import Any

import torch

from realtime_engine.codec.dac import ResidualUnit

FUSED_CHANNELS = (32, 64, 128)  # dot tiles need >= 16; above 128 a tile's weights spill

# Launch shape per channel count: (samples per program, warps). Guessed, not
# tuned: a [C, BLOCK_T] float32 accumulator of ~32-64 registers a thread,
# and several hundred programs or more at batch 64 (H200: 132 SMs). A
# program reads all 8 [C, C] weight tiles (from L2), so longer tiles read
# less weight per sample; 64 for C = 128 since n = 160 a frame there.
# Mutable for tuning (fused_unit_bench --launch); each shape compiles anew.
LAUNCH = {32: (128, 4), 64: (128, 4), 128: (64, 8)}

_kernel: Any = None


def _unit_kernel() -> Any:
    """Built on first use: importing Triton is for the CUDA path only."""
    global _kernel
    if _kernel is not None:
        return _kernel
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["n", "keep_stride", "keep_lo", "head"])
    def kernel(
        x_ptr,  # [B, C, n]
        conv_cache_ptr,  # [B, C, 6 D]: the last activations of the previous step
        skip_cache_ptr,  # [B, C, 3 D]: the last inputs of the previous step
        w1_ptr,  # [7, C, C]: conv1's taps, tap-major
        b1_ptr,  # [C]
        w2_ptr,  # [C, C]
        b2_ptr,  # [C]
        alpha1_ptr,  # [C], with inverse1 = 1 / (alpha1 + 1e-9)
        inverse1_ptr,
        alpha2_ptr,
        inverse2_ptr,
        keep_ptr,  # [B, keep_stride] float: the step's start-of-utterance mask
        y_ptr,  # [B, C, n] out
        new_conv_ptr,  # [B, C, 6 D] out
        new_skip_ptr,  # [B, C, 3 D] out
        n,
        keep_stride,
        keep_lo,
        head,  # the first ``head`` outputs are masked by keep[:, keep_lo:]
        C: tl.constexpr,
        D: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_H: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        history: tl.constexpr = 6 * D
        lag: tl.constexpr = 3 * D
        row = tl.program_id(0).to(tl.int64)
        tile = tl.program_id(1)
        ch = tl.arange(0, C)
        x_row = x_ptr + row * C * n + ch[:, None] * n
        conv_row = conv_cache_ptr + row * C * history + ch[:, None] * history
        skip_row = skip_cache_ptr + row * C * lag + ch[:, None] * lag
        alpha1 = tl.load(alpha1_ptr + ch)[:, None]
        inverse1 = tl.load(inverse1_ptr + ch)[:, None]

        t = tile * BLOCK_T + tl.arange(0, BLOCK_T)
        inside = (t < n)[None, :]
        # conv1 over cat(conv_cache, snake1(x)): output t, tap k reads position
        # t + k D of the concatenation
        w_at = ch[:, None] * C + ch[None, :]
        acc = tl.zeros((C, BLOCK_T), dtype=tl.float32)
        for k in tl.static_range(7):
            p = (t + k * D)[None, :]
            cached = inside & (p < history)
            fresh = inside & (p >= history)
            a_old = tl.load(conv_row + p, mask=cached, other=0.0)
            v = tl.load(x_row + (p - history), mask=fresh, other=0.0)
            s = tl.sin(alpha1 * v)
            a_new = v + s * s * inverse1  # snake1, recomputed per tap
            a = tl.where(cached, a_old, a_new)
            w = tl.load(w1_ptr + k * C * C + w_at)
            acc = tl.dot(w, a, acc, input_precision=PRECISION)
        h = acc + tl.load(b1_ptr + ch)[:, None]
        s = tl.sin(tl.load(alpha2_ptr + ch)[:, None] * h)
        g = h + s * s * tl.load(inverse2_ptr + ch)[:, None]
        branch = tl.dot(tl.load(w2_ptr + w_at), g, input_precision=PRECISION)
        branch += tl.load(b2_ptr + ch)[:, None]
        # the skip, delayed by ``lag``: cat(skip_cache, x)[t]
        skip_old = tl.load(skip_row + t[None, :], mask=inside & (t < lag)[None, :], other=0.0)
        skip_new = tl.load(x_row + (t - lag)[None, :], mask=inside & (t >= lag)[None, :], other=0.0)
        y = branch + tl.where((t < lag)[None, :], skip_old, skip_new)
        # start-of-utterance mask over the first ``head`` outputs
        masked = t < head
        keep = tl.load(keep_ptr + row * keep_stride + keep_lo + t, mask=masked, other=1.0)
        y = y * keep[None, :]
        tl.store(y_ptr + row * C * n + ch[:, None] * n + t[None, :], y, mask=inside)

        if tile == 0:
            # the new caches: the last ``history`` samples of cat(conv_cache,
            # snake1(x)) and the last ``lag`` of cat(skip_cache, x)
            j = tl.arange(0, BLOCK_H)[None, :]
            q = n + j
            in_conv = j < history
            cache_old = tl.load(conv_row + q, mask=in_conv & (q < history), other=0.0)
            xv = tl.load(x_row + (q - history), mask=in_conv & (q >= history), other=0.0)
            sv = tl.sin(alpha1 * xv)
            cache_new = xv + sv * sv * inverse1
            out_conv = new_conv_ptr + row * C * history + ch[:, None] * history + j
            tl.store(out_conv, tl.where(q < history, cache_old, cache_new), mask=in_conv)
            in_skip = j < lag
            s_old = tl.load(skip_row + q, mask=in_skip & (q < lag), other=0.0)
            s_new = tl.load(x_row + (q - lag), mask=in_skip & (q >= lag), other=0.0)
            out_skip = new_skip_ptr + row * C * lag + ch[:, None] * lag + j
            tl.store(out_skip, tl.where(q < lag, s_old, s_new), mask=in_skip)

    _kernel = kernel
    return kernel


def packed_taps(weight: torch.Tensor) -> torch.Tensor:
    """conv1's weight ``[C_out, C_in, 7]`` as ``[7, C_out, C_in]`` (contiguous)."""
    return weight.detach().permute(2, 0, 1).contiguous()


def fusable(channels: int, dtype: torch.dtype) -> bool:
    return channels in FUSED_CHANNELS and dtype == torch.float32


def fused_residual_step(
    x: torch.Tensor,
    conv_cache: torch.Tensor,
    skip_cache: torch.Tensor,
    taps: torch.Tensor,
    bias1: torch.Tensor,
    weight2: torch.Tensor,
    bias2: torch.Tensor,
    snakes: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    keep: torch.Tensor,
    keep_lo: int,
    head: int,
    dilation: int,
    precision: str = "tf32",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step of a residual unit: ``(y [B, C, n], new conv cache [B, C, 6 d],
    new skip cache [B, C, 3 d])`` (fresh tensors). ``taps``: :func:`packed_taps`
    of conv1; ``weight2``: conv2's ``[C, C]``; ``snakes``: (alpha1, 1 / alpha1,
    alpha2, 1 / alpha2), each ``C`` values; ``keep [B, *]``: the step's mask,
    of which columns ``keep_lo : keep_lo + head`` scale the first ``head``
    outputs. Everything float32."""
    batch, channels, n = x.shape
    if not fusable(channels, x.dtype) or n == 0:
        raise ValueError(f"no fused unit for {channels} channels of {x.dtype}, {n} samples")
    history, lag = 6 * dilation, 3 * dilation
    if conv_cache.shape != (batch, channels, history) or skip_cache.shape != (
        batch,
        channels,
        lag,
    ):
        raise ValueError("cache shapes do not match the unit")
    if precision not in ("tf32", "ieee"):
        raise ValueError(f"precision must be 'tf32' or 'ieee'; got {precision!r}")
    x = x.contiguous()
    y = torch.empty_like(x)
    new_conv = x.new_empty(batch, channels, history)
    new_skip = x.new_empty(batch, channels, lag)
    keep = keep.contiguous()
    block_t, warps = LAUNCH[channels]
    block_t = min(block_t, max(16, 1 << (n - 1).bit_length()))  # short steps: fewer idle lanes
    grid = (batch, (n + block_t - 1) // block_t)
    _unit_kernel()[grid](
        x,
        conv_cache.contiguous(),
        skip_cache.contiguous(),
        taps,
        bias1,
        weight2,
        bias2,
        *(s.reshape(-1) for s in snakes),
        keep,
        y,
        new_conv,
        new_skip,
        n,
        keep.shape[-1],
        keep_lo,
        head,
        C=channels,
        D=dilation,
        BLOCK_T=block_t,
        BLOCK_H=max(16, 1 << (history - 1).bit_length()),
        PRECISION=precision,
        num_warps=warps,
    )
    return y, new_conv, new_skip


def unit_fusable(unit: ResidualUnit, x: torch.Tensor, conv_cache: torch.Tensor) -> bool:
    """Whether :func:`unit_step` covers ``unit`` stepping on ``x``."""
    return (
        x.shape[-1] > 0
        and fusable(x.shape[1], x.dtype)
        and conv_cache.dtype == x.dtype
        and unit.conv1.weight.dtype == x.dtype
        and unit.conv1.bias is not None
        and unit.conv2.bias is not None
    )


def unit_step(
    unit: ResidualUnit,
    taps: torch.Tensor,
    inverses: tuple[torch.Tensor, torch.Tensor],
    x: torch.Tensor,
    caches: tuple[torch.Tensor, torch.Tensor],
    keep: torch.Tensor,
    keep_lo: int,
    head: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`fused_residual_step` of a :class:`ResidualUnit` (``taps`` packed by
    :func:`packed_taps`, ``inverses`` its Snakes' ``1 / alpha``), in the eager
    convolutions' precision: TF32 on CUDA unless cuDNN's TF32 is switched off."""
    assert unit.conv1.bias is not None and unit.conv2.bias is not None
    channels = x.shape[1]
    tf32 = x.is_cuda and torch.backends.cudnn.allow_tf32
    return fused_residual_step(
        x,
        *caches,
        taps,
        unit.conv1.bias,
        unit.conv2.weight.reshape(channels, channels),
        unit.conv2.bias,
        (unit.snake1.alpha, inverses[0], unit.snake2.alpha, inverses[1]),
        keep,
        keep_lo,
        head,
        unit.conv1.dilation[0],
        "tf32" if tf32 else "ieee",
    )
