"""The codec's activation as one fused kernel (CUDA streaming path).

Snake, ``x + sin(alpha x)^2 / alpha``, is five elementwise kernels in eager
PyTorch, each a full pass over the activation: in the streaming codec step
at large batches those passes, not the convolutions, take most of the time.
:func:`fused_snake` is one Triton kernel (one read, one write); :func:`snake`
is the eager reference it must equal. The kernel does not specialise on
sizes, so it compiles once per dtype and never inside a graph capture that
followed a warm-up.
"""

from __future__ import annotations

from typing import Any

import torch

_BLOCK = 1024


def snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """Snake1d's expression (``alpha`` ``[1, C, 1]``)."""
    return x + torch.sin(alpha * x).pow(2) * torch.reciprocal(alpha + 1e-9)


_kernel: Any = None


def _snake_kernel() -> Any:
    """Built on first use: importing Triton is for the CUDA path only."""
    global _kernel
    if _kernel is not None:
        return _kernel
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["n", "length", "channels"])
    def kernel(x_ptr, alpha_ptr, y_ptr, n, length, channels, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = offs < n
        x = tl.load(x_ptr + offs, mask=inside, other=0.0).to(tl.float32)
        a = tl.load(alpha_ptr + (offs // length) % channels, mask=inside, other=1.0)
        a = a.to(tl.float32)
        s = tl.sin(a * x)
        y = x + s * s / (a + 1e-9)
        tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=inside)

    _kernel = kernel
    return kernel


def fused_snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """:func:`snake` of ``x`` ``[B, C, L]`` as one kernel (a new tensor)."""
    x = x.contiguous()
    y = torch.empty_like(x)
    n = x.numel()
    if n == 0:
        return y
    _, channels, length = x.shape
    a = alpha.reshape(-1).contiguous()
    grid = ((n + _BLOCK - 1) // _BLOCK,)
    _snake_kernel()[grid](x, a, y, n, length, channels, BLOCK=_BLOCK)
    return y
