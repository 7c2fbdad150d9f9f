"""A profiler trace's device time by kind of kernel, per step.

Sorts every kernel of a Chrome trace (``torch.profiler``'s export, gzipped or
not) into a few kinds that say what to change next: cuDNN's layout
transposes, convolutions, matrix products by their arithmetic (TF32, half
precision, IEEE float32 FMA), Inductor's fused Triton kernels, eager
elementwise kernels, index copies. ``bench.gpu.codec_profile`` writes this
summary beside its trace.

    python -m bench.gpu.kernel_kinds codec_profile_256.json.gz --steps 5
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
    ("gemm (half precision)", ("f16f16", "bf16bf16", "h1688", "h16816", "hgemm", "_f16_", "bf16")),
    ("gemm (TF32)", ("tf32", "s1688gemm", "s16816gemm")),
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
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error("--steps must be at least 1")
    kinds = by_kind(load_events(args.trace), args.steps)
    sys.stdout.write(render(kinds, args.trace.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
