"""What the fused-kernel benches share: their common flags, the codec they
time, CUDA-graph timing, the error against the layers, and the report."""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from bench.gpu.random_codec import random_codec
from realtime_engine.codec.decoder import CodecDecoder
from realtime_engine.codec.kernel_launch import build_launches, deferred_launches


def add_common_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--precision", default="tf32")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))


def bench_codec(args: argparse.Namespace) -> CodecDecoder:
    """The codec to time (tiny through Triton's interpreter with ``--tiny``); every
    layer and launch is a closure of the same code, so torch.compile may keep a
    graph for each."""
    torch._dynamo.config.cache_size_limit = 1024
    torch._dynamo.config.accumulated_cache_size_limit = 1024
    if args.tiny:
        os.environ["TRITON_INTERPRET"] = "1"
    return random_codec(args.precision, args.tiny)


def compiled_on_cuda(step: Callable[..., torch.Tensor], cuda: bool) -> Callable[..., torch.Tensor]:
    """``step`` compiled as the served codec step is (on CUDA), else as it is."""
    return torch.compile(step) if cuda else step


def build_first(
    steps: Iterable[Callable[..., torch.Tensor]], inputs: tuple[torch.Tensor, ...]
) -> None:
    """Call each step once with its fused kernels' launches deferred, then build
    every kernel they launch at once, on threads: one at a time, Triton's
    builds of a bench's launches took minutes on the H200's host."""
    with deferred_launches() as launches:
        for step in steps:
            step(*inputs)
    started = time.perf_counter()
    built = build_launches(launches)
    seconds = round(time.perf_counter() - started, 1)
    print(json.dumps({"built_kernels": built, "seconds": seconds}), flush=True)


def timed(
    step: Callable[..., torch.Tensor], inputs: tuple[torch.Tensor, ...], iters: int, cuda: bool
) -> tuple[float, torch.Tensor]:
    """Microseconds a replay of ``step(*inputs)`` captured as a CUDA graph, and its
    output (on the CPU: NaN, and the output of one call)."""

    def call() -> torch.Tensor:
        return step(*inputs)

    if not cuda:
        return float("nan"), call()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return 1000 * start.elapsed_time(end) / iters, out


def peak_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest difference relative to ``want``'s peak."""
    peak = want.double().abs().max().clamp_min(1e-12)
    return float((got.double() - want.double()).abs().max() / peak)


def write_report(args: argparse.Namespace, name: str, report: dict[str, Any]) -> None:
    print(json.dumps(report["summary"], indent=1))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(json.dumps(report, indent=1))
