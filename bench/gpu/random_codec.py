"""The codec the GPU benches run: real size with random weights on CUDA, tiny on the CPU."""

from __future__ import annotations

import torch

from realtime_engine.codec.decoder import CodecDecoder
from realtime_engine.codec.layout import CodecDims


def random_codec(precision: str, tiny: bool) -> CodecDecoder:
    """A codec with random weights in ``precision``: the real-size one on CUDA when
    there is a GPU and ``tiny`` is not asked for, else the tiny one on the CPU
    (smoke checks of the scripts)."""
    cuda = torch.cuda.is_available() and not tiny
    dims = CodecDims.tiny() if not cuda else CodecDims.higgs_v3()
    codec = CodecDecoder(dims).to("cuda" if cuda else "cpu").eval()
    codec.set_precision(precision)
    return codec
