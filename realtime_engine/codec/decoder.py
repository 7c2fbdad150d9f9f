"""Codes -> 24 kHz waveform, and the strict loader for the bundled codec.

decode: codes [B, Q, T] -> sum_q project_out_q(embed_q[codes_q]) -> fc2 ->
DAC decoder -> [B, 1, hop * T] float32. It computes in float32 unless
:meth:`CodecDecoder.set_precision` asks for TF32, bf16 autocast or (on CUDA)
float16 weights.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch
from torch import nn

from realtime_engine.codec.dac import DacDecoder
from realtime_engine.codec.errors import CodecInputError
from realtime_engine.codec.layout import (
    CODEC_PREFIX,
    CodecDims,
    decoder_key_shapes,
    is_unused_key,
)
from realtime_engine.codec.rvq import ResidualVQ
from realtime_engine.errors import (
    CheckpointError,
    MissingKeyError,
    ShapeMismatchError,
    UnexpectedKeyError,
)
from realtime_engine.format import CODEC_PRECISIONS as CODEC_PRECISIONS

NUM_QUANTIZERS = 8


class CodecDecoder(nn.Module):
    """RVQ decode + fc2 + DAC decoder; parameter names are the bundled ones."""

    def __init__(self, dims: CodecDims, allow_tf32: bool = False) -> None:
        super().__init__()
        self.dims = dims
        # TF32 convolutions are ~2x faster on large batches but round to ~1e-3,
        # so chunked output no longer equals whole decoding (CUDA only).
        self.allow_tf32 = allow_tf32
        self.autocast_bf16 = False
        self._precision = "tf32" if allow_tf32 else "fp32"
        self.quantizer = ResidualVQ(dims)
        self.fc2 = nn.Linear(dims.latent_dim, dims.acoustic_dim)
        self.acoustic_decoder = DacDecoder(dims)

    def set_precision(self, precision: str) -> None:
        """One of :data:`CODEC_PRECISIONS` (CUDA only; CPU always computes fp32).

        ``fp16`` casts the weights to float16 where the codec is on CUDA (call
        this once it is on its device), and the streaming state follows the
        weights. The cast rounds the weights, so a float16 codec cannot switch
        back: load it again for another precision."""
        if precision not in CODEC_PRECISIONS:
            raise ValueError(
                f"codec precision must be one of {CODEC_PRECISIONS}; got {precision!r}"
            )
        if self.half_weights and precision != "fp16":
            raise ValueError(
                f"this codec's weights were rounded to float16; load it again for {precision!r}"
            )
        self.allow_tf32 = precision == "tf32"
        self.autocast_bf16 = precision == "bf16"
        self._precision = precision
        if precision == "fp16" and self.device.type == "cuda":
            self.half()

    @property
    def precision(self) -> str:
        return "fp16" if self.half_weights else self._precision

    @property
    def half_weights(self) -> bool:
        return self.fc2.weight.dtype == torch.float16

    @property
    def hop(self) -> int:
        return self.dims.hop

    @property
    def sample_rate(self) -> int:
        return self.dims.sample_rate

    def check_codes(self, codes: torch.Tensor) -> None:
        if codes.ndim != 3 or codes.shape[1] != self.dims.num_quantizers:
            raise CodecInputError(
                f"codes must be [B, {self.dims.num_quantizers}, T]; got {tuple(codes.shape)}"
            )
        if codes.dtype not in (torch.int64, torch.int32):
            raise CodecInputError(f"codes must be integers; got {codes.dtype}")
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.dims.codebook_size):
            raise CodecInputError(
                f"codes out of range [0, {self.dims.codebook_size - 1}]: "
                f"min {int(codes.min())}, max {int(codes.max())} "
                "(replace BOC/EOC by 0 before decoding)"
            )

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return self.decode(codes)

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, Q, T] (int) -> pcm [B, 1, hop * T] float32."""
        self.check_codes(codes)
        return self.decode_valid(codes)

    @torch.inference_mode()
    def decode_valid(self, codes: torch.Tensor) -> torch.Tensor:
        """:meth:`decode` for codes already known to be in range (the talker's
        sampler masks guarantee it): no range check, so no host synchronisation."""
        with self.compute_context():
            acoustic = self.acoustic_input(codes)
            return self.acoustic_decoder(acoustic).float()

    def acoustic_input(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, Q, T] -> DAC decoder input [B, acoustic, T]; per frame,
        no temporal context. Codes are not range-checked here."""
        latent = self.quantizer.decode(codes.to(device=self.device, dtype=torch.int64))
        return self.fc2(latent).transpose(1, 2)

    @property
    def device(self) -> torch.device:
        return self.fc2.weight.device

    def compute_context(self) -> contextlib.AbstractContextManager[object]:
        """The precision this codec computes in (see :data:`CODEC_PRECISIONS`)."""
        device = self.device
        stack = contextlib.ExitStack()
        stack.enter_context(_ieee_fp32(device, self.allow_tf32))
        if self.allow_tf32 and device.type == "cuda":
            stack.enter_context(_tf32_matmuls())
        if self.half_weights and device.type == "cuda":
            stack.enter_context(_fp32_reductions())
        if self.autocast_bf16 and device.type == "cuda":
            stack.enter_context(torch.autocast("cuda", dtype=torch.bfloat16))
        return stack

    def decode_numpy(self, codes: np.ndarray) -> np.ndarray:
        """numpy convenience for the streaming decoder: [B, Q, T] -> [B, hop*T]."""
        pcm = self.decode(torch.from_numpy(np.ascontiguousarray(codes, dtype=np.int64)))
        return pcm[:, 0].cpu().numpy()


def _ieee_fp32(device: torch.device, allow_tf32: bool) -> contextlib.AbstractContextManager[object]:
    """Full fp32 convolutions on CUDA: TF32 (cuDNN's default) rounds to ~1e-3,
    which would break chunked == whole decoding, as windows of different
    lengths get different rounding."""
    if device.type != "cuda" or allow_tf32:
        return contextlib.nullcontext()
    cudnn = torch.backends.cudnn
    return cudnn.flags(
        enabled=cudnn.enabled,
        benchmark=cudnn.benchmark,
        deterministic=cudnn.deterministic,
        allow_tf32=False,
    )


@contextlib.contextmanager
def _tf32_matmuls() -> Iterator[None]:
    """TF32 for the codec's matrix products too (the transposed convolutions,
    ``fc2``): cuDNN's convolutions use it by default, cuBLAS's products only
    when asked, and vLLM's worker asks for IEEE float32 ("highest"), which
    runs them on the CUDA cores at a fraction of the speed."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


