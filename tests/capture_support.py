"""What a CUDA graph capture needs, checked without a GPU: every op of a step
takes tensors on the step's device only (run it on the meta device, where a
host read or a data-dependent shape raises too)."""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode


class DeviceOnlyOps(TorchDispatchMode):
    """Records every op that receives a tensor off the step's device."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.offenders: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        leaves: list[Any] = pytree.tree_leaves((args, kwargs))
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor) and leaf.device != self.device:
                self.offenders.append(f"{func} got a {leaf.device} tensor {tuple(leaf.shape)}")
        return func(*args, **kwargs)
