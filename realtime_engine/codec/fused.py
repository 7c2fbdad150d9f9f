"""The codec's activation as one fused kernel (CUDA streaming path).

Snake, ``x + sin(alpha x)^2 / alpha``, is five elementwise kernels in eager
PyTorch, each a full pass over the activation: in the streaming codec step
at large batches those passes, not the convolutions, take most of the time.
:func:`fused_snake` compiles the same expression once (dynamic shapes) into
a single kernel; :func:`snake` is the eager reference it must equal.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """Snake1d's expression (``alpha`` ``[1, C, 1]``)."""
    return x + torch.sin(alpha * x).pow(2) * torch.reciprocal(alpha + 1e-9)


_compiled: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None


def fused_snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """:func:`snake` as one kernel. The first call of each new shape class
    compiles, so run every shape once before capturing a CUDA graph."""
    global _compiled
    if _compiled is None:
        _compiled = torch.compile(snake, dynamic=True, fullgraph=True)
    return _compiled(x, alpha)
