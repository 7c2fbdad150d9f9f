"""How much audio per second the served codec produces, by batch and precision.

The engine steps slots with new frames through the streaming codec
(:class:`~realtime_engine.talker.codec_slots.CodecSlots`): ``n`` frames per
slot per call (1 by default; ``frames_per_call`` lets a slot wait for more),
each sample computed once, captured as a CUDA graph per batch bucket and
frame count. This times that step through the real-size codec (random
weights: timing does not depend on weight values) and reports, per
(precision, batch, frames; ``--frames 1,2,4``): milliseconds per step
(CUDA events, graph replays back to back) and seconds of audio per second
of decoding. It also decodes one utterance through the same path in each
precision and reports its error against the whole-utterance decode
computed in float64, relative to the peak.

Precisions (``--codec-precision`` of ``speech-gateway serve``): ``fp32``
(IEEE convolutions), ``tf32`` (TF32 tensor cores), ``bf16`` (autocast) and
``fp16`` (float16 weights and state; timed on a copy of the codec, as the
cast rounds the weights). ``--precisions`` lists those timed with eager
kernels (empty: none, only the ``--kernels`` variants, which skips their
eager compile-free baselines). Writes ``$OUT/codec_throughput.json``.

    python -m bench.codec_throughput [--batches 1,16,64,128,256] [--iters 50]
    python -m bench.codec_throughput --precisions= --kernels tf32:compiled,fp16:compiled
    python -m bench.codec_throughput --tiny --batches 1,4 --iters 2 --kernels= # CPU smoke check

``--kernels`` adds ``precision:kernels`` variants (``--codec-kernels`` of
``serve``): ``snake`` (one Triton kernel per activation, CUDA) and
``compiled`` (the whole step through torch.compile). Suffixes, any number:
``+nhwc`` (``tf32:compiled+nhwc``) runs the convolutions on channels-last
tensors (``CausalDac(channels_last=True)``, not a serving option yet);
``+gemm`` (``tf32:compiled+gemm``) runs the convolutions of 256 channels or
more as matrix products over their gathered taps
(``CausalDac(gemm_channels=256)``), ``+gemm64`` those of 64 channels or
more, ``+conv`` none. Without one of those the codec chooses as served:
products from 256 channels in float16, none otherwise. ``+autotune``
compiles with Inductor's ``max-autotune-no-cudagraphs``. ``+units`` runs the
residual units of up to 128 channels as one Triton kernel each
(``CausalDac(fused_units=True)``, an experimental serving option), ``+unitsact``
with their first activation in the kernel too (``fused_units="activation"``),
``+narrow`` so and each narrow block's upsampling and the output layer as
one kernel too (``fused_units="narrow"``). ``+shift`` takes the products'
taps as shifted views of the input instead of a gathered copy, where that
costs few rows (``CausalDac(gemm_taps="shifted")``; with ``+gemm``, or in
float16).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from realtime_engine.codec.causal import GEMM_CHANNELS, GemmChannels, GemmTaps
from realtime_engine.codec.decoder import CODEC_PRECISIONS, CodecDecoder
from realtime_engine.codec.fused_unit import FusedUnits
from realtime_engine.codec.layout import CodecDims
from realtime_engine.format import DEFAULT_CODEC_COMPILE_MODE, FRAMES_PER_SECOND
from realtime_engine.talker.codec_slots import CodecSlots


def step_seconds(
    slots: CodecSlots, table: torch.Tensor, batch: int, iters: int, frames: int = 1
) -> float:
    """Mean seconds per codec step of ``frames`` frames into each of ``batch`` slots
    (graph replays when captured)."""
    index = list(range(batch))
    rows = [0] * batch
    cuda = table.device.type == "cuda"
    for _ in range(3):
        slots.step(index, rows, table, frames=frames)
    if cuda:
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        slots.step(index, rows, table, frames=frames)
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters


def exact_decode(codec: CodecDecoder, codes: torch.Tensor) -> torch.Tensor:
    """The whole-utterance decode of ``codes`` [1, Q, T] in float64."""
    exact_codec = copy.deepcopy(codec).double()
    exact_codec.set_precision("fp32")
    with torch.inference_mode():
        return exact_codec.decode(codes.to(codec.device))[0, 0].double()


def stream_error(slots: CodecSlots, codes: torch.Tensor, exact: torch.Tensor) -> float:
    """Peak-relative error of one utterance streamed through ``slots`` (its slot 0,
    one frame a step: the captured batch-1 path) vs the exact whole decode."""
    device, frames = slots.device, codes.shape[-1]
    # the table holds the frames in the talker's delay pattern: codebook c of frame t at row t + c
    table = torch.zeros(1, frames + 8, 8, dtype=torch.int16, device=device)
    for c in range(8):
        table[0, c : c + frames, c] = codes[0, c].to(device=device, dtype=torch.int16)
    slots.reset([0])
    for t in range(frames):
        slots.step([0], [t], table)
    end = frames * slots.hop
    with slots.on_codec_stream():
        got = slots.chunks([0], [0], [end], [frames])[0].double()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return float((got - exact).abs().max() / exact.abs().max())


@dataclass(frozen=True)
class Variant:
    """A codec variant's build: its kernels and the options its suffixes set."""

    kernels: str
    channels_last: bool = False
    gemm_channels: GemmChannels = "auto"
    compile_mode: str = DEFAULT_CODEC_COMPILE_MODE
    fused_units: FusedUnits = False
    gemm_taps: GemmTaps = "gathered"


