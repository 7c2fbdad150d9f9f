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

Writes ``load_trace.json``, ``load_trace.txt`` and ``load_trace.tar.gz`` to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from bench.gpu.trace_steps import load_trace, pack_traces, report, step_gaps
from bench.stats import percentile

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
    kernels, over the trace's device span."""
    device = [e for e in events if e.get("cat") in {"kernel", "gpu_memcpy", "gpu_memset"}]
    if not device:
        return {"span_us": 0.0, "busy_us": 0.0, "by_kind": {}, "by_stream": {}, "top": []}
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
    lines.append("costliest kernels (ms in all):")
    lines += [f"  {us / 1e3:8.1f}  {name}" for name, us in summary["top"]]
    return "\n".join(lines) + "\n"


def summarise(trace: Path) -> tuple[dict[str, Any], str]:
    """The device-time summary of a trace and its report (kinds, streams, steps)."""
    events = load_trace(trace)
    rows = step_gaps(events)
    summary = device_time(events)
    return summary, device_report(summary, len(rows) + 1) + "\n" + report(rows)


async def _stream_forever(
    runner: Any, prompt: Any, rows: int, stop: asyncio.Event, stats: dict[str, Any], n: int
) -> None:
    from realtime_engine.codec.presets import get_preset
    from realtime_engine.format import SAMPLE_RATE
    from realtime_engine.talker.types import TalkerRequest, TalkerSampling

    chunking = get_preset("exact")
    i = 0
    while not stop.is_set():
        req = TalkerRequest(f"s{n}-{i}", prompt, TalkerSampling(seed=i), fixed_rows=rows)
        i += 1
        t0 = time.perf_counter()
        first = None
        async for chunk in runner.speak(req, chunking):
            now = time.perf_counter()
            if first is None and chunk.pcm.size:
                first = now - t0
            if stats["measuring"]:
                stats["audio_s"] += chunk.pcm.size / SAMPLE_RATE
        if stats["measuring"] and first is not None:
            stats["first_chunk_s"].append(first)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from realtime_engine.model.prompts import build_zero_shot_prompt
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
    tok = HiggsTokenizer.from_dir(args.model)
    prompt = build_zero_shot_prompt(
        tok, "The quick brown fox jumps over the lazy dog, then naps in the warm afternoon sun."
    )
    stats: dict[str, Any] = {"measuring": False, "audio_s": 0.0, "first_chunk_s": []}
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(_stream_forever(runner, prompt, args.rows, stop, stats, n))
        for n in range(args.concurrency)
    ]
    out: dict[str, Any] = {
        "concurrency": args.concurrency,
        "rows": args.rows,
        "prompt_tokens": len(prompt.token_ids),
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
        firsts = stats["first_chunk_s"]
        if firsts:
            out["first_chunk_ms_p50"] = round(1e3 * percentile(firsts, 50), 1)
            out["first_chunk_ms_p90"] = round(1e3 * percentile(firsts, 90), 1)
        print(json.dumps(out), flush=True)
        engine = runner._engine
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
    summary, text = summarise(pack_traces(trace_dir, Path(args.out) / "load_trace.tar.gz"))
    out["device"] = summary
    (Path(args.out) / "load_trace.txt").write_text(text)
    print(text, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="/root/higgs_v3_random")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--work", default="/root/h200_work")
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--rows", type=int, default=257, help="rows per request (257: 10 s)")
    ap.add_argument("--warm-s", type=float, default=15.0)
    ap.add_argument("--measure-s", type=float, default=10.0)
    ap.add_argument("--profile-s", type=float, default=1.0)
    ap.add_argument("--engine-args", default="{}", help="extra vLLM engine arguments as JSON")
    ap.add_argument(
        "--from-trace",
        type=Path,
        help="only summarise this load_trace.tar.gz (no GPU): print the report",
    )
    args = ap.parse_args(argv)
    if args.from_trace is not None:
        print(summarise(args.from_trace)[1], end="")
        return 0
    Path(args.out).mkdir(parents=True, exist_ok=True)
    report_ = asyncio.run(run(args))
    (Path(args.out) / "load_trace.json").write_text(json.dumps(report_, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
