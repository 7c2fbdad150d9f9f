"""A streaming step's output layer as one kernel (an experiment).

The codec ends in Snake and a 7-tap convolution from the last block's
channels (32 in the real codec) to the one audio channel, at 960 samples a
frame: the most samples of any layer. Run layer by layer that is an
activation pass writing the history and the activated samples, a cuDNN
convolution with a layout transpose of its whole input, and the start mask,
for one output channel.

:func:`fused_output` does it in one Triton kernel: a program takes one slot
and a tile of output samples, reads the activation's cached history and the
raw new samples, activates each new sample as it reads it (once per tap),
sums taps times weights over the channels, then adds the bias, masks the
samples before the utterance's start and writes the audio. Only the new
history's last samples are activated apart (by the codec), for the state.
The sums over the channels are tensor-core products with the one output
channel padded to 16 rows (the other 15 are zero and never written): the
products cost nothing here, and need no reduction across a program's
threads. Runs on CUDA, or on the CPU through Triton's interpreter (tests).
:func:`output_reference` is the same computation in PyTorch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from realtime_engine.codec.dac import Snake1d
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

# The output layer is fused from up to this many input channels (the real
# codec's 32; one program holds a tile of every channel).
MAX_FUSED_OUTPUT_CHANNELS = 128
_TILE_ELEMENTS = 8192  # padded channels x samples of one program's tile
# Warps a program: 4 ran faster than 8 on an H200 (docs/bench/RESULTS.md, section 36)
WARPS = 4


@dataclass(frozen=True)
class OutputWeights:
    """The output activation's ``alpha`` and ``1 / (alpha + 1e-9)`` in float32,
    the convolution's weight as ``[taps, 16, channels]`` (row 0 the weight, the
    rest zero), zero-padded; its bias as a float32 ``[1]``."""

    device: torch.device
    dtype: torch.dtype
    channels: int
    taps: int
    alpha: torch.Tensor
    inverse: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor

    @classmethod
    def of(cls, snake: Snake1d, conv: nn.Conv1d) -> OutputWeights:
        out_channels, channels, taps = conv.weight.shape
        if out_channels != 1 or conv.dilation[0] != 1:
            raise ValueError("the fused output layer is one channel out, dilation 1")
        padded = padded_channels(channels)
        with torch.no_grad():
            w = conv.weight.new_zeros(taps, MIN_DOT, padded)
            w[:, 0, :channels] = conv.weight.detach()[0].T
            alpha, inverse = snake_constants(snake.alpha, padded)
            return cls(
                device=conv.weight.device,
                dtype=conv.weight.dtype,
                channels=channels,
                taps=taps,
                alpha=alpha,
                inverse=inverse,
                weight=w.contiguous(),
                bias=padded_vector(conv.bias, 1, 0.0),
            )

    def matches(self, conv: nn.Conv1d) -> bool:
        return self.device == conv.weight.device and self.dtype == conv.weight.dtype


def output_reference(
    w: OutputWeights, history: torch.Tensor, x: torch.Tensor, keep: torch.Tensor
) -> torch.Tensor:
    """:func:`fused_output` in PyTorch (float32 arithmetic): the activation's
    history ``[B, C, taps - 1]``, the raw new samples ``[B, C, n]``, ``keep``
    ``[B, head]`` -> the audio ``[B, n]`` in ``history``'s dtype."""
    c, f32 = w.channels, torch.float32
    v = x.to(f32)
    sine = torch.sin(w.alpha[:c, None] * v)
    activated = (v + sine * sine * w.inverse[:c, None]).to(history.dtype)
    full = torch.cat([history, activated], -1).to(f32)
    y = F.conv1d(full, w.weight[:, 0, :c].T[None].to(f32), w.bias)[:, 0]
    head = keep.shape[-1]
    y[:, :head] *= keep.to(f32)
    return y.to(history.dtype)


