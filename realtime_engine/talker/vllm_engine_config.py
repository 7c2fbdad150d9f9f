"""Engine settings the talker needs from vLLM, set by the runner itself (no vLLM import)."""

from __future__ import annotations

from typing import Any

# Set (unless already set) before the engine starts; its processes inherit them.
ENGINE_ENV = {
    # The plugin's hooks (model state, custom sampler) exist only in Model Runner V2.
    "VLLM_USE_V2_MODEL_RUNNER": "1",
    # The talker samples with its own code sampler; vLLM's FlashInfer sampler is never used.
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
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
