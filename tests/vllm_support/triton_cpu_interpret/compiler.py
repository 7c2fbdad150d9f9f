"""Compiler half of the placeholder backend: never used, interpreter mode runs kernels."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from triton.backends.compiler import BaseBackend, GPUTarget


class InterpretOnlyBackend(BaseBackend):
    @staticmethod
    def supports_target(target: GPUTarget) -> bool:
        return target.backend == "cpu"

    def hash(self) -> str:
        return "cpu-interpret-only"

    def parse_options(self, options: dict[str, Any]) -> object:
        raise RuntimeError("the cpu placeholder backend cannot compile; set TRITON_INTERPRET=1")

    def add_stages(self, stages: dict[str, Any], options: object, language: Any) -> None:
        raise RuntimeError("the cpu placeholder backend cannot compile; set TRITON_INTERPRET=1")

    def load_dialects(self, context: Any) -> None:
        return None

    def get_module_map(self) -> dict[str, ModuleType]:
        return {}
