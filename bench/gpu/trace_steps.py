"""Where a decode step's GPU time goes between the forward passes, from a torch profiler trace.

Reads an engine-core trace (``*.pt.trace.json.gz``, vLLM's torch profiler,
``bench.gpu.ttfa_probe --profile``) and reports, for each model step (the
``execute_context_*`` ranges on the GPU timeline): its GPU span, the time
from its end to the next step's start, and what ran in between (kernels and
copies, by the CUDA call that launched them: ``cudaGraphLaunch`` for a
captured graph such as the code sampler's, or a host op's name). Prints a
table and writes it next to the trace as ``<trace>.steps.txt``.

    python -m bench.gpu.trace_steps docs/bench/h200/ttfa/trace_full_cudagraphs.tar.gz
"""

from __future__ import annotations

import argparse
import gzip
import io
import itertools
import json
import statistics
import sys
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any

_DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def load_trace(path: Path) -> list[dict[str, Any]]:
    """The trace events of a ``.json``, ``.json.gz`` or a ``.tar.gz`` holding one
    ``*.pt.trace.json.gz`` per process (the rank-0 engine core's, the largest, is read)."""
    if path.name.endswith(".tar.gz"):
        with tarfile.open(path) as tar:
            members = [m for m in tar.getmembers() if m.name.endswith(".pt.trace.json.gz")]
            if not members:
                raise ValueError(f"{path}: no *.pt.trace.json.gz inside")
            biggest = max(members, key=lambda m: m.size)
            raw = tar.extractfile(biggest)
            assert raw is not None
            data = gzip.decompress(raw.read())
    elif path.name.endswith(".gz"):
        data = gzip.decompress(path.read_bytes())
    else:
        data = path.read_bytes()
    events = json.load(io.BytesIO(data))["traceEvents"]
    return [e for e in events if e.get("ph") == "X"]


def pack_traces(trace_dir: Path, tar_path: Path) -> Path:
    """Every file under ``trace_dir`` (the profiler's per-process traces) into the
    ``.tar.gz`` that :func:`load_trace` reads."""
    with tarfile.open(tar_path, "w:gz") as tar:
        for f in sorted(trace_dir.rglob("*")):
            if f.is_file():
                tar.add(f, arcname=f.name)
    return tar_path


def step_gaps(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per step: name, GPU span (µs), gap to the next step (µs), and the device work
    in the gap by launching call."""
    steps = sorted(
        (
            e
            for e in events
            if e.get("cat") == "gpu_user_annotation"
            and str(e.get("name", "")).startswith("execute_context")
        ),
        key=lambda e: e["ts"],
    )
    device = sorted((e for e in events if e.get("cat") in _DEVICE_CATS), key=lambda e: e["ts"])
    launches = {
        e["args"].get("correlation"): e
        for e in events
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }
    host_ops = sorted((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: e["ts"])
    rows = []
    for step, after in itertools.pairwise(steps):
        end = step["ts"] + step["dur"]
        between = [e for e in device if end <= e["ts"] < after["ts"]]
        by_launch: Counter[str] = Counter()
        busy = 0.0
        for kernel in between:
            busy += kernel.get("dur", 0.0)
            launch = launches.get(kernel.get("args", {}).get("correlation"))
            by_launch[_launcher(launch, host_ops)] += 1
        rows.append(
            {
                "step": step["name"],
                "gpu_us": round(step["dur"], 1),
                "gap_us": round(after["ts"] - end, 1),
                "kernels_in_gap": len(between),
                "busy_in_gap_us": round(busy, 1),
                "by_launch": dict(by_launch.most_common()),
            }
        )
    return rows


def _launcher(launch: dict[str, Any] | None, host_ops: list[dict[str, Any]]) -> str:
    if launch is None:
        return "?"
    if launch["name"] == "cudaGraphLaunch":
        return "cudaGraphLaunch"
    inner = [
        op
        for op in host_ops
        if op["tid"] == launch["tid"] and op["ts"] <= launch["ts"] <= op["ts"] + op["dur"]
    ]
    return min(inner, key=lambda op: op["dur"])["name"] if inner else launch["name"]


def report(rows: list[dict[str, Any]]) -> str:
    lines = ["step | GPU µs | gap to next µs | kernels in gap | their GPU µs | launched by"]
    for r in rows:
        top = ", ".join(f"{k} {v}" for k, v in list(r["by_launch"].items())[:3])
        lines.append(
            f"{r['step']} | {r['gpu_us']} | {r['gap_us']} | {r['kernels_in_gap']} "
            f"| {r['busy_in_gap_us']} | {top}"
        )
    decode = [r for r in rows if "generation_1" in r["step"]] or rows
    if decode:
        gpu = statistics.median(r["gpu_us"] for r in decode)
        gap = statistics.median(r["gap_us"] for r in decode)
        kernels = statistics.median(r["kernels_in_gap"] for r in decode)
        lines.append(
            f"median over {len(decode)} steps: GPU {gpu} µs, gap {gap} µs, "
            f"{kernels} kernels in the gap"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("trace", type=Path)
    args = ap.parse_args(argv)
    text = report(step_gaps(load_trace(args.trace)))
    print(text, end="")
    args.trace.with_name(args.trace.name.split(".")[0] + ".steps.txt").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
