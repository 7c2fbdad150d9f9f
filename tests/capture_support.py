"""What a CUDA graph capture needs, checked without a GPU: every op of a step
takes tensors on the step's device only (run it on the meta device, where a
host read or a data-dependent shape raises too)."""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode
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


class HostToDeviceWrites(TorchFunctionMode):
    """Records the Python-level calls that copy host data to a non-CPU device and so
    make the host wait on CUDA: ``x[i] = <Python number>`` (a host scalar copied
    in), ``torch.tensor(..., device=...)``, and a blocking ``.to(device)`` /
    ``.copy_()`` from a CPU tensor. Run the code on the meta device: there the
    copies happen without data, and this mode still sees the calls."""

    def __init__(self) -> None:
        super().__init__()
        self.offenders: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if name == "__setitem__" and len(args) == 3:
            target, _, value = args
            if target.device.type != "cpu" and not isinstance(value, torch.Tensor):
                self.offenders.append(f"x[...] = {value!r} on {target.device}")
        elif func is torch.tensor and torch.device(kwargs.get("device") or "cpu").type != "cpu":
            self.offenders.append(f"torch.tensor(..., device={kwargs['device']})")
        elif name in ("to", "copy_") and args and isinstance(args[0], torch.Tensor):
            source = args[1] if name == "copy_" else args[0]
            if (
                isinstance(source, torch.Tensor)
                and source.device.type == "cpu"
                and not kwargs.get("non_blocking", False)
                and _target_device(name, args, kwargs).type != "cpu"
            ):
                self.offenders.append(f"blocking {name} of a host tensor")
        return func(*args, **kwargs)


def _target_device(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.device:
    if name == "copy_":
        return args[0].device
    for value in (*args[1:], kwargs.get("device")):
        if isinstance(value, torch.device | str):
            return torch.device(value)
    return args[0].device
