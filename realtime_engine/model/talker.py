"""The Higgs Audio v3 talker in PyTorch: Qwen3 body, text embedding, fused audio embedding/head.

Typical use by a runner (one request)::

    cache = model.new_cache()
    x = model.forward_embeds(model.embed_prompt(ids, ref_rows)[None], [cache])[0, -1]
    while ...:
        logits = model.audio_logits(x)                  # [8, 1026] float32
        row = ...                                       # sample + delay state machine
        x = model.forward_embeds(model.embed_audio_rows(row)[None, None], [cache])[0, -1]

Several requests step together with ``forward_embeds(embeds[B, 1, D], caches)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from realtime_engine.model.audio_head import audio_logits, fused_audio_embedding
from realtime_engine.model.config import HiggsTalkerConfig
from realtime_engine.model.prompts import PromptError, TalkerPrompt
from realtime_engine.model.qwen3 import KVCache, Qwen3Body


class HiggsTalker(nn.Module):
    """Qwen3 decoder whose audio positions are fed with summed codebook embeddings.

    Parameters (names as in ``state_dict()``):

    - ``text_embedding.weight`` ``[vocab, D]``
    - ``audio_embedding.weight`` ``[num_codebooks * codebook_vocab, D]``
    - ``audio_head.weight`` (same shape) only when the config does not tie the head
    - ``body.layers.N.*``, ``body.norm.weight``: the Qwen3 stack

    ``batch_invariant`` (default on): a request's hidden states and logits are
    bit-identical whether it steps alone or in a batch. CPU and GPU matrix
    kernels round differently for different row counts, so with it on a
    multi-request call computes each request separately (same kernels as a
    single-request call); turn it off to trade that guarantee for batched
    matrix products.
    """

    def __init__(self, config: HiggsTalkerConfig, *, batch_invariant: bool = True) -> None:
        super().__init__()
        self.config = config
        self.batch_invariant = batch_invariant
        self.text_embedding = nn.Embedding(config.vocab_size, config.hidden_size)
        self.audio_embedding = nn.Embedding(config.audio_rows, config.hidden_size)
        self.audio_head: nn.Linear | None = None
        if not config.tie_audio_head:
            self.audio_head = nn.Linear(config.hidden_size, config.audio_rows, bias=False)
        self.body = Qwen3Body(config)

    @property
    def device(self) -> torch.device:
        return self.text_embedding.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.text_embedding.weight.dtype

    @property
    def audio_head_weight(self) -> torch.Tensor:
        """The ``[num_codebooks * codebook_vocab, D]`` matrix the head multiplies by."""
        head = self.audio_head if self.audio_head is not None else self.audio_embedding
        return head.weight

    def new_cache(self, initial_capacity: int = 256) -> KVCache:
        """An empty KV cache for one request on this model's device and dtype."""
        return KVCache.for_config(
            self.config, device=self.device, dtype=self.dtype, initial_capacity=initial_capacity
        )

    def embed_audio_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Code rows ``LongTensor[..., 8]`` → summed codebook embeddings ``[..., D]``.

        Raises ``AudioCodeError`` for a code outside ``[0, codebook_vocab)``.
        """
        return fused_audio_embedding(
            self.audio_embedding.weight, rows.to(self.device), self.config.codebook_vocab
        )

    def embed_prompt(
        self, token_ids: torch.Tensor, ref_rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Prompt ids ``LongTensor[S]`` → input embeddings ``[S, D]``.

        Positions holding ``audio_token_id`` (-100) take the fused embeddings of
        ``ref_rows`` ``LongTensor[P, 8]`` in order; :class:`PromptError` when
        the number of placeholders differs from ``P``.
        """
        ids = token_ids.to(self.device).long()
        if ids.dim() != 1:
            raise PromptError(f"token_ids must be 1-D, got shape {tuple(ids.shape)}")
        placeholders = ids == self.config.audio_token_id
        count = int(placeholders.sum())
        given = 0 if ref_rows is None else int(ref_rows.shape[0])
        if count != given:
            raise PromptError(f"prompt has {count} audio placeholders but {given} reference rows")
        invalid = (ids < 0) & ~placeholders | (ids >= self.config.vocab_size)
        if bool(invalid.any()):
            bad = int(ids[invalid][0])
            raise PromptError(f"token id {bad} is outside the text vocabulary")
        embeds = self.text_embedding(torch.where(placeholders, torch.zeros_like(ids), ids))
        if ref_rows is not None and count:
            embeds[placeholders] = self.embed_audio_rows(ref_rows).to(embeds.dtype)
        return embeds

    def embed_talker_prompt(self, prompt: TalkerPrompt) -> torch.Tensor:
        """:meth:`embed_prompt` for a :class:`TalkerPrompt` (numpy reference rows)."""
        ids = torch.tensor(prompt.token_ids, dtype=torch.long)
        rows = (
            None if prompt.ref_rows is None else torch.as_tensor(prompt.ref_rows, dtype=torch.long)
        )
        return self.embed_prompt(ids, rows)

    def forward_embeds(self, embeds: torch.Tensor, caches: Sequence[KVCache]) -> torch.Tensor:
        """Hidden states ``[B, S, D]`` (after the final norm) for input embeddings ``[B, S, D]``.

        Request ``b`` attends over ``caches[b]`` and its new keys/values are
        appended there; caches may hold different lengths (each request keeps
        its own positions). Prefill: ``B = 1``, ``S`` = prompt length. Decode:
        ``S = 1`` for ``B`` requests.
        """
        if embeds.dim() != 3:
            raise ValueError(f"embeds must be [B, S, D], got shape {tuple(embeds.shape)}")
        if len(caches) != embeds.shape[0]:
            raise ValueError(f"{embeds.shape[0]} sequences but {len(caches)} caches")
        embeds = embeds.to(device=self.device, dtype=self.dtype)
        if self.batch_invariant and embeds.shape[0] > 1:
            return torch.cat([self.body(embeds[b : b + 1], [c]) for b, c in enumerate(caches)])
        return self.body(embeds, caches)

    def audio_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden ``[..., D]`` → float32 logits ``[..., num_codebooks, codebook_vocab]``."""
        return audio_logits(
            hidden, self.audio_head_weight, self.config.codebook_vocab, per_row=self.batch_invariant
        )
