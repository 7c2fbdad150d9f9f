"""Residual vector quantizer, decode direction only.

Each of the ``num_quantizers`` codebooks maps a code to a ``codebook_dim``
vector that ``project_out`` lifts to the latent size; the latent of a frame is
the sum over codebooks.
"""

from __future__ import annotations

import torch
from torch import nn

from realtime_engine.codec.layout import CodecDims


class Codebook(nn.Module):
    def __init__(self, codebook_size: int, codebook_dim: int) -> None:
        super().__init__()
        self.embed: torch.Tensor
        self.register_buffer("embed", torch.zeros(codebook_size, codebook_dim))

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return nn.functional.embedding(codes, self.embed)


class QuantizerLayer(nn.Module):
    def __init__(self, dims: CodecDims) -> None:
        super().__init__()
        self.codebook = Codebook(dims.codebook_size, dims.codebook_dim)
        self.project_out = nn.Linear(dims.codebook_dim, dims.latent_dim)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, T] -> latent contribution [B, T, latent]."""
        return self.project_out(self.codebook(codes))


class ResidualVQ(nn.Module):
    def __init__(self, dims: CodecDims) -> None:
        super().__init__()
        self.quantizers = nn.ModuleList(QuantizerLayer(dims) for _ in range(dims.num_quantizers))

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, Q, T] -> latent [B, T, latent] (channels last)."""
        out = self.quantizers[0](codes[:, 0])
        for q in range(1, len(self.quantizers)):
            out = out + self.quantizers[q](codes[:, q])
        return out
