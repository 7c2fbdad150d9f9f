"""Fused multi-codebook audio embedding and the audio head tied to it.

One matrix ``W_aud`` ``[num_codebooks * codebook_vocab, D]`` holds every
codebook, codebook-major: row ``q * codebook_vocab + code``. A row of codes
embeds as the sum of its codebooks' rows; the head is ``hidden @ W_aud.T``
viewed as ``[num_codebooks, codebook_vocab]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class AudioCodeError(ValueError):
    """A code row holds a value outside ``[0, codebook_vocab)`` or has the wrong width."""


def check_codes(codes: torch.Tensor, num_codebooks: int, codebook_vocab: int) -> None:
    """Raise :class:`AudioCodeError` unless ``codes`` is ``[..., num_codebooks]`` of valid codes.

    Without this an out-of-range code would silently read the next codebook's row.
    """
    if codes.shape[-1:] != (num_codebooks,):
        raise AudioCodeError(
            f"code rows must have {num_codebooks} codes, got shape {tuple(codes.shape)}"
        )
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= codebook_vocab):
        raise AudioCodeError(
            f"codes must lie in [0, {codebook_vocab}), "
            f"got min {int(codes.min())} max {int(codes.max())}"
        )


def fused_audio_embedding(
    weight: torch.Tensor, codes: torch.Tensor, codebook_vocab: int, *, check: bool = True
) -> torch.Tensor:
    """Embed code rows ``[..., N]`` → ``[..., D]``: ``sum_q weight[q * vocab + codes[..., q]]``.

    The codebooks are added one after the other in order, so a row's result
    does not depend on how many rows are embedded together.
    """
    num_codebooks = weight.shape[0] // codebook_vocab
    if check:
        check_codes(codes, num_codebooks, codebook_vocab)
    offsets = torch.arange(num_codebooks, device=codes.device, dtype=torch.long) * codebook_vocab
    rows = F.embedding(codes.long() + offsets, weight)  # [..., N, D]
    out = rows[..., 0, :]
    for q in range(1, num_codebooks):
        out = out + rows[..., q, :]
    return out


def audio_logits(
    hidden: torch.Tensor, weight: torch.Tensor, codebook_vocab: int, *, per_row: bool = False
) -> torch.Tensor:
    """Logits ``[..., N, codebook_vocab]`` in float32 from ``hidden`` ``[..., D]``.

    ``per_row`` computes each row with its own matrix product: CPU and GPU
    GEMM kernels may round differently for different row counts, and a
    request's logits must not depend on what else shares its batch.
    """
    num_codebooks = weight.shape[0] // codebook_vocab
    lead = hidden.shape[:-1]
    flat = hidden.reshape(-1, hidden.shape[-1])
    if per_row and flat.shape[0] > 1:
        logits = torch.cat([F.linear(flat[i : i + 1], weight) for i in range(flat.shape[0])])
    else:
        logits = F.linear(flat, weight)
    return logits.float().view(*lead, num_codebooks, codebook_vocab)
