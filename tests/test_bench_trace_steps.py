"""bench.gpu.trace_steps on a small trace written the way torch's profiler writes one."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from bench.gpu.trace_steps import main


def _trace(tmp_path: Path) -> Path:
    step = "execute_context_0(0)_generation_1(1)"
    events = [
        {"ph": "X", "cat": "gpu_user_annotation", "name": step, "ts": 0, "dur": 3500, "tid": 7},
        {"ph": "X", "cat": "gpu_user_annotation", "name": step, "ts": 4000, "dur": 3500, "tid": 7},
        {"ph": "X", "cat": "gpu_user_annotation", "name": step, "ts": 8000, "dur": 3500, "tid": 7},
        # host: one graph launch (the sampler) and one copy op launching a kernel
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaGraphLaunch",
            "ts": 100,
            "dur": 5,
            "tid": 1,
            "args": {"correlation": 1},
        },
        {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "ts": 200, "dur": 20, "tid": 1},
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "ts": 205,
            "dur": 5,
            "tid": 1,
            "args": {"correlation": 2},
        },
    ]
    # between the first two steps: three kernels of the graph and one of the copy
    for i, corr in enumerate([1, 1, 1, 2]):
        events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": f"k{i}",
                "ts": 3600 + 100 * i,
                "dur": 50,
                "tid": 7,
                "args": {"correlation": corr},
            }
        )
    path = tmp_path / "rank0.1.pt.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    return path


def test_each_step_gap_is_told_with_what_ran_in_it(tmp_path: Path) -> None:
    path = _trace(tmp_path)
    assert main([str(path)]) == 0
    text = (tmp_path / "rank0.steps.txt").read_text()
    lines = text.splitlines()
    assert lines[1].split(" | ")[1:5] == ["3500", "500", "4", "200.0"]
    assert "cudaGraphLaunch 3, aten::copy_ 1" in lines[1]
    assert lines[2].split(" | ")[2:4] == ["500", "0"]  # nothing ran in the second gap
    assert lines[-1] == "median over 2 steps: GPU 3500.0 µs, gap 500.0 µs, 2.0 kernels in the gap"


def test_packed_traces_are_read_back(tmp_path: Path) -> None:
    from bench.gpu.trace_steps import load_trace, pack_traces

    traces = tmp_path / "traces"
    traces.mkdir()
    big = [{"ph": "X", "cat": "kernel", "name": "k", "ts": i, "dur": 1} for i in range(3)]
    small = [{"ph": "X", "cat": "kernel", "name": "other", "ts": 0, "dur": 1}]
    for name, events in (("engine.pt.trace.json.gz", big), ("client.pt.trace.json.gz", small)):
        (traces / name).write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    tar = pack_traces(traces, tmp_path / "t.tar.gz")
    assert load_trace(tar) == big  # the largest trace: the engine core's
