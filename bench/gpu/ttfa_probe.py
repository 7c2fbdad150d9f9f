"""Where the talker's first rows go, one request at a time (GPU machine).

Runs the vLLM talker in-process (``VllmTalkerRunner``) on a Higgs v3
checkpoint and times, for sequential single requests: submission to the
first row, to row 7 (the first full frame), to row 10 (``latency``'s first
chunk) and to row 21 (``exact``'s), plus the mean gap between rows. Then,
optionally, the same request under vLLM's torch profiler, whose trace of
the engine core shows the host-side timeline of the first steps.

    python -m bench.gpu.ttfa_probe --model /root/higgs_v3_random --out $OUT

Writes ``ttfa_probe.json`` (and ``ttfa_trace.tar.gz`` with ``--profile``).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from bench.gpu.trace_steps import pack_traces

MARKS = (1, 7, 10, 21)


async def _one(runner: Any, request: Any) -> dict[str, float]:
    t0 = time.perf_counter()
    stamps: list[float] = []
    async for _row in runner.submit(request):
        stamps.append(time.perf_counter() - t0)
    out = {f"row{m}_ms": stamps[m - 1] * 1e3 for m in MARKS if len(stamps) >= m}
    if len(stamps) > 22:
        gaps = [b - a for a, b in itertools.pairwise(stamps[7:22])]
        out["gap_ms"] = statistics.mean(gaps) * 1e3
    out["rows"] = float(len(stamps))
    return out


def _summary(runs: list[dict[str, float]]) -> dict[str, float]:
    keys = sorted({k for r in runs for k in r})
    return {k: round(statistics.median(r[k] for r in runs if k in r), 2) for k in keys}


async def probe(args: argparse.Namespace) -> dict[str, Any]:
    from realtime_engine.model.prompts import build_zero_shot_prompt
    from realtime_engine.model.tokenizer import HiggsTokenizer
    from realtime_engine.talker.types import TalkerRequest, TalkerSampling
    from realtime_engine.talker.vllm_runner import VllmTalkerRunner

    trace_dir = Path(args.work) / "trace"
    extra: dict[str, Any] = json.loads(args.engine_args)
    if args.profile:
        trace_dir.mkdir(parents=True, exist_ok=True)
        extra["profiler_config"] = {
            "profiler": "torch",
            "torch_profiler_dir": str(trace_dir),
            "torch_profiler_with_stack": False,
        }
    t = time.perf_counter()
    runner = VllmTalkerRunner.from_model_dir(
        args.model, max_num_seqs=args.max_num_seqs, max_model_len=1024, **extra
    )
    init_s = time.perf_counter() - t
    tok = HiggsTokenizer.from_dir(args.model)
    prompt = build_zero_shot_prompt(tok, "Hello there, this is a short test of the first audio.")
    report: dict[str, Any] = {
        "init_s": round(init_s, 1),
        "prompt_tokens": len(prompt.token_ids),
        "engine_args": json.loads(args.engine_args),
    }
    try:
        runs = []
        for i in range(args.warmup + args.requests):
            req = TalkerRequest(f"p{i}", prompt, TalkerSampling(seed=i), fixed_rows=args.rows)
            r = await _one(runner, req)
            if i >= args.warmup:
                runs.append(r)
        report["sequential"] = _summary(runs)
        report["runs"] = runs
        print(json.dumps(report["sequential"]), flush=True)
        if args.profile:
            engine = runner._engine
            assert engine is not None  # the runner is open
            await engine.start_profile()
            for i in range(2):
                req = TalkerRequest(f"prof{i}", prompt, TalkerSampling(seed=i), fixed_rows=24)
                report.setdefault("profiled", []).append(await _one(runner, req))
            await engine.stop_profile()
    finally:
        await runner.close()
    if args.profile:
        pack_traces(trace_dir, Path(args.out) / "ttfa_trace.tar.gz")
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="/root/higgs_v3_random")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--work", default="/root/h200_work")
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--rows", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--requests", type=int, default=15)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument(
        "--engine-args",
        default="{}",
        help='extra vLLM engine arguments as JSON, e.g. \'{"quantization": "fp8"}\'',
    )
    args = ap.parse_args(argv)
    report = asyncio.run(probe(args))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "ttfa_probe.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