def variant_of(name: str) -> Variant:
    """``kernels[+suffix...]`` (see the module's notes) as a :class:`Variant`."""
    kernels, *suffixes = name.split("+")
    options: dict[str, Any] = {}
    for suffix in suffixes:
        digits = suffix.removeprefix("gemm")
        if suffix == "nhwc":
            options["channels_last"] = True
        elif suffix == "gemm":
            options["gemm_channels"] = GEMM_CHANNELS
        elif suffix.startswith("gemm") and digits.isdigit() and int(digits) >= 1:
            options["gemm_channels"] = int(digits)
        elif suffix == "conv":
            options["gemm_channels"] = None
        elif suffix == "autotune":
            options["compile_mode"] = "max-autotune-no-cudagraphs"
        elif suffix == "units":
            options["fused_units"] = True
        elif suffix == "unitsact":
            options["fused_units"] = "activation"
        elif suffix == "narrow":
            options["fused_units"] = "narrow"
        elif suffix == "shift":
            options["gemm_taps"] = "shifted"
        else:
            raise ValueError(
                f"unknown suffix {suffix!r} in {name!r}"
                " (+nhwc, +gemm, +gemmN, +conv, +autotune, +units, +unitsact, +narrow, +shift)"
            )
    return Variant(kernels, **options)


def measure(
    codec: CodecDecoder,
    precision: str,
    kernels: str,
    batches: list[int],
    args: argparse.Namespace,
    report: dict[str, Any],
    utterance: tuple[torch.Tensor, torch.Tensor],
) -> None:
    if precision == "fp16":  # the cast rounds the weights: later variants keep float32
        codec = copy.deepcopy(codec)
    codec.set_precision(precision)
    variant = variant_of(kernels)
    slots = CodecSlots(
        codec,
        max(batches),
        graphs=True,
        kernels=variant.kernels,
        channels_last=variant.channels_last,
        gemm_channels=variant.gemm_channels,
        compile_mode=variant.compile_mode,
        frame_counts=args.frame_counts,
        fused_units=variant.fused_units,
        gemm_taps=variant.gemm_taps,
    )
    t = time.perf_counter()
    slots.warm_up()
    capture_s = time.perf_counter() - t
    positions = 8 + max(args.frame_counts)
    table = torch.randint(
        0, codec.dims.codebook_size, (max(batches), positions, 8), device=codec.device
    )
    table = table.to(torch.int16)
    for frames in args.frame_counts:
        for batch in batches:
            seconds = step_seconds(slots, table, batch, args.iters, frames)
            row = {
                "precision": precision,
                "kernels": kernels,
                "batch": batch,
                "frames": frames,
                "ms_per_step": round(1000 * seconds, 3),
                "audio_s_per_s": round(batch * frames / FRAMES_PER_SECOND / seconds, 1),
                "capture_s": round(capture_s, 2),
            }
            report["results"].append(row)
            print(json.dumps(row), flush=True)
    error = stream_error(slots, *utterance)
    report["errors"][f"{precision}/{kernels}"] = error
    print(json.dumps({"precision": precision, "kernels": kernels, "peak_error": error}), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batches", default="1,16,64,128,256")
    ap.add_argument("--precisions", default=",".join(CODEC_PRECISIONS))
    ap.add_argument(
        "--kernels",
        default="tf32:snake,tf32:compiled,bf16:compiled,fp16:compiled",
        help="precision:kernels pairs also timed, besides every precision with eager kernels",
    )
    ap.add_argument(
        "--frames",
        default="1",
        help="frames per slot in a step, each count timed (the served codec's frames_per_call"
        " steps a due chunk's frames as 1, 2, 4 ...)",
    )
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--error-frames", type=int, default=75)
    ap.add_argument("--tiny", action="store_true", help="tiny codec dims (CPU smoke check)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    args.frame_counts = sorted({int(n) for n in args.frames.split(",")})
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dims = CodecDims.tiny() if args.tiny else CodecDims.higgs_v3()
    codec = CodecDecoder(dims).to(device).eval()
    batches = [int(b) for b in args.batches.split(",")]
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "dims": "tiny" if args.tiny else "higgs_v3",
        "path": "CodecSlots.step: frames per slot as given, CUDA graph per batch bucket",
        "results": [],
        "errors": {},
    }
    runs = [(p, "eager") for p in args.precisions.split(",") if p]
    runs += [(pair.split(":")[0], pair.split(":")[1]) for pair in args.kernels.split(",") if pair]
    gen = torch.Generator().manual_seed(1)
    codes = torch.randint(0, codec.dims.codebook_size, (1, 8, args.error_frames), generator=gen)
    utterance = (codes, exact_decode(codec, codes))
    for precision, kernels in runs:
        try:
            measure(codec, precision, kernels, batches, args, report, utterance)
        except Exception as e:  # one variant failing (say, its capture) loses only itself
            report["errors"][f"{precision}/{kernels}"] = f"failed: {e!r}"[:2000]
            print(
                json.dumps({"precision": precision, "kernels": kernels, "failed": repr(e)[:2000]}),
                flush=True,
            )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "codec_throughput.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
