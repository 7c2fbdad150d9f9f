"""vLLM plugin entry point (``vllm.general_plugins``: ``higgs_audio_v3``).

vLLM calls :func:`register` in every process it starts (serving process,
engine core, workers), so registration must be idempotent and cheap: it only
records names; the model module is imported lazily by vLLM when needed.
"""

from __future__ import annotations

import logging

from realtime_engine.logs import route_engine_logs
from realtime_engine.model.config import ARCHITECTURE, MODEL_TYPE
from realtime_engine.talker.vllm_engine_config import PACED_SCHEDULER

MODEL_CLASS_PATH = "realtime_engine.talker.vllm_model:HiggsMultimodalQwen3ForConditionalGeneration"
# The logger of vLLM's scheduler settings (vllm/config/scheduler.py).
VLLM_SCHEDULER_CONFIG_LOGGER = "vllm.config.scheduler"


class PacedSchedulerNotice(logging.Filter):
    """Drops vLLM's warning about a custom scheduler class when the class is the
    talker's paced one: it warns that a subclass of the synchronous scheduler
    disables asynchronous scheduling, and the paced scheduler is vLLM's
    asynchronous one whenever vLLM schedules asynchronously. The scheduler
    logs what pacing does instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            str(record.msg).startswith("Using custom scheduler class")
            and PACED_SCHEDULER in map(str, record.args or ())
        )


def register() -> None:
    # vLLM's processes set up only vLLM's loggers: the engine's records go the same way
    route_engine_logs("vllm")
    scheduler_config = logging.getLogger(VLLM_SCHEDULER_CONFIG_LOGGER)
    if not any(isinstance(f, PacedSchedulerNotice) for f in scheduler_config.filters):
        scheduler_config.addFilter(PacedSchedulerNotice())
    from transformers import AutoConfig
    from vllm import ModelRegistry

    from realtime_engine.talker.vllm_hf_config import HiggsMultimodalQwen3Config

    AutoConfig.register(MODEL_TYPE, HiggsMultimodalQwen3Config, exist_ok=True)
    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS_PATH)
