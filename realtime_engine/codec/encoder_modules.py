"""Encoder-side codec modules: the DAC acoustic encoder, the semantic encoder
and the residual VQ's encode direction (argmin against the codebooks).

Module and parameter names match the bundled checkpoint
(``realtime_engine.codec.encoder_layout``), so a strict ``load_state_dict``
checks the layout.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from realtime_engine.codec.dac import ResidualUnit, Snake1d
from realtime_engine.codec.encoder_layout import SEMANTIC_BLOCKS, SEMANTIC_UNITS_PER_BLOCK
from realtime_engine.codec.layout import CodecDims


class DacEncoderBlock(nn.Module):
    """Three dilated residual units, Snake, then a strided conv (k = 2s) that doubles channels."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.res_unit1 = ResidualUnit(cin, 1)
        self.res_unit2 = ResidualUnit(cin, 3)
        self.res_unit3 = ResidualUnit(cin, 9)
        self.snake1 = Snake1d(cin)
        # padding ceil(s/2): an input that is a multiple of s gives exactly len/s frames.
        self.conv1 = nn.Conv1d(
            cin, cout, kernel_size=2 * stride, stride=stride, padding=math.ceil(stride / 2)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.res_unit3(self.res_unit2(self.res_unit1(x)))
        return self.conv1(self.snake1(x))


class DacEncoder(nn.Module):
    """wav [B, 1, L] -> [B, acoustic_dim, L / hop] (channels double per block)."""

    def __init__(self, dims: CodecDims) -> None:
        super().__init__()
        c = dims.encoder_channels
        self.conv1 = nn.Conv1d(1, c, 7, padding=3)
        self.block = nn.ModuleList(
            DacEncoderBlock(c * 2**i, c * 2 ** (i + 1), s) for i, s in enumerate(dims.strides)
        )
        top = c * 2 ** len(dims.strides)
        self.snake1 = Snake1d(top)
        self.conv2 = nn.Conv1d(top, dims.acoustic_dim, 3, padding=1)

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        x = self.conv1(wav)
        for block in self.block:
            x = block(x)
        return self.conv2(self.snake1(x))


class EluResidualUnit(nn.Module):
    """x + conv2(ELU(conv1(ELU(x)))): conv1 k3, conv2 k1, both without bias."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(dim, dim, 3, padding=1, bias=False)
        self.conv2 = nn.Conv1d(dim, dim, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        elu = nn.functional.elu
        return x + self.conv2(elu(self.conv1(elu(x))))


class SemanticEncoderBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.res_units = nn.ModuleList(
            EluResidualUnit(dim) for _ in range(SEMANTIC_UNITS_PER_BLOCK)
        )
        self.conv = nn.Conv1d(dim, dim, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for unit in self.res_units:
            x = unit(x)
        return self.conv(x)


class SemanticEncoder(nn.Module):
    """HuBERT features [B, D, T] -> [B, D, T]: conv k3 (no bias), then blocks of ELU units."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(dim, dim, 3, padding=1, bias=False)
        self.conv_blocks = nn.ModuleList(SemanticEncoderBlock(dim) for _ in range(SEMANTIC_BLOCKS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        for block in self.conv_blocks:
            x = block(x)
        return x


class EncodingCodebook(nn.Module):
    def __init__(self, codebook_size: int, codebook_dim: int) -> None:
        super().__init__()
        self.embed: torch.Tensor
        self.register_buffer("embed", torch.zeros(codebook_size, codebook_dim))


class EncodingQuantizer(nn.Module):
    def __init__(self, dims: CodecDims) -> None:
        super().__init__()
        self.codebook = EncodingCodebook(dims.codebook_size, dims.codebook_dim)
        self.project_in = nn.Linear(dims.latent_dim, dims.codebook_dim)
        self.project_out = nn.Linear(dims.codebook_dim, dims.latent_dim)


def nearest_code(z: torch.Tensor, embed: torch.Tensor) -> torch.Tensor:
    """argmin_k ||z_t - embed_k||^2 per row of ``z`` [T, D] (distances in float64,
    so near ties resolve as an exact computation would)."""
    z64, e64 = z.double(), embed.double()
    dist = (z64 * z64).sum(1, keepdim=True) - 2.0 * z64 @ e64.T + (e64 * e64).sum(1)[None]
    return dist.argmin(dim=1)


class EncodingRVQ(nn.Module):
    """Residual VQ, encode direction: latent [B, T, latent] -> codes [B, Q, T]."""

    def __init__(self, dims: CodecDims) -> None:
        super().__init__()
        self.quantizers = nn.ModuleList(EncodingQuantizer(dims) for _ in range(dims.num_quantizers))

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        b, t, d = latent.shape
        residual = latent.reshape(b * t, d)
        codes = []
        for layer in self.quantizers:
            assert isinstance(layer, EncodingQuantizer)
            embed = layer.codebook.embed
            idx = nearest_code(layer.project_in(residual), embed)
            residual = residual - layer.project_out(embed[idx])
            codes.append(idx.reshape(b, t))
        return torch.stack(codes, dim=1)
