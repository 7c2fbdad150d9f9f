"""Engine settings the talker needs from vLLM, set by the runner itself (no vLLM import)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from realtime_engine.format import DEFAULT_CODEC_KERNELS
from realtime_engine.talker.pacing import PacingPolicy
from realtime_engine.talker.vllm_protocol import CODEC_CONFIG_KEY, PACING_CONFIG_KEY

# vLLM's scheduler with playback pacing (``vllm_scheduler.py``; named, not
# imported: this module imports no vLLM).
PACED_SCHEDULER = "realtime_engine.talker.vllm_scheduler.paced_scheduler"

# Set (unless already set) before the engine starts; its processes inherit them.
ENGINE_ENV = {
    # The plugin's hooks (model state, custom sampler) exist only in Model Runner V2.
    "VLLM_USE_V2_MODEL_RUNNER": "1",
    # The talker samples with its own code sampler; vLLM's FlashInfer sampler is never used.
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    # No cuBLAS / cuBLASLt workspaces in the engine core. A captured graph keeps the
    # raw address of the workspace it was captured with, and PyTorch can free that
    # workspace while the graph lives (pytorch#193402); a split-K kernel replayed
    # into reused memory spins on its counters for good. The codec's graphs are
    # captured before vLLM's: on the H200 the engine hung at the first stream's end
    # with workspaces and ran clean without (docs/bench/RESULTS.md, section 12).
    "CUBLAS_WORKSPACE_CONFIG": ":0:0",
    "CUBLASLT_WORKSPACE_SIZE": "0",
}


def default_compilation_config() -> dict[str, Any]:
    """Full CUDA graphs for every batch, prefills included.

    vLLM's default graphs only whole decode batches and runs a prefill
    piecewise, launching each layer's attention from Python: on one H200 a
    16-token prefill of the 4B talker kept the GPU busy 3.4 ms of a 13.3 ms
    step (``docs/bench/RESULTS.md``). FlashAttention 3, the H100/H200 backend,
    runs mixed batches in one routine, so one graph per token count serves
    prefills too.
    """
    return {"cudagraph_mode": "FULL", "max_cudagraph_capture_size": 512}


def cuda_present() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def talker_engine_args(
    model_dir: str | Path,
    *,
    enforce_eager: bool,
    codec_precision: str,
    codec_batch: int,
    codec_kernels: str = DEFAULT_CODEC_KERNELS,
    **engine_kwargs: Any,
) -> dict[str, Any]:
    """``AsyncEngineArgs`` fields for the talker on ``model_dir``; sets :data:`ENGINE_ENV`.

    The talker's requirements are set here, not left to the caller's
    environment: Model Runner V2 (the plugin's hooks live there; the engine
    processes inherit the variable), prefix caching off (generated tokens are
    all ``<|audio|>``: shared prefixes would share KV computed with another
    request's codes), and, on CUDA, full CUDA graphs for every batch including
    prefills (:func:`default_compilation_config`). The engine core decodes
    audio in ``codec_precision``, up to ``codec_batch`` windows per call, its
    step run by ``codec_kernels``. With ``additional_config["higgs_pacing"]``
    set (checked here; off by default), the scheduler paces audio streams that
    are far ahead of their listeners (``pacing.py``).
    """
    for name, value in ENGINE_ENV.items():
        os.environ.setdefault(name, value)
    if not enforce_eager and cuda_present():
        engine_kwargs.setdefault("compilation_config", default_compilation_config())
    additional = dict(engine_kwargs.pop("additional_config", None) or {})
    # Codec options given in the talker options' own additional_config (those
    # with no flag of their own, such as "stream_priority") win over these.
    given = additional.get(CODEC_CONFIG_KEY) or {}
    if not isinstance(given, dict):
        raise ValueError(f"additional_config.{CODEC_CONFIG_KEY} must be an object; got {given!r}")
    additional[CODEC_CONFIG_KEY] = {
        "precision": codec_precision,
        "max_batch": codec_batch,
        "kernels": codec_kernels,
        **given,
    }
    if PacingPolicy.from_config(additional.get(PACING_CONFIG_KEY)).active:
        engine_kwargs.setdefault("scheduler_cls", PACED_SCHEDULER)
    return {
        "model": str(model_dir),
        "skip_tokenizer_init": True,
        "enforce_eager": enforce_eager,
        "enable_prefix_caching": False,
        "additional_config": additional,
        **engine_kwargs,
    }
