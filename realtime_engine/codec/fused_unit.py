"""A streaming residual unit's branch, skip and mask as one kernel (an experiment).

In a streaming codec step, a residual unit is ``x + conv2(snake2(conv1(full)))``
over the new samples, where ``full`` is the first activation's cached history
followed by the new samples' activation. Run layer by layer that is a
convolution (with a layout transpose on each side of it in cuDNN), an
activation pass, a 1×1 convolution (two more transposes), and a pass for the
skip and the start-of-utterance mask: at 256 slots, mostly passes over small
tensors that run far from the GPU's bandwidth (docs/bench/RESULTS.md,
sections 29-31).

:func:`fused_residual` does all of it in one Triton kernel. A program takes
one slot and a tile of output samples with every channel. It sums the
dilated convolution's taps as tensor-core products straight from ``full``
(an implicit GEMM), applies the second activation in registers, multiplies
by the 1×1 convolution's weight in registers, adds the delayed skip (from
the skip's cache or the new input) and the bias, masks the samples before
the utterance's start, and writes the unit's output once.

With ``activate`` the kernel also takes the unit's first activation: it reads
the activation's history and the raw new samples, applies the activation to
each new sample it reads (once per tap), and the pass that would write the
history followed by the activated samples, and the kernel's read of it, go.
Which of the two is faster is for the GPU to say (``bench.gpu.fused_unit_bench``).

Channels are padded to a power of two of at least 16 (the products' least
size), so any width runs; the wider the channels, the more registers a
tile takes, so the kernel takes units up to :data:`MAX_FUSED_CHANNELS`
(a codec fuses those up to :data:`FUSED_CHANNELS`).
Kernels run on CUDA, or on the CPU through Triton's interpreter
(``TRITON_INTERPRET=1``, for tests). :func:`residual_reference` is the
same computation in PyTorch.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

import torch
import torch.nn.functional as F

from realtime_engine.codec.dac import ResidualUnit
from realtime_engine.codec.kernel_launch import dense_aligned, launch

# Units of up to this many channels can be fused (the real codec's last three
# blocks: 128, 64 and 32 channels, where a step's samples are).
MAX_FUSED_CHANNELS = 128
# A codec fuses units of up to this many: on an H200 at 256 slots the
# 128-channel units ran slower fused than layer by layer at every launch
# (docs/bench/RESULTS.md, section 36), the 64- and 32-channel ones faster.
FUSED_CHANNELS = 64
MIN_DOT = 16  # tensor-core products need every side at least this long

# How a codec fuses its narrow layers: not at all, each residual unit after its
# first activation (True), with it ("activation"), or so and each narrow
# block's upsampling and the output layer too ("narrow": every narrow layer of
# a step; realtime_engine.codec.fused_upsample and fused_output).
FusedUnits = bool | Literal["activation", "narrow"]
FUSED_UNITS_VALUES: tuple[FusedUnits, ...] = (False, True, "activation", "narrow")
# What a streaming codec is asked for: one of those, or "auto" (by device).
FusedUnitsOption = FusedUnits | Literal["auto"]
DEFAULT_FUSED_UNITS: Final[FusedUnitsOption] = "auto"


def resolve_fused_units(value: FusedUnitsOption, device: torch.device) -> FusedUnits:
    """``"auto"``: every narrow layer fused (``"narrow"``) on CUDA, none elsewhere
    (Triton's interpreter is for the tests that ask for it). Served on one H100
    with float16 and shifted taps, against TF32 without them: 12% more audio and
    a step 1.3 ms shorter at 256 streams (docs/bench/RESULTS.md, section 40)."""
    if value == "auto":
        return "narrow" if device.type == "cuda" else False
    return value


def interpreting() -> bool:
    """Whether Triton kernels run through its CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def dot_precision() -> str:
    """The kernels' product precision: TF32 where PyTorch's matrix products may
    use it, else full float32 (read when a kernel launches: a captured graph
    keeps what its capture read)."""
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"


def fast_sine(dtype: torch.dtype) -> bool:
    """Whether a kernel's Snake takes the GPU's approximate sine (``sin.approx``:
    one special-function instruction) instead of libdevice's exact ``sinf``.
    The exact one takes about 26 instructions, with a float64 slow path and a
    local array; inlined once per activated element, it was most of every
    fused kernel's machine code (docs/bench/RESULTS.md, section 35).
    Approximate where the products are: with TF32 or half-precision products;
    exact with float32 products, and through Triton's interpreter, which has
    no approximate sine."""
    return not interpreting() and (dtype != torch.float32 or dot_precision() == "tf32")


def built_on_first_use(build: Callable[[], Any]) -> Callable[[], Any]:
    """``build``'s kernel, built when first asked for (Triton is for the CUDA path
    and the tests), once for compiled and once for interpreted kernels."""
    kernels: dict[bool, Any] = {}

    def kernel() -> Any:
        interpret = interpreting()
        if interpret not in kernels:
            kernels[interpret] = build()
        return kernels[interpret]

    return kernel


def padded_channels(channels: int) -> int:
    """The power of two of at least 16 that ``channels`` are padded to."""
    return max(MIN_DOT, 1 << (channels - 1).bit_length())


def unit_launch(padded: int, activate: bool) -> tuple[int, int]:
    """The launch for ``padded`` channels, as (output samples a program, warps):
    the fastest of 32-128 samples x 4 or 8 warps at 256 slots on an H200, in
    TF32 (docs/bench/RESULTS.md, section 36)."""
    if padded >= 128:
        return 64, 8
    if padded >= 64:
        return (32, 4) if activate else (128, 4)
    return 64, 4


@dataclass(frozen=True)
class UnitWeights:
    """A residual unit's parameters laid out for the kernel, zero-padded to
    ``padded`` channels: ``conv1`` as ``[taps, out, in]``, each activation's
    ``alpha`` and ``1 / (alpha + 1e-9)`` in float32, ``conv2`` as ``[out, in]``;
    biases in float32."""

    device: torch.device
    dtype: torch.dtype
    channels: int
    padded: int
    dilation: int
    taps: int
    alpha1: torch.Tensor
    inverse1: torch.Tensor
    weight1: torch.Tensor
    bias1: torch.Tensor
    alpha2: torch.Tensor
    inverse2: torch.Tensor
    weight2: torch.Tensor
    bias2: torch.Tensor

    @classmethod
    def of(cls, unit: ResidualUnit) -> UnitWeights:
        conv1, conv2 = unit.conv1, unit.conv2
        channels, _, taps = conv1.weight.shape
        padded = padded_channels(channels)
        dtype, device = conv1.weight.dtype, conv1.weight.device
        with torch.no_grad():
            w1 = conv1.weight.new_zeros(taps, padded, padded)
            w1[:, :channels, :channels] = conv1.weight.detach().permute(2, 0, 1)
            w2 = conv2.weight.new_zeros(padded, padded)
            w2[:channels, :channels] = conv2.weight.detach()[:, :, 0]
            alpha1, inverse1 = snake_constants(unit.snake1.alpha, padded)
            alpha2, inverse2 = snake_constants(unit.snake2.alpha, padded)
            return cls(
                device=device,
                dtype=dtype,
                channels=channels,
                padded=padded,
                dilation=int(conv1.dilation[0]),
                taps=taps,
                alpha1=alpha1,
                inverse1=inverse1,
                weight1=w1.contiguous(),
                bias1=padded_vector(conv1.bias, padded, 0.0),
                alpha2=alpha2,
                inverse2=inverse2,
                weight2=w2.contiguous(),
                bias2=padded_vector(conv2.bias, padded, 0.0),
            )

    def matches(self, unit: ResidualUnit) -> bool:
        weight = unit.conv1.weight
        return self.device == weight.device and self.dtype == weight.dtype


def snake_constants(alpha: torch.Tensor, padded: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Snake's ``alpha`` and ``1 / (alpha + 1e-9)`` in float32, padded (padding
    channels: alpha 1 and inverse 0, so they stay zero)."""
    a = alpha.detach().reshape(-1).to(torch.float32)
    return padded_vector(a, padded, 1.0), padded_vector(torch.reciprocal(a + 1e-9), padded, 0.0)


def padded_vector(values: torch.Tensor | None, padded: int, fill: float) -> torch.Tensor:
    if values is None:
        raise ValueError("a fused layer needs its convolutions' biases")
    flat = values.detach().reshape(-1).to(torch.float32)
    out = flat.new_full((padded,), fill)
    out[: flat.shape[0]] = flat
    return out


def residual_reference(
    w: UnitWeights,
    full: torch.Tensor,
    skip_cache: torch.Tensor,
    x: torch.Tensor,
    keep: torch.Tensor,
) -> torch.Tensor:
    """:func:`fused_residual` in PyTorch (float32 arithmetic): ``full`` ``[B, C,
    history + n]`` (the first activation's output, history first), the skip's
    cache ``[B, C, lag]``, the new input ``x`` ``[B, C, n]``, ``keep``
    ``[B, head]`` (1 where a sample is at or after the utterance's start)."""
    c = w.channels
    f32 = torch.float32
    z = F.conv1d(
        full.to(f32),
        w.weight1[:, :c, :c].permute(1, 2, 0).to(f32),
        w.bias1[:c],
        dilation=w.dilation,
    )
    s = torch.sin(w.alpha2[:c, None] * z)
    u = z + s * s * w.inverse2[:c, None]
    y = torch.einsum("oi,bit->bot", w.weight2[:c, :c].to(f32), u) + w.bias2[:c, None]
    n = x.shape[-1]
    y = y + torch.cat([skip_cache, x], dim=-1)[..., :n].to(f32)
    head = keep.shape[-1]
    y[..., :head] *= keep[:, None, :].to(f32)
    return y.to(x.dtype)


def fused_residual(
    w: UnitWeights,
    source: torch.Tensor,
    skip_cache: torch.Tensor,
    x: torch.Tensor,
    keep: torch.Tensor,
    *,
    activate: bool = False,
    tile: int | None = None,
    warps: int | None = None,
) -> torch.Tensor:
    """A residual unit's output ``[B, C, n]`` as one kernel (see the module's
    notes; arguments as :func:`residual_reference`'s, ``source`` its ``full``).
    With ``activate``, ``source`` is only the first activation's history
    ``[B, C, history]`` and the kernel activates ``x`` itself. Products in TF32 when
    PyTorch's matrix products may use it, else in full float32; float16
    inputs multiply in float16 and accumulate in float32. ``tile`` (output
    samples a program, a power of two >= 16) and ``warps``: the launch, by
    default :func:`unit_launch`'s.

    The kernel is an opaque operator to ``torch.compile``: a compiled step
    calls it as it is, and a CUDA graph captures its launch."""
    _, channels, n = x.shape
    if channels != w.channels or source.shape[1] != channels or skip_cache.shape[1] != channels:
        raise ValueError(f"a unit of {w.channels} channels; got {tuple(x.shape)}")
    history = (w.taps - 1) * w.dilation
    wanted = history if activate else history + n
    if source.shape[-1] != wanted:
        raise ValueError(f"source must hold {wanted} samples; got {source.shape[-1]}")
    default_tile, default_warps = unit_launch(w.padded, activate)
    tile = default_tile if tile is None else tile
    if tile < MIN_DOT or tile & (tile - 1):
        raise ValueError(f"tile must be a power of two of at least {MIN_DOT}; got {tile}")
    warps = default_warps if warps is None else warps
    return _unit_op(
        source,
        skip_cache,
        x,
        keep,
        w.alpha1,
        w.inverse1,
        w.weight1,
        w.bias1,
        w.alpha2,
        w.inverse2,
        w.weight2,
        w.bias2,
        w.dilation,
        activate,
        tile,
        warps,
    )


@torch.library.custom_op("realtime_engine::fused_residual", mutates_args=())
def _unit_op(
    source: torch.Tensor,
    skip_cache: torch.Tensor,
    x: torch.Tensor,
    keep: torch.Tensor,
    alpha1: torch.Tensor,
    inverse1: torch.Tensor,
    weight1: torch.Tensor,
    bias1: torch.Tensor,
    alpha2: torch.Tensor,
    inverse2: torch.Tensor,
    weight2: torch.Tensor,
    bias2: torch.Tensor,
    dilation: int,
    activate: bool,
    tile: int,
    warps: int,
) -> torch.Tensor:
    batch, channels, n = x.shape
    y = x.new_empty(x.shape)  # contiguous, as the kernel writes it
    if batch == 0 or n == 0:
        return y
    source, skip_cache, x, keep = (dense_aligned(t) for t in (source, skip_cache, x, keep))
    ran = launch(
        _unit_kernel(),
        (batch, -(-n // tile)),
        source,
        skip_cache,
        x,
        keep,
        y,
        alpha1,
        inverse1,
        weight1,
        bias1,
        alpha2,
        inverse2,
        weight2,
        bias2,
        n,
        skip_cache.shape[-1],
        keep.shape[-1],
        CHANNELS=channels,
        PADDED=weight2.shape[0],
        TAPS=weight1.shape[0],
        DILATION=dilation,
        ACTIVATE=activate,
        TILE=tile,
        PRECISION=dot_precision(),
        FAST_SINE=fast_sine(x.dtype),
        num_warps=warps,
    )
    return y if ran else y.zero_()


@_unit_op.register_fake
def _(
    source: torch.Tensor, skip_cache: torch.Tensor, x: torch.Tensor, *rest: object
) -> torch.Tensor:
    return x.new_empty(x.shape)  # (the rest: the weights and the launch)


@built_on_first_use
def _unit_kernel() -> Any:
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice

    @triton.jit(do_not_specialize=["n", "lag", "head"])
    def unit_kernel(
        source_ptr,
        skip_ptr,
        x_ptr,
        keep_ptr,
        y_ptr,
        a1_ptr,
        inv1_ptr,
        w1_ptr,
        b1_ptr,
        a2_ptr,
        inv2_ptr,
        w2_ptr,
        b2_ptr,
        n,
        lag,
        head,
        CHANNELS: tl.constexpr,
        PADDED: tl.constexpr,
        TAPS: tl.constexpr,
        DILATION: tl.constexpr,
        ACTIVATE: tl.constexpr,
        TILE: tl.constexpr,
        PRECISION: tl.constexpr,
        FAST_SINE: tl.constexpr,
    ):
        slot = tl.program_id(0).to(tl.int64)
        t = tl.program_id(1) * TILE + tl.arange(0, TILE)
        c = tl.arange(0, PADDED)
        c_in = c < CHANNELS
        t_in = t < n
        both = c_in[:, None] & t_in[None, :]
        history = (TAPS - 1) * DILATION
        x_rows = x_ptr + slot * CHANNELS * n + c[:, None] * n
        if ACTIVATE:  # the source is the history alone
            source_rows = source_ptr + slot * CHANNELS * history + c[:, None] * history
            a1 = tl.load(a1_ptr + c)[:, None]
            inv1 = tl.load(inv1_ptr + c)[:, None]
        else:  # the history, then the new samples activated
            source_rows = source_ptr + slot * CHANNELS * (history + n) + c[:, None] * (history + n)
        square = c[:, None] * PADDED + c[None, :]  # [out, in] of a padded weight
        # (not tl.zeros: a jitted helper, which Triton imported without the
        # interpreter cannot interpret)
        acc = tl.full((PADDED, TILE), 0.0, tl.float32)
        for k in tl.static_range(TAPS):
            at = t[None, :] + k * DILATION  # in [history, new samples]
            if ACTIVATE:
                old = at < history
                kept = tl.load(source_rows + at, mask=both & old, other=0.0)
                raw = tl.load(x_rows + (at - history), mask=both & (at >= history), other=0.0)
                raw = raw.to(tl.float32)
                s1 = libdevice.fast_sinf(a1 * raw) if FAST_SINE else tl.sin(a1 * raw)
                new = raw + s1 * s1 * inv1
                # rounded as the activation's own output would be
                taps = tl.where(old, kept, new.to(kept.dtype))
            else:
                taps = tl.load(source_rows + at, mask=both, other=0.0)
            w1 = tl.load(w1_ptr + k * PADDED * PADDED + square)
            acc = tl.dot(w1, taps, acc, input_precision=PRECISION)
        z = acc + tl.load(b1_ptr + c)[:, None]
        if FAST_SINE:
            s = libdevice.fast_sinf(tl.load(a2_ptr + c)[:, None] * z)
        else:
            s = tl.sin(tl.load(a2_ptr + c)[:, None] * z)
        u = z + s * s * tl.load(inv2_ptr + c)[:, None]
        w2 = tl.load(w2_ptr + square)
        y = tl.dot(w2, u.to(w2.dtype), input_precision=PRECISION)
        y += tl.load(b2_ptr + c)[:, None]
        # the skip, delayed by ``lag``: its cache, then the new input
        cached = t < lag
        skip_rows = skip_ptr + slot * CHANNELS * lag + c[:, None] * lag
        y += tl.load(skip_rows + t[None, :], mask=both & cached[None, :], other=0.0).to(tl.float32)
        fresh = both & (t >= lag)[None, :]
        y += tl.load(x_rows + (t[None, :] - lag), mask=fresh, other=0.0).to(tl.float32)
        keep = tl.load(keep_ptr + slot * head + t, mask=t < head, other=1.0)
        y = y * keep.to(tl.float32)[None, :]
        out = y_ptr + slot * CHANNELS * n + c[:, None] * n + t[None, :]
        tl.store(out, y.to(y_ptr.dtype.element_ty), mask=both)

    return unit_kernel