@contextlib.contextmanager
def _fp32_reductions() -> Iterator[None]:
    """float16 products (the transposed convolutions, ``fc2``) summed in float32:
    cuBLAS may otherwise reduce split products in float16, which loses bits
    over a 1024-channel sum."""
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_fp16_reduced_precision_reduction
    matmul.allow_fp16_reduced_precision_reduction = False
    try:
        yield
    finally:
        matmul.allow_fp16_reduced_precision_reduction = before


def extract_codec_state(talker_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The codec tensors of a talker checkpoint, with ``CODEC_PREFIX`` removed."""
    return {
        key[len(CODEC_PREFIX) :]: value
        for key, value in talker_state.items()
        if key.startswith(CODEC_PREFIX)
    }


def validate_codec_state(
    state_dict: dict[str, torch.Tensor], num_quantizers: int = NUM_QUANTIZERS
) -> CodecDims:
    """Check every decoder tensor's presence and shape; reject unknown keys.

    Encoder-side tensors and quantizer training buffers are accepted and
    ignored; the codebook is ``codebook.embed`` only (``embed_avg`` is an EMA
    accumulator, never the codebook).
    """
    dims = CodecDims.from_state_dict(state_dict)
    if dims.num_quantizers != num_quantizers:
        key = f"quantizer.quantizers.{min(dims.num_quantizers, num_quantizers)}.codebook.embed"
        raise ShapeMismatchError(
            f"codec has {dims.num_quantizers} quantizers; expected {num_quantizers}", key=key
        )
    expected = decoder_key_shapes(dims)
    for key, shape in expected.items():
        if key not in state_dict:
            raise MissingKeyError(f"codec tensor {key!r} is missing", key=key)
        got = tuple(state_dict[key].shape)
        if got != shape:
            raise ShapeMismatchError(
                f"codec tensor {key!r} has shape {list(got)}; expected {list(shape)}", key=key
            )
    for key in state_dict:
        if key not in expected and not is_unused_key(key, dims.num_quantizers):
            raise UnexpectedKeyError(f"unknown codec tensor {key!r}", key=key)
    return dims


def load_codec_decoder(
    state_dict: dict[str, torch.Tensor],
    device: str | torch.device = "cpu",
    num_quantizers: int = NUM_QUANTIZERS,
    allow_tf32: bool = False,
) -> CodecDecoder:
    """Build the decoder from bundled-layout tensors (keys relative to
    ``CODEC_PREFIX``), strictly: missing, misshapen or unknown tensors raise
    typed ``CheckpointError``s that name the key."""
    dims = validate_codec_state(state_dict, num_quantizers)
    expected = decoder_key_shapes(dims)
    module = CodecDecoder(dims, allow_tf32=allow_tf32)
    tensors: dict[str, torch.Tensor] = {}
    for key in expected:
        value = state_dict[key]
        if not value.is_floating_point():
            raise CheckpointError(f"codec tensor {key!r} is {value.dtype}, not float", key=key)
        value = value.detach().to(torch.float32)
        if not bool(torch.isfinite(value).all()):
            raise CheckpointError(f"codec tensor {key!r} has non-finite values", key=key)
        tensors[key] = value
    module.load_state_dict(tensors, strict=True)
    return module.to(device).eval()
