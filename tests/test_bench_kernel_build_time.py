"""bench.gpu.kernel_build_time's smoke check: the tiny codec's step recorded on
the CPU, its fused kernels built for the H200 (sm_90) by Triton's own compiler
and ptxas, no GPU needed: one row a distinct kernel, every kind of fused layer
among them, and the same kernels built again on threads. It runs as a process
of its own, as from the command line: Triton's language imported with its
interpreter on (as the kernel tests here do) cannot build for a GPU after."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="the kernels are Triton's (a vLLM dependency)")


def test_each_distinct_kernel_of_a_step_builds_for_hopper(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    argv = ["--tiny", "--threads", "2", "--out", str(tmp_path)]
    run = [sys.executable, "-m", "bench.gpu.kernel_build_time", *argv]
    subprocess.run(run, env=env, check=True, timeout=600, capture_output=True)
    report = json.loads((tmp_path / "kernel_build_time.json").read_text())
    summary, rows = report["summary"], report["rows"]
    assert summary["kernels"] == len(rows) == len({r["kernel"] for r in rows})
    # the step launches a kernel per fused layer; layers of one shape share one
    assert summary["launches_a_step"] > summary["kernels"]
    kinds = {r["kernel"].split("{")[0] for r in rows}
    assert kinds == {"unit_kernel", "upsample_kernel", "output_kernel"}
    assert all(r["seconds"] > 0 for r in rows)
    assert summary["one_at_a_time_s"] > 0 and summary["on_threads_s"] > 0
