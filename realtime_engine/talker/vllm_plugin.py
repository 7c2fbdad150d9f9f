"""vLLM plugin entry point (``vllm.general_plugins``: ``higgs_audio_v3``).

vLLM calls :func:`register` in every process it starts (serving process,
engine core, workers), so registration must be idempotent and cheap: it only
records names; the model module is imported lazily by vLLM when needed.
"""

from __future__ import annotations

from realtime_engine.logs import route_engine_logs
from realtime_engine.model.config import ARCHITECTURE, MODEL_TYPE

MODEL_CLASS_PATH = "realtime_engine.talker.vllm_model:HiggsMultimodalQwen3ForConditionalGeneration"


def register() -> None:
    # vLLM's processes set up only vLLM's loggers: the engine's records go the same way
    route_engine_logs("vllm")
    from transformers import AutoConfig
    from vllm import ModelRegistry

    from realtime_engine.talker.vllm_hf_config import HiggsMultimodalQwen3Config

    AutoConfig.register(MODEL_TYPE, HiggsMultimodalQwen3Config, exist_ok=True)
    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS_PATH)
