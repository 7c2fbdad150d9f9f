"""Where the served codec step spends its GPU time: a torch-profiler table.

Runs the engine's codec step (:class:`~realtime_engine.talker.codec_slots.CodecSlots`,
one frame per slot, TF32, eager so that every operator shows) at one batch
size through the real-size codec with random weights, and writes the
operators and kernels sorted by device time to ``$OUT/codec_profile_<B>.txt``
(and a Chrome trace, gzipped), and the device time a step by kind of kernel
(``bench.gpu.kernel_kinds``) to ``$OUT/codec_profile_<B>_kinds.txt``.
``--tiny`` runs it on the CPU at tiny size (a smoke check of the script).
``--kernels compiled`` profiles the compiled step (uncaptured too: Inductor's
fused kernels show by name); ``--precision fp16``, the codec in float16;
``--channels-last``, the convolutions on channels-last tensors;
``--gemm-channels N``, the convolutions of N channels or more as matrix
products (0: none; by default, as served: from 256 channels for a float16
codec, none otherwise); ``--shifted-taps``, those products over shifted
views of their input instead of a gathered copy; ``--compile-mode``, how
torch.compile builds the compiled step.

    python -m bench.gpu.codec_profile --batch 256 [--steps 5] [--kernels compiled]
        [--precision fp16] [--channels-last] [--gemm-channels N] [--shifted-taps]
        [--compile-mode max-autotune-no-cudagraphs]
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from bench.gpu.kernel_kinds import by_kind, load_events, render
from bench.gpu.random_codec import random_codec
from realtime_engine.codec.causal import GemmChannels
from realtime_engine.codec.fused_unit import FusedUnits
from realtime_engine.format import CODEC_COMPILE_MODES, CODEC_KERNELS, DEFAULT_CODEC_COMPILE_MODE
from realtime_engine.talker.codec_slots import CodecSlots

# --fused-units: absent, bare, "activation" or "narrow"
FUSED_UNITS_BY_FLAG: dict[str | None, FusedUnits] = {
    None: False,
    "branch": True,
    "activation": "activation",
    "narrow": "narrow",
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--precision", default="tf32")
    ap.add_argument("--kernels", choices=CODEC_KERNELS, default="eager")
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument(
        "--gemm-channels",
        type=int,
        help="convolutions this wide or wider as matrix products (0: none; default: as served)",
    )
    ap.add_argument(
        "--shifted-taps",
        action="store_true",
        help="the products' taps as shifted views of their input, not a gathered copy",
    )
    ap.add_argument(
        "--compile-mode", choices=CODEC_COMPILE_MODES, default=DEFAULT_CODEC_COMPILE_MODE
    )
    ap.add_argument(
        "--fused-units",
        nargs="?",
        const="branch",
        choices=["branch", "activation", "narrow"],
        help="narrow residual units as one kernel each (activation: their first one too;"
        " narrow: so, and each narrow block's upsampling and the output layer as one kernel)",
    )
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    codec = random_codec(args.precision, args.tiny)
    device, dims = codec.device, codec.dims
    cuda = device.type == "cuda"
    gemm_channels: GemmChannels = "auto" if args.gemm_channels is None else args.gemm_channels
    slots = CodecSlots(
        codec,
        args.batch,
        kernels=args.kernels,
        channels_last=args.channels_last,
        gemm_channels=gemm_channels or None,
        compile_mode=args.compile_mode,
        fused_units=FUSED_UNITS_BY_FLAG[args.fused_units],
        gemm_taps="shifted" if args.shifted_taps else "gathered",
    )
    taken = slots.stream_codec.layers.gemm_channels
    slots.warm_up()  # compiles (compiled kernels); no graphs: every kernel shows
    table = torch.randint(0, dims.codebook_size, (args.batch, 8, 8), device=device)
    table = table.to(torch.int16)
    index, rows = list(range(args.batch)), [0] * args.batch
    for _ in range(3):
        slots.step(index, rows, table)
    if cuda:
        torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(args.steps):
            slots.step(index, rows, table)
        if cuda:
            torch.cuda.synchronize()
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    table_text = prof.key_averages().table(sort_by=key, row_limit=40)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    header = (
        f"codec step, batch {args.batch}, {args.steps} steps, precision {args.precision}, "
        f"{torch.cuda.get_device_name() if cuda else 'cpu'}, {args.kernels} kernels"
        f"{', channels-last' if args.channels_last else ''}"
        f"{f', gemm from {taken} channels' if taken else ''}"
        f"{', shifted taps' if args.shifted_taps else ''}"
        f"{f', {args.compile_mode}' if args.compile_mode != DEFAULT_CODEC_COMPILE_MODE else ''}"
        " (no graph)\n"
    )
    (out / f"codec_profile_{args.batch}.txt").write_text(header + table_text)
    trace = out / f"codec_profile_{args.batch}.json"
    prof.export_chrome_trace(str(trace))
    kinds = render(by_kind(load_events(trace), args.steps), header.strip())
    (out / f"codec_profile_{args.batch}_kinds.txt").write_text(kinds)
    with trace.open("rb") as src, gzip.open(f"{trace}.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    trace.unlink()
    print(header + table_text + kinds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
