"""A profiler trace's device time by kind of kernel, per step.

Sorts every kernel of a Chrome trace (``torch.profiler``'s export, gzipped or
not) into a few kinds that say what to change next: cuDNN's layout
transposes, convolutions, matrix products by their arithmetic (TF32, half
precision, IEEE float32 FMA), Inductor's fused Triton kernels, eager
elementwise kernels, index copies. ``bench.gpu.codec_profile`` writes this
summary beside its trace.

    python -m bench.gpu.kernel_kinds codec_profile_256.json.gz --steps 5
    python -m bench.gpu.kernel_kinds codec_profile_256.json.gz --calls aten::cudnn_convolution

``--calls`` lists each call of a host operator within a step, in order, with
its device time by kind of kernel: the codec's layers are a chain, so the order
names the layer (RESULTS.md section 28 found cuDNN's float16 fallback so).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

# (kind, any of these substrings), tried in order: the first that matches names the kind
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("layout transpose", ("nchwToNhwc", "nhwcToNchw")),
    ("triton fused", ("triton_",)),
    ("conv (cuDNN/cutlass)", ("fprop", "dgrad", "convolve", "conv2d", "implicit_gemm")),
    (
        "gemm (half precision)",
        ("f16f16", "bf16bf16", "h1688", "h16816", "hgemm", "_f16_", "bf16", "_hsh_"),
    ),
    ("gemm (TF32)", ("tf32", "s1688gemm", "s16816gemm")),
    ("gemm (cuBLAS nvjet)", ("nvjet",)),
    ("gemm (fp32 FFMA)", ("sgemm", "f32f32_f32f32", "gemm")),
    ("index copy", ("index_copy", "index_elementwise", "gather", "scatter")),
    ("elementwise (eager)", ("elementwise_kernel", "CatArrayBatchedCopy")),
)
OTHER = "other"


def kind_of(kernel_name: str) -> str:
    """The kind of one kernel, by its name."""
    for kind, needles in KINDS:
        if any(needle in kernel_name for needle in needles):
            return kind
    return OTHER


def load_events(path: Path) -> list[dict[str, Any]]:
    """The trace's events (a Chrome trace, ``.json`` or ``.json.gz``)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return list(events)


def by_kind(events: list[dict[str, Any]], steps: int) -> dict[str, dict[str, float]]:
    """Per step: kernels and device microseconds by kind, largest first."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for event in events:
        if event.get("cat") != "kernel" or "dur" not in event:
            continue
        entry = totals[kind_of(event.get("name", ""))]
        entry[0] += 1
        entry[1] += float(event["dur"])
    ordered = sorted(totals.items(), key=lambda item: -item[1][1])
    return {
        kind: {"kernels_per_step": count / steps, "us_per_step": us / steps}
        for kind, (count, us) in ordered
    }


def kernels_by_call(events: list[dict[str, Any]], op: str, steps: int) -> list[dict[str, float]]:
    """For each call of the host operator ``op`` within a step, in the order a
    step makes them: its mean device microseconds over ``steps`` by kind of
    kernel (kernels matched through the launches made inside the call).
    Calls whose count is not a multiple of ``steps`` are an error."""
    calls = sorted((e for e in events if e.get("name") == op and "dur" in e), key=_start)
    if not calls or len(calls) % steps:
        raise ValueError(f"{len(calls)} calls of {op!r} do not split into {steps} steps")
    kernels = {
        e["args"].get("correlation"): e
        for e in events
        if e.get("cat") == "kernel" and isinstance(e.get("args"), dict)
    }
    launches = sorted(
        (e for e in events if e.get("cat") in _LAUNCHES and isinstance(e.get("args"), dict)),
        key=_start,
    )
    per_step = len(calls) // steps
    spent: list[dict[str, float]] = [defaultdict(float) for _ in range(per_step)]
    for n, call in enumerate(calls):
        begin, end = _start(call), _start(call) + float(call["dur"])
        for launch in launches:
            kernel = kernels.get(launch["args"].get("correlation"))
            if kernel is not None and begin <= _start(launch) <= end:
                spent[n % per_step][kind_of(kernel["name"])] += float(kernel["dur"]) / steps
    return [dict(s) for s in spent]


# where a trace records a kernel's launch: the runtime API, or the driver API
# (cuBLAS's and cuDNN's own kernels)
_LAUNCHES = ("cuda_runtime", "cuda_driver")


def _start(event: dict[str, Any]) -> float:
    return float(event["ts"])


def render(kinds: dict[str, dict[str, float]], title: str) -> str:
    """The summary as text: one line a kind, with its share of the step."""
    total_us = sum(k["us_per_step"] for k in kinds.values())
    total_kernels = sum(k["kernels_per_step"] for k in kinds.values())
    lines = [f"{title}: {total_kernels:.0f} kernels, {total_us:.0f} us a step"]
    for kind, k in kinds.items():
        share = 100 * k["us_per_step"] / total_us if total_us else 0.0
        lines.append(
            f"   {kind:<24} {k['us_per_step']:8.0f} us/step  {share:5.1f}%"
            f"  {k['kernels_per_step']:6.1f} kernels"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu.kernel_kinds", description=__doc__)
    ap.add_argument("trace", type=Path)
    ap.add_argument("--steps", type=int, default=5, help="steps the trace holds")
    ap.add_argument(
        "--calls",
        metavar="OP",
        help="instead: each call of this host operator in a step (aten::cudnn_convolution),"
        " its device time by kind of kernel",
    )
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error("--steps must be at least 1")
    events = load_events(args.trace)
    if args.calls is None:
        sys.stdout.write(render(by_kind(events, args.steps), args.trace.name))
        return 0
    for index, kinds in enumerate(kernels_by_call(events, args.calls, args.steps)):
        parts = ", ".join(f"{kind} {us:.1f}" for kind, us in kinds.items()) or "no kernel"
        sys.stdout.write(f"{index:3d} {sum(kinds.values()):8.1f} us  ({parts})\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
