"""GPU check of the vLLM talker's row feedback under CUDA graphs, on the tiny checkpoint.

Greedy rows of the same prompts, batched, from three runs:

- vLLM with CUDA graphs (the decode step replays a captured graph, so the
  previous row can only come in through the model's fixed buffers);
- vLLM in eager mode;
- the PyTorch reference runner on the same GPU.

Graphs and eager use the same kernels, so their rows must be identical; with
graphs the code sampler also replays a captured graph, so the vLLM runs add
seeded sampled requests (release settings) that must match too. The
reference uses different kernels; greedy rows should agree at least at the
start (float32 keeps them together for long). Writes
``$OUT/talker_vllm_check.json``.

    python -m bench.talker_vllm_check [--dtype float32] [--rows 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from bench.talker_step import REPO, plugin_path

TEXTS = ("hello world", "the quick brown fox jumps over the lazy dog", "thank you", "good morning")


def _requests(model_dir: Path, rows: int, sampled: bool) -> list[Any]:
    from realtime_engine.model.prompts import build_clone_prompt, build_zero_shot_prompt
    from realtime_engine.model.tokenizer import HiggsTokenizer
    from realtime_engine.talker.types import TalkerRequest, TalkerSampling

    tok = HiggsTokenizer.from_dir(model_dir)
    ref = np.random.default_rng(3).integers(0, 1024, size=(12, 8))
    prompts = [build_zero_shot_prompt(tok, t) for t in TEXTS]
    prompts.append(build_clone_prompt(tok, "a cloned voice", ref, ref_text="hello"))
    greedy = TalkerSampling(temperature=0.0)
    out = [TalkerRequest(f"q{i}", p, greedy, max_new_tokens=rows) for i, p in enumerate(prompts)]
    if sampled:
        # The release settings with fixed seeds: the noise is a function of (seed, step),
        # so graphs and eager must draw the same codes.
        for i, p in enumerate(prompts):
            params = TalkerSampling(seed=1000 + i)
            out.append(TalkerRequest(f"s{i}", p, params, max_new_tokens=rows))
    return out


async def _run_all(runner: Any, requests: list[Any]) -> list[list[list[int]]]:
    async def one(req: Any) -> list[list[int]]:
        return [row.tolist() async for row in runner.submit(req)]

    try:
        return list(await asyncio.gather(*(one(r) for r in requests)))
    finally:
        await runner.close()


def run_vllm(model_dir: Path, mode: str, dtype: str, rows: int) -> list[list[list[int]]]:
    from realtime_engine.talker.vllm_runner import VllmTalkerRunner

    async def go() -> list[list[list[int]]]:
        runner = VllmTalkerRunner.from_model_dir(
            model_dir,
            max_num_seqs=8,
            max_model_len=512,
            dtype=dtype,
            enforce_eager=(mode == "eager"),
            gpu_memory_utilization=0.3,
        )
        return await _run_all(runner, _requests(model_dir, rows, sampled=True))

    return asyncio.run(go())


def run_reference(model_dir: Path, dtype: str, rows: int) -> list[list[list[int]]]:
    import torch

    from realtime_engine.model.loader import load_talker
    from realtime_engine.talker.reference_runner import ReferenceRunner

    tiny = load_talker(model_dir, device="cuda", dtype=getattr(torch, dtype), with_codec=False)

    async def go() -> list[list[list[int]]]:
        requests = _requests(model_dir, rows, sampled=False)
        return await _run_all(ReferenceRunner(tiny.model, "cuda"), requests)

    return asyncio.run(go())


def common_prefix(a: list[list[int]], b: list[list[int]]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--_one", nargs=3, metavar=("MODE", "DIR", "JSON"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._one:
        mode, model_dir, out_json = args._one
        if mode == "reference":
            result = run_reference(Path(model_dir), args.dtype, args.rows)
        else:
            result = run_vllm(Path(model_dir), mode, args.dtype, args.rows)
        Path(out_json).write_text(json.dumps(result))
        return 0

    from realtime_engine.model.tiny import write_tiny_checkpoint

    report: dict[str, Any] = {"dtype": args.dtype, "rows": args.rows}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model_dir = write_tiny_checkpoint(root / "tiny")
        env = dict(os.environ)
        env.setdefault("VLLM_USE_V2_MODEL_RUNNER", "1")
        env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
        paths = [str(plugin_path(root)), str(REPO), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        results: dict[str, Any] = {}
        for mode in ("graphs", "eager", "reference"):
            out = root / f"{mode}.json"
            cmd = [sys.executable, "-m", "bench.talker_vllm_check", "--dtype", args.dtype]
            cmd += ["--rows", str(args.rows), "--_one", mode, str(model_dir), str(out)]
            proc = subprocess.run(cmd, env=env, cwd=REPO)
            results[mode] = json.loads(out.read_text()) if proc.returncode == 0 else None
            report[f"{mode}_ok"] = proc.returncode == 0
    graphs, eager, ref = results["graphs"], results["eager"], results["reference"]
    if graphs is not None and eager is not None:
        report["graphs_equal_eager"] = [g == e for g, e in zip(graphs, eager, strict=True)]
    if graphs is not None and ref is not None:
        report["graphs_vs_reference_common_rows"] = [
            common_prefix(g, r) for g, r in zip(graphs, ref, strict=False)
        ]
        report["row_counts"] = [len(g) for g in graphs]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "talker_vllm_check.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0 if all(report.get("graphs_equal_eager", [False])) else 1


if __name__ == "__main__":
    sys.exit(main())
