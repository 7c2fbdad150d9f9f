"""Higgs Audio v3 talker as a vLLM model: vLLM's Qwen3 decoder plus the fused audio embedding.

Audio positions (generated rows and voice-clone placeholders) are embedded
as the sum of their codebooks' rows of ``W_aud`` instead of a text
embedding. Which positions are audio, and their codes, come from two
fixed-address buffers that :class:`~realtime_engine.talker.vllm_state.HiggsModelState`
fills before every forward pass: with full CUDA graphs the replay ignores
forward arguments, so the buffers are the only way in. Forward uses
``torch.where`` only (no ``.item()``, no boolean indexing).

``compute_logits`` returns the audio logits ``hidden @ W_aud.T`` flattened to
``[n, num_codebooks * codebook_vocab]``; the text head is never evaluated:
the talker's only text output is the forced ``<|audio|>`` token.

The bundled codec is loaded here too (strictly, float32, on the model's
device) and kept outside the module tree, so vLLM's dtype and compilation
handling never touch it: the model state decodes audio with it beside the
talker. Its precision and batch come from ``additional_config["higgs_codec"]``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.model_executor.models.qwen3 import Qwen3Model

from realtime_engine.codec.layout import CODEC_PREFIX
from realtime_engine.format import DEFAULT_CODEC_PRECISION
from realtime_engine.model.audio_head import audio_logits, fused_audio_embedding
from realtime_engine.model.checkpoint import (
    AUDIO_EMBEDDING_KEY,
    AUDIO_HEAD_KEY,
    BODY_PREFIX,
    TEXT_EMBEDDING_KEY,
    TEXT_HEAD_KEY,
    TalkerKeyChecker,
    is_codec_key,
)
from realtime_engine.model.config import HiggsTalkerConfig
from realtime_engine.talker.vllm_protocol import CODEC_CONFIG_KEY

if TYPE_CHECKING:
    from realtime_engine.codec.decoder import CodecDecoder


class ModelRunnerV2Required(RuntimeError):
    """The talker's per-step hooks exist only in vLLM's Model Runner V2."""


class HiggsMultimodalQwen3ForConditionalGeneration(nn.Module):
    audio_codes: torch.Tensor
    audio_mask: torch.Tensor

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        if not vllm_config.use_v2_model_runner:
            raise ModelRunnerV2Required(
                "the Higgs talker needs vLLM's Model Runner V2: set VLLM_USE_V2_MODEL_RUNNER=1 "
                "(and make Triton available)"
            )
        extra = vllm_config.additional_config
        self.codec_options: dict[str, Any] = dict(
            (extra.get(CODEC_CONFIG_KEY) if isinstance(extra, dict) else None) or {}
        )
        self.codec: CodecDecoder | None = None
        hf_config = vllm_config.model_config.hf_config
        self.talker_config: HiggsTalkerConfig = hf_config.talker_config()
        cfg = self.talker_config
        self.model = Qwen3Model(
            vllm_config=vllm_config, prefix=f"{prefix}.model" if prefix else "model"
        )
        # Created under vLLM's default dtype/device for this model.
        self.audio_embedding = nn.Parameter(torch.empty(cfg.audio_rows, cfg.hidden_size))
        self.audio_head = (
            None
            if cfg.tie_audio_head
            else nn.Parameter(torch.empty(cfg.audio_rows, cfg.hidden_size))
        )
        max_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        self.register_buffer(
            "audio_codes",
            torch.zeros(max_tokens, cfg.num_codebooks, dtype=torch.int64),
            persistent=False,
        )
        self.register_buffer(
            "audio_mask", torch.zeros(max_tokens, dtype=torch.bool), persistent=False
        )

    @staticmethod
    def get_model_state_cls() -> type[Any]:
        from realtime_engine.talker.vllm_state import HiggsModelState

        return HiggsModelState

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        n = input_ids.shape[0]
        text = self.model.embed_input_ids(input_ids)
        audio = fused_audio_embedding(
            self.audio_embedding,
            self.audio_codes[:n],
            self.talker_config.codebook_vocab,
            check=False,
        )
        return torch.where(self.audio_mask[:n].unsqueeze(-1), audio.to(text.dtype), text)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        intermediate_tensors: Any = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.embed_input_ids(input_ids)
        return self.model(None, positions, intermediate_tensors, inputs_embeds=inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        weight = self.audio_embedding if self.audio_head is None else self.audio_head
        logits = audio_logits(hidden_states, weight, self.talker_config.codebook_vocab)
        return logits.reshape(hidden_states.shape[0], -1)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load the checkpoint's own key names, strictly (unknown or missing keys raise)."""
        checker = TalkerKeyChecker(self.talker_config)
        loaded: set[str] = set()
        codec_state: dict[str, torch.Tensor] = {}

        def backbone() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                checker.see(name, tuple(tensor.shape))
                if is_codec_key(name):
                    codec_state[name[len(CODEC_PREFIX) :]] = tensor
                    continue
                if name == TEXT_HEAD_KEY:
                    continue  # text logits are never needed
                if name == AUDIO_EMBEDDING_KEY:
                    self.audio_embedding.data.copy_(tensor)
                    loaded.add("audio_embedding")
                elif name == AUDIO_HEAD_KEY:
                    if self.audio_head is not None:
                        self.audio_head.data.copy_(tensor)
                        loaded.add("audio_head")
                elif name == TEXT_EMBEDDING_KEY:
                    yield "embed_tokens.weight", tensor
                elif name.startswith(BODY_PREFIX):
                    yield name[len(BODY_PREFIX) :], tensor

        loaded |= {f"model.{name}" for name in self.model.load_weights(backbone())}
        checker.finish()
        if codec_state:
            self._load_codec(codec_state)
        return loaded

    def _load_codec(self, state: dict[str, torch.Tensor]) -> None:
        from realtime_engine.codec.decoder import load_codec_decoder
        from realtime_engine.codec.half_check import set_checked_precision

        # vLLM loads weights under its own default dtype (bf16, say): the codec is
        # float32, and so is the float16 check's reference decode.
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float32)
        try:
            codec = load_codec_decoder(state, device=self.audio_embedding.device)
            precision = str(self.codec_options.get("precision", DEFAULT_CODEC_PRECISION))
            set_checked_precision(codec, precision)  # float16 only if it holds on these weights
        finally:
            torch.set_default_dtype(default)
        # Not a submodule: vLLM must not cast, shard or compile the codec.
        object.__setattr__(self, "codec", codec)
