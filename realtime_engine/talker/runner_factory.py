"""Which talker runner serves a checkpoint: vLLM (GPU) or the PyTorch reference."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def create_talker_runner(model_dir: str | Path, backend: str = "auto", **opts: Any) -> Any:
    """A talker runner for ``model_dir``: ``"vllm"``, ``"reference"``, or ``"auto"``.

    ``auto`` takes vLLM when it is importable and a CUDA device is present
    (on CPU the reference runner is the practical choice), else the reference
    runner. ``opts`` go to the chosen runner's constructor.
    """
    if backend not in ("auto", "vllm", "reference"):
        raise ValueError(f"unknown talker backend {backend!r}")
    if backend == "auto":
        backend = "vllm" if vllm_usable() else "reference"
        if backend == "reference":  # options meant for vLLM do not apply
            opts = {k: v for k, v in opts.items() if k in _REFERENCE_OPTIONS}
    if backend == "vllm":
        from realtime_engine.talker.vllm_runner import VllmTalkerRunner

        return VllmTalkerRunner.from_model_dir(model_dir, **opts)
    import torch

    from realtime_engine.model.loader import load_talker
    from realtime_engine.talker.reference_runner import ReferenceRunner

    device = torch.device(
        opts.pop("device", None) or ("cuda" if torch.cuda.is_available() else "cpu")
    )
    dtype = opts.pop("dtype", torch.bfloat16 if device.type == "cuda" else torch.float32)
    precision = opts.pop("codec_precision", "fp32")
    loaded = load_talker(model_dir, device=device, dtype=dtype)
    if loaded.codec is not None:
        loaded.codec.set_precision(precision)
    opts.setdefault("max_positions", loaded.config.max_position_embeddings)
    return ReferenceRunner(loaded.model, device, codec=loaded.codec, **opts)


_REFERENCE_OPTIONS = frozenset(
    {
        "device",
        "dtype",
        "max_batch",
        "queue_rows",
        "max_positions",
        "codec_precision",
        "codec_batch",
    }
)


def vllm_usable() -> bool:
    """vLLM is importable and a CUDA device is present."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return False
    from realtime_engine.talker.vllm_engine_config import cuda_present

    return cuda_present()
