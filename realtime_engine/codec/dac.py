"""DAC-style acoustic decoder (module names match the bundled checkpoint).

latent [B, C_in, T] -> conv1 k7 -> 5 upsampling blocks -> Snake -> conv2 k7
-> [B, 1, T * prod(strides)]. Every convolution is "same"-padded and every
transposed convolution yields exactly ``stride`` samples per input sample,
which is what makes sliding-window decoding line up with whole decoding.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from realtime_engine.codec.fused import snake
from realtime_engine.codec.layout import CodecDims


class Snake1d(nn.Module):
    """x + sin^2(alpha x) / alpha, per channel (periodic activation)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return snake(x, self.alpha)


class ResidualUnit(nn.Module):
    def __init__(self, channels: int, dilation: int) -> None:
        super().__init__()
        self.snake1 = Snake1d(channels)
        self.conv1 = nn.Conv1d(channels, channels, 7, dilation=dilation, padding=3 * dilation)
        self.snake2 = Snake1d(channels)
        self.conv2 = nn.Conv1d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.snake2(self.conv1(self.snake1(x))))


class DecoderBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.snake1 = Snake1d(cin)
        # k = 2s, padding ceil(s/2), output_padding s % 2: output length is
        # exactly s * input length for every stride.
        self.conv_t1 = nn.ConvTranspose1d(
            cin,
            cout,
            kernel_size=2 * stride,
            stride=stride,
            padding=math.ceil(stride / 2),
            output_padding=stride % 2,
        )
        self.res_unit1 = ResidualUnit(cout, 1)
        self.res_unit2 = ResidualUnit(cout, 3)
        self.res_unit3 = ResidualUnit(cout, 9)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_t1(self.snake1(x))
        return self.res_unit3(self.res_unit2(self.res_unit1(x)))


class DacDecoder(nn.Module):
    def __init__(self, dims: CodecDims) -> None:
        super().__init__()
        ch = dims.decoder_channels
        self.conv1 = nn.Conv1d(dims.acoustic_dim, ch[0], 7, padding=3)
        self.block = nn.ModuleList(
            DecoderBlock(ch[i], ch[i + 1], s) for i, s in enumerate(dims.strides)
        )
        self.snake1 = Snake1d(ch[-1])
        self.conv2 = nn.Conv1d(ch[-1], 1, 7, padding=3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        for block in self.block:
            x = block(x)
        # No final tanh: the released codec outputs the raw waveform.
        return self.conv2(self.snake1(x))
