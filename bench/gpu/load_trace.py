"""Where the GPU's time goes while the talker serves many streams (GPU machine).

Runs the vLLM talker in-process (``VllmTalkerRunner``, the served engine's
settings) with ``--concurrency`` closed-loop audio requests of a fixed length
in the ``exact`` preset, as the gateway sends them but without the gateway:
so its audio seconds per second are the engine's own ceiling. After a
warm-up it measures for ``--measure-s`` seconds, then records vLLM's torch
profiler for ``--profile-s`` seconds and reports the device time by kernel
kind, per step and in all, and the steps' spans and gaps
(:mod:`bench.gpu.trace_steps`).

    python -m bench.gpu.load_trace --model /root/higgs_v3_random --concurrency 256

The served workload is not one zero-shot prompt of a fixed length: a
context's segments after the first are voice-clone prompts on the
context's anchor (up to 200 frames), and with random weights a segment ends
where the talker samples its end. ``--clone-share F`` gives that share of
requests a clone prompt on a random ``--anchor-frames`` anchor, and
``--free-end`` lets requests end there (capped at ``--rows``), so the
engine alone can run the mix the gateway sends it (RESULTS.md section 15:
1.56 requests per context at 256 streams).

Writes ``load_trace.json``, ``load_trace.txt`` and ``load_trace.tar.gz`` to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.gpu.trace_steps import load_trace, pack_traces, report, step_gaps
from bench.stats import percentile

# The text every request speaks, and its clone prompts' reference transcript.
TEXT = "The quick brown fox jumps over the lazy dog, then naps in the warm afternoon sun."
ANCHOR_TEXT = "Every morning the old man walked along the river to watch the boats."
_GOLDEN = 0.6180339887498949


@dataclass(frozen=True)
class Workload:
    """What each closed-loop request asks for."""

    rows: int = 257
    clone_share: float = 0.0  # requests with a voice-clone prompt (later segments)
    anchor_frames: int = 200  # their reference length (a context's anchor is at most 200)
    free_end: bool = False  # end where the talker samples it, at most ``rows``

    def is_clone(self, stream: int, index: int) -> bool:
        """Whether request ``index`` of closed-loop ``stream`` gets the clone prompt:
        a low-discrepancy sequence, so any stretch of requests has about
        ``clone_share`` of them, spread across streams."""
        return ((stream * 7919 + index) * _GOLDEN) % 1.0 < self.clone_share

    def request(self, prompts: tuple[Any, Any], stream: int, index: int) -> Any:
        """The ``TalkerRequest`` for request ``index`` of ``stream``; ``prompts``:
        (zero-shot, clone)."""
        from realtime_engine.talker.types import TalkerRequest, TalkerSampling

        prompt = prompts[1] if self.is_clone(stream, index) else prompts[0]
        sampling = TalkerSampling(seed=index)
        request_id = f"s{stream}-{index}"
        if self.free_end:
            return TalkerRequest(request_id, prompt, sampling, max_new_tokens=self.rows)
        return TalkerRequest(request_id, prompt, sampling, fixed_rows=self.rows)


def workload_prompts(tokenizer: Any, workload: Workload, seed: int = 0) -> tuple[Any, Any]:
    """(zero-shot, clone) prompts of :data:`TEXT`; the clone prompt's anchor is
    ``anchor_frames`` random codes (what the talker would have generated)."""
    from realtime_engine.model.prompts import build_clone_prompt, build_zero_shot_prompt

    codes = np.random.default_rng(seed).integers(0, 1024, size=(workload.anchor_frames, 8))
    return (
        build_zero_shot_prompt(tokenizer, TEXT),
        build_clone_prompt(tokenizer, TEXT, codes, ANCHOR_TEXT),
    )


# Kernel kinds by name, first match wins (names as the profiler records them).
KERNEL_KINDS: tuple[tuple[str, str], ...] = (
    ("attention", r"flash|fmha|attn|paged"),
    ("gemm", r"gemm|cutlass|nvjet|xmma|sm90_|cublas|matmul|splitk"),
    ("codec conv", r"conv|cudnn|implicit|winograd|im2col|col2im"),
    ("norm / activation", r"norm|silu|gelu|act_and_mul|rotary|rope|snake"),
    ("sampling", r"sort|topk|top_k|multinomial|argmax|softmax|exponential|philox|cumsum"),
    ("copy / fill", r"memcpy|memset|copy|fill|cat|index|gather|scatter|take|where"),
    ("reduce / elementwise", r"reduce|elementwise|vectorized|unrolled|triton"),
)


def kernel_kind(name: str) -> str:
    low = name.lower()
    for kind, pattern in KERNEL_KINDS:
        if re.search(pattern, low):
            return kind
    return "other"


def device_time(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Device time (µs) by kernel kind, by CUDA stream (the codec runs on a
    stream of its own, so its share is its stream's) and the 20 costliest
    kernels, over the trace's device span; and the timeline (:func:`timeline`):
    whether the streams overlap and how long the device idles."""
    device = [e for e in events if e.get("cat") in {"kernel", "gpu_memcpy", "gpu_memset"}]
    if not device:
        return {
            "span_us": 0.0,
            "busy_us": 0.0,
            "by_kind": {},
            "by_stream": {},
            "top": [],
            "timeline": timeline([]),
        }
    start = min(e["ts"] for e in device)
    end = max(e["ts"] + e.get("dur", 0.0) for e in device)
    by_kind: dict[str, float] = {}
    by_stream: dict[str, float] = {}
    by_name: dict[str, float] = {}
    for e in device:
        dur = float(e.get("dur", 0.0))
        kind, name = kernel_kind(str(e.get("name", ""))), str(e.get("name", ""))[:90]
        stream = str(e.get("args", {}).get("stream", "?"))
        by_kind[kind] = by_kind.get(kind, 0.0) + dur
        by_stream[stream] = by_stream.get(stream, 0.0) + dur
        by_name[name] = by_name.get(name, 0.0) + dur
    busy = sum(by_kind.values())
    return {
        "span_us": round(end - start, 1),
        "busy_us": round(busy, 1),
        "by_kind": {k: round(v, 1) for k, v in _costliest(by_kind)},
        "by_stream": {k: round(v, 1) for k, v in _costliest(by_stream)},
        "top": [(k, round(v, 1)) for k, v in _costliest(by_name)[:20]],
        "timeline": timeline(device),
    }


