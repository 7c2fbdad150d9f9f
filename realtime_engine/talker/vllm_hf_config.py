"""Transformers config class for ``model_type`` ``higgs_multimodal_qwen3``.

vLLM reads config.json through ``transformers.AutoConfig``, which does not
know this model type. The plugin registers this class so the checkpoint's
own config.json loads unchanged; the Qwen3 backbone is ``text_config``, which
is what vLLM's Qwen3 layers read through ``get_text_config()``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from transformers import PretrainedConfig, Qwen3Config

from realtime_engine.model.config import (
    ARCHITECTURE,
    AUDIO_PLACEHOLDER_ID,
    DEFAULT_ROPE_THETA,
    MODEL_TYPE,
    HiggsTalkerConfig,
)


def _text_config(raw: dict[str, Any] | Qwen3Config | None) -> Qwen3Config:
    if isinstance(raw, Qwen3Config):
        return raw
    fields = dict(raw or {})
    # Releases ship ``rope_theta: null``; the backbone was trained with 1e6.
    rope = fields.get("rope_parameters")
    if fields.get("rope_theta") is None and not (isinstance(rope, dict) and rope.get("rope_theta")):
        fields["rope_theta"] = DEFAULT_ROPE_THETA
    fields.pop("model_type", None)
    return Qwen3Config(**fields)


class HiggsMultimodalQwen3Config(PretrainedConfig):
    model_type = MODEL_TYPE
    sub_configs: ClassVar[dict[str, type[PretrainedConfig]]] = {"text_config": Qwen3Config}

    def __init__(
        self,
        text_config: dict[str, Any] | Qwen3Config | None = None,
        audio_encoder_config: dict[str, Any] | None = None,
        audio_token_id: int = AUDIO_PLACEHOLDER_ID,
        **kwargs: Any,
    ) -> None:
        self.text_config = _text_config(text_config)
        self.audio_encoder_config = dict(audio_encoder_config or {})
        self.audio_token_id = audio_token_id
        kwargs.setdefault("architectures", [ARCHITECTURE])
        # Speech-recognition fields of some releases are kept as plain attributes and ignored.
        super().__init__(**kwargs)

    def get_text_config(self, *args: Any, **kwargs: Any) -> Qwen3Config:
        return self.text_config

    def talker_config(self) -> HiggsTalkerConfig:
        return HiggsTalkerConfig.from_dict(
            {
                "model_type": MODEL_TYPE,
                "text_config": self.text_config.to_dict(),
                "audio_encoder_config": self.audio_encoder_config,
                "audio_token_id": self.audio_token_id,
            }
        )
