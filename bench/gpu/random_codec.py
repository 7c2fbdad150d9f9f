"""The codec the GPU benches run: random weights, real size unless asked for tiny."""

from __future__ import annotations

import torch

from realtime_engine.codec.decoder import CodecDecoder
from realtime_engine.codec.layout import CodecDims


def random_codec(precision: str, tiny: bool) -> CodecDecoder:
    """A codec with random weights in ``precision``, on CUDA where there is a GPU:
    the real-size one, or with ``tiny`` the tiny one on the CPU (smoke checks of
    the scripts)."""
    cuda = torch.cuda.is_available() and not tiny
    dims = CodecDims.tiny() if tiny else CodecDims.higgs_v3()
    codec = CodecDecoder(dims).to("cuda" if cuda else "cpu").eval()
    codec.set_precision(precision)
    return codec
