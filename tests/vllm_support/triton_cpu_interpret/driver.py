"""Driver half of the placeholder backend.

Reports itself inactive so Triton never picks it for a real launch; vLLM only
checks that an entry named "cpu" exists.
"""

from __future__ import annotations

from typing import Any

import torch
from triton.backends.compiler import GPUTarget
from triton.backends.driver import DriverBase


class InterpretOnlyDriver(DriverBase):
    @classmethod
    def is_active(cls) -> bool:
        return False

    def map_python_to_cpp_type(self, ty: str) -> str:
        raise RuntimeError("the cpu placeholder driver cannot launch kernels")

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cpu", 0, 0)

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")

    def get_benchmarker(self) -> Any:
        raise RuntimeError("the cpu placeholder driver cannot benchmark")