def output_tile(channels: int) -> int:
    """Output samples per program for ``channels`` (a power of two, 16 to 256)."""
    return max(MIN_DOT, min(256, _TILE_ELEMENTS // padded_channels(channels)))


def fused_output(
    w: OutputWeights,
    history: torch.Tensor,
    x: torch.Tensor,
    keep: torch.Tensor,
    *,
    tile: int | None = None,
    warps: int = WARPS,
) -> torch.Tensor:
    """The output layer over a step's new samples as one kernel (see the module's
    notes; arguments and result as :func:`output_reference`'s). ``tile``: output
    samples a program (a power of two >= 16; by default :func:`output_tile`).
    Products in TF32 when PyTorch's matrix products may use it, else in full
    float32; float16 weights multiply in float16 and accumulate in float32.

    An opaque operator to ``torch.compile``, captured with the step."""
    _, channels, _ = x.shape
    if channels != w.channels or history.shape[1:] != (w.channels, w.taps - 1):
        raise ValueError(
            f"an output layer of {w.channels} channels and {w.taps} taps;"
            f" got x {tuple(x.shape)} and history {tuple(history.shape)}"
        )
    tile = output_tile(channels) if tile is None else tile
    if tile < MIN_DOT or tile & (tile - 1):
        raise ValueError(f"tile must be a power of two of at least {MIN_DOT}; got {tile}")
    return _output_op(history, x, keep, w.alpha, w.inverse, w.weight, w.bias, tile, warps)


@torch.library.custom_op("realtime_engine::fused_output", mutates_args=())
def _output_op(
    history: torch.Tensor,
    x: torch.Tensor,
    keep: torch.Tensor,
    alpha: torch.Tensor,
    inverse: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    tile: int,
    warps: int,
) -> torch.Tensor:
    batch, channels, n = x.shape
    y = history.new_empty(batch, n)
    if batch == 0 or n == 0:
        return y
    history, x, keep = (dense_aligned(t) for t in (history, x, keep))
    ran = launch(
        _output_kernel(),
        (batch, -(-n // tile)),
        history,
        x,
        keep,
        y,
        alpha,
        inverse,
        weight,
        bias,
        n,
        keep.shape[-1],
        CHANNELS=channels,
        ROWS=weight.shape[1],
        PADDED=weight.shape[2],
        TAPS=weight.shape[0],
        TILE=tile,
        PRECISION=dot_precision(),
        FAST_SINE=fast_sine(x.dtype),
        num_warps=warps,
    )
    return y if ran else y.zero_()


@_output_op.register_fake
def _(history: torch.Tensor, x: torch.Tensor, *rest: object) -> torch.Tensor:
    return history.new_empty(x.shape[0], x.shape[2])


@built_on_first_use
def _output_kernel() -> Any:
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice

    @triton.jit(do_not_specialize=["n", "head"])
    def output_kernel(
        history_ptr,
        x_ptr,
        keep_ptr,
        y_ptr,
        a_ptr,
        inv_ptr,
        w_ptr,
        b_ptr,
        n,
        head,
        CHANNELS: tl.constexpr,
        ROWS: tl.constexpr,
        PADDED: tl.constexpr,
        TAPS: tl.constexpr,
        TILE: tl.constexpr,
        PRECISION: tl.constexpr,
        FAST_SINE: tl.constexpr,
    ):
        slot = tl.program_id(0).to(tl.int64)
        t = tl.program_id(1) * TILE + tl.arange(0, TILE)
        c = tl.arange(0, PADDED)
        both = (c < CHANNELS)[:, None] & (t < n)[None, :]
        past = TAPS - 1
        history_rows = history_ptr + slot * CHANNELS * past + c[:, None] * past
        x_rows = x_ptr + slot * CHANNELS * n + c[:, None] * n
        alpha = tl.load(a_ptr + c)[:, None]
        inverse = tl.load(inv_ptr + c)[:, None]
        rows = tl.arange(0, ROWS)  # the output channel, padded for the products
        square = rows[:, None] * PADDED + c[None, :]
        # (not tl.zeros, nor tl.sum: jitted helpers, see fused_unit's kernel)
        acc = tl.full((ROWS, TILE), 0.0, tl.float32)
        for k in tl.static_range(TAPS):
            at = t[None, :] + k  # in [history, new samples]
            old = at < past
            kept = tl.load(history_rows + at, mask=both & old, other=0.0)
            raw = tl.load(x_rows + (at - past), mask=both & (at >= past), other=0.0)
            raw = raw.to(tl.float32)
            sine = libdevice.fast_sinf(alpha * raw) if FAST_SINE else tl.sin(alpha * raw)
            new = raw + sine * sine * inverse
            # rounded as the activation's own output would be
            taps = tl.where(old, kept, new.to(kept.dtype))
            w = tl.load(w_ptr + k * ROWS * PADDED + square)
            acc = tl.dot(w, taps.to(w.dtype), acc, input_precision=PRECISION)
        y = acc + tl.load(b_ptr)
        keep = tl.load(keep_ptr + slot * head + t, mask=t < head, other=1.0)
        y = y * keep.to(tl.float32)[None, :]
        # row 0 is the audio (the same place for every row, only row 0 stored)
        out = y_ptr + slot * n + t[None, :] + 0 * rows[:, None]
        tl.store(out, y.to(y_ptr.dtype.element_ty), mask=(rows == 0)[:, None] & (t < n)[None, :])

    return output_kernel