Interval = tuple[float, float]


def _merged(intervals: list[Interval]) -> list[Interval]:
    """Intervals merged where they touch or overlap, in time order."""
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _length(intervals: list[Interval]) -> float:
    return sum(end - start for start, end in intervals)


def _shared(a: list[Interval], b: list[Interval]) -> float:
    """Time two merged interval lists have in common."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def timeline(device: list[dict[str, Any]]) -> dict[str, Any]:
    """When the device worked, not just how much: ``busy_us``, the time any
    stream ran a kernel or copy; ``idle_us``, the span's rest (the device
    waiting for the host); and per stream (busiest first) its ``busy_us`` and
    ``hidden_us``, the part of it run while another stream was busy too. A
    codec stream whose time is all hidden costs the talker nothing but
    shared SMs; one with nothing hidden adds its time to every step."""
    by_stream: dict[str, list[Interval]] = {}
    for e in device:
        start = float(e["ts"])
        stream = str(e.get("args", {}).get("stream", "?"))
        by_stream.setdefault(stream, []).append((start, start + float(e.get("dur", 0.0))))
    if not by_stream:
        return {"span_us": 0.0, "busy_us": 0.0, "idle_us": 0.0, "streams": []}
    merged = {stream: _merged(spans) for stream, spans in by_stream.items()}
    everything = _merged([span for spans in merged.values() for span in spans])
    span = everything[-1][1] - everything[0][0]
    busy = _length(everything)
    streams = []
    for stream, spans in sorted(merged.items(), key=lambda kv: -_length(kv[1])):
        others = _merged([s for name, ss in merged.items() if name != stream for s in ss])
        streams.append(
            {
                "stream": stream,
                "busy_us": round(_length(spans), 1),
                "hidden_us": round(_shared(spans, others), 1),
            }
        )
    return {
        "span_us": round(span, 1),
        "busy_us": round(busy, 1),
        "idle_us": round(span - busy, 1),
        "streams": streams,
    }


def _costliest(totals: dict[str, float]) -> list[tuple[str, float]]:
    return sorted(totals.items(), key=lambda kv: -kv[1])


def device_report(summary: dict[str, Any], steps: int) -> str:
    span, busy = summary["span_us"], summary["busy_us"]
    lines = [
        f"device span {span / 1e3:.1f} ms, kernels {busy / 1e3:.1f} ms "
        f"(summed over streams, so it can pass the span), {steps} model steps",
        "kind | ms in all | ms per step | share",
    ]
    for kind, us in summary["by_kind"].items():
        share = us / busy if busy else 0.0
        lines.append(f"{kind} | {us / 1e3:.1f} | {us / 1e3 / max(steps, 1):.2f} | {share:.1%}")
    lines.append("CUDA stream | ms in all | share of kernel time | kernel time / span")
    for stream, us in summary.get("by_stream", {}).items():
        share = us / busy if busy else 0.0
        lines.append(f"{stream} | {us / 1e3:.1f} | {share:.1%} | {us / span if span else 0.0:.0%}")
    lines += timeline_report(summary.get("timeline"))
    lines.append("costliest kernels (ms in all):")
    lines += [f"  {us / 1e3:8.1f}  {name}" for name, us in summary["top"]]
    return "\n".join(lines) + "\n"


def timeline_report(line: dict[str, Any] | None) -> list[str]:
    """The timeline's lines, as shares of the span (a served trace's step ranges
    overlap under async scheduling, so they are no divisor): the device busy
    and idle, and each stream's time run beside another's."""
    if not line or not line["span_us"]:
        return []
    span = line["span_us"]
    lines = [
        f"device busy (any stream) {line['busy_us'] / 1e3:.1f} ms = {line['busy_us'] / span:.0%} "
        f"of the span; idle {line['idle_us'] / 1e3:.1f} ms = {line['idle_us'] / span:.0%}",
        "CUDA stream | busy ms | share of the span | beside another stream, ms | share hidden",
    ]
    for row in line["streams"]:
        busy, hidden = row["busy_us"], row["hidden_us"]
        lines.append(
            f"{row['stream']} | {busy / 1e3:.1f} | {busy / span:.0%} | {hidden / 1e3:.1f} | "
            f"{hidden / busy if busy else 0.0:.0%}"
        )
    return lines


def summarise(trace: Path) -> tuple[dict[str, Any], str]:
    """The device-time summary of a trace and its report (kinds, streams, steps)."""
    events = load_trace(trace)
    rows = step_gaps(events)
    summary = device_time(events)
    return summary, device_report(summary, len(rows) + 1) + "\n" + report(rows)


def report_traces(trace_dir: Path, out: Path) -> dict[str, Any]:
    """Pack the profiler's traces in ``trace_dir`` into ``out/load_trace.tar.gz``,
    write and print their report (``out/load_trace.txt``); the device-time summary."""
    summary, text = summarise(pack_traces(trace_dir, out / "load_trace.tar.gz"))
    (out / "load_trace.txt").write_text(text)
    print(text, flush=True)
    return summary


async def _stream_forever(
    runner: Any,
    prompts: tuple[Any, Any],
    workload: Workload,
    stop: asyncio.Event,
    stats: dict[str, Any],
    n: int,
) -> None:
    from realtime_engine.codec.presets import get_preset
    from realtime_engine.format import SAMPLE_RATE

    chunking = get_preset("exact")
    i = 0
    while not stop.is_set():
        req = workload.request(prompts, n, i)
        i += 1
        t0 = time.perf_counter()
        first = None
        async for chunk in runner.speak(req, chunking):
            now = time.perf_counter()
            if first is None and chunk.pcm.size:
                first = now - t0
            if stats["measuring"]:
                stats["audio_s"] += chunk.pcm.size / SAMPLE_RATE
        if stats["measuring"]:
            stats["requests"] += 1
            if first is not None:
                stats["first_chunk_s"].append(first)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from realtime_engine.model.tokenizer import HiggsTokenizer
    from realtime_engine.talker.vllm_runner import VllmTalkerRunner

    trace_dir = Path(args.work) / "load_trace"
    trace_dir.mkdir(parents=True, exist_ok=True)
    extra: dict[str, Any] = json.loads(args.engine_args)
    extra["profiler_config"] = {
        "profiler": "torch",
        "torch_profiler_dir": str(trace_dir),
        "torch_profiler_with_stack": False,
    }
    runner = VllmTalkerRunner.from_model_dir(args.model, **extra)
    workload = Workload(args.rows, args.clone_share, args.anchor_frames, args.free_end)
    prompts = workload_prompts(HiggsTokenizer.from_dir(args.model), workload)
    stats: dict[str, Any] = {"measuring": False, "audio_s": 0.0, "first_chunk_s": [], "requests": 0}
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(_stream_forever(runner, prompts, workload, stop, stats, n))
        for n in range(args.concurrency)
    ]
    out: dict[str, Any] = {
        "concurrency": args.concurrency,
        "rows": args.rows,
        "workload": asdict(workload),
        "prompt_tokens": len(prompts[0].token_ids),
        "clone_prompt_tokens": len(prompts[1].token_ids),
        "engine_args": json.loads(args.engine_args),
    }
    try:
        await asyncio.sleep(args.warm_s)
        print("measuring", flush=True)  # run_h200.sh profiles the engine core from here
        stats["measuring"] = True
        t = time.perf_counter()
        await asyncio.sleep(args.measure_s)
        stats["measuring"] = False
        elapsed = time.perf_counter() - t
        out["audio_s_per_s"] = round(stats["audio_s"] / elapsed, 1)
        out["requests_done_per_s"] = round(stats["requests"] / elapsed, 1)
        firsts = stats["first_chunk_s"]
        if firsts:
            out["first_chunk_ms_p50"] = round(1e3 * percentile(firsts, 50), 1)
            out["first_chunk_ms_p90"] = round(1e3 * percentile(firsts, 90), 1)
        print(json.dumps(out), flush=True)
        engine = runner._engine
        assert engine is not None  # the runner is open
        await engine.start_profile()
        await asyncio.sleep(args.profile_s)
        await engine.stop_profile()
    finally:
        stop.set()
        await asyncio.sleep(0)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await runner.close()
    out["device"] = report_traces(trace_dir, Path(args.out))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="/root/higgs_v3_random")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--work", default="/root/h200_work")
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--rows", type=int, default=257, help="rows per request (257: 10 s)")
    ap.add_argument(
        "--clone-share",
        type=float,
        default=0.0,
        help="share of requests with a voice-clone prompt (served at 256 streams: about 0.36)",
    )
    ap.add_argument("--anchor-frames", type=int, default=200, help="their reference, in frames")
    ap.add_argument(
        "--free-end",
        action="store_true",
        help="requests end where the talker samples it (at most --rows), as served",
    )
    ap.add_argument("--warm-s", type=float, default=15.0)
    ap.add_argument("--measure-s", type=float, default=10.0)
    ap.add_argument("--profile-s", type=float, default=1.0)
    ap.add_argument("--engine-args", default="{}", help="extra vLLM engine arguments as JSON")
    ap.add_argument(
        "--from-trace",
        type=Path,
        help="only summarise this load_trace.tar.gz (no GPU): print the report",
    )
    ap.add_argument(
        "--from-trace-dir",
        type=Path,
        help="pack the profiler's traces in this folder (a served engine's, taken with "
        "SIGUSR2) into --out/load_trace.tar.gz and summarise them (no GPU)",
    )
    args = ap.parse_args(argv)
    if args.from_trace is not None:
        print(summarise(args.from_trace)[1], end="")
        return 0
    if args.from_trace_dir is not None:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        report_traces(args.from_trace_dir, Path(args.out))
        return 0
    Path(args.out).mkdir(parents=True, exist_ok=True)
    report_ = asyncio.run(run(args))
    (Path(args.out) / "load_trace.json").write_text(json.dumps(report_, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
