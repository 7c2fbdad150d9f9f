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
start (float32 keeps them together for long). Each vLLM run also asks for the
greedy prompts' audio (``speak``, ``exact`` preset), decoded in the engine
core beside the talker, and reports its largest error against the offline
decode (one codec call) of the rows the same run produced, relative to the
peak: fp32 codec, so it must stay within 1e-5. Writes
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


def run_vllm(model_dir: Path, mode: str, dtype: str, rows: int) -> dict[str, Any]:
    from dataclasses import replace

    import torch

    from realtime_engine.codec.presets import get_preset
    from realtime_engine.codec.streaming import rows_to_frames
    from realtime_engine.model.loader import load_talker
    from realtime_engine.talker.vllm_runner import VllmTalkerRunner

    codec = load_talker(model_dir, device="cuda").codec
    assert codec is not None

    async def audio(runner: Any, request: Any) -> np.ndarray:
        chunks = [c.pcm async for c in runner.speak(request, get_preset("exact"))]
        return np.concatenate(chunks) if chunks else np.zeros(0, np.float32)

    async def go() -> dict[str, Any]:
        runner = VllmTalkerRunner.from_model_dir(
            model_dir,
            max_num_seqs=8,
            max_model_len=512,
            dtype=dtype,
            enforce_eager=(mode == "eager"),
            gpu_memory_utilization=0.3,
        )
        requests = _requests(model_dir, rows, sampled=True)
        greedy = [r for r in requests if r.request_id.startswith("q")]
        try:
            got = await asyncio.gather(
                *(audio(runner, replace(r, request_id=f"a{r.request_id}")) for r in greedy)
            )
        except Exception as e:
            await runner.close()
            return {"rows": [], "audio_error": f"{type(e).__name__}: {e}"}
        all_rows = await _run_all(runner, requests)
        errors = []
        for pcm, rows_of in zip(got, all_rows, strict=False):
            frames = rows_to_frames(np.array(rows_of, dtype=np.int64))
            whole = codec.decode(torch.from_numpy(frames[None]).cuda())[0, 0].cpu().numpy()
            same = pcm.shape == whole.shape
            peak = float(np.abs(whole).max()) if whole.size else 1.0
            errors.append(float(np.abs(pcm - whole).max()) / peak if same and pcm.size else None)
        return {"rows": all_rows, "audio_peak_error": errors}

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
            result: dict[str, Any] = {"rows": run_reference(Path(model_dir), args.dtype, args.rows)}
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
            one = json.loads(out.read_text()) if proc.returncode == 0 else None
            results[mode] = None if one is None else one["rows"]
            report[f"{mode}_ok"] = proc.returncode == 0
            if one is not None and "audio_peak_error" in one:
                report[f"{mode}_audio_peak_error"] = one["audio_peak_error"]
            elif one is not None and "audio_error" in one:
                report[f"{mode}_audio_error"] = one["audio_error"]
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
    audio_ok = all(
        e is not None and e <= 1e-5
        for mode in ("graphs", "eager")
        for e in report.get(f"{mode}_audio_peak_error", [None])
    )
    return 0 if all(report.get("graphs_equal_eager", [False])) and audio_ok else 1


if __name__ == "__main__":
    sys.exit(main())
