"""The codec's arithmetic per frame, and how far a measured step is from it.

Counts, for one 40 ms frame of the acoustic decoder (the whole decode of
``--frames`` frames divided by their number, float32, on the CPU: the counts
do not depend on the device or the weights):

- floating-point operations by decoder stage (``torch.utils.flop_counter``;
  convolutions and matrix products, 2 per multiply-add);
- the bytes every leaf module writes (its output), the least memory traffic a
  step can have if no two layers were fused, by stage;
- the streaming state a slot keeps between steps (``CausalDac``'s buffers),
  which a batched step gathers by slot, reads in its layers, packs and
  scatters back: six passes over it as written (gather: read, write; the
  layers: read; the packing: write; the scatter: read, write), against two
  for state kept in place.

Given a measured step (``--step-ms`` for ``--batch`` slots, one frame each,
as ``bench.codec_throughput`` reports it), it states the rate that step
achieved: TFLOP/s and GB/s of leaf outputs, and the state's share of a step
at the GPU's bandwidth (``--bandwidth-gbs``). Set against the GPU's peaks
(H200: about 495 TFLOP/s dense TF32, 4.8 TB/s), that says whether the step
is bound by arithmetic, by memory, or by neither (then by the number and
shape of its kernels). Writes ``$OUT/codec_flops.json``.

    python -m bench.codec_flops --batch 256 --step-ms 3.256
    python -m bench.codec_flops --tiny --frames 4   # CPU smoke check
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from bench.json_out import write_report
from realtime_engine.codec.causal import CausalDac
from realtime_engine.codec.decoder import CodecDecoder
from realtime_engine.codec.layout import CodecDims
from realtime_engine.format import FRAMES_PER_SECOND


def stage_of(name: str) -> str:
    """The decoder stage a module belongs to: ``conv1``, ``block.N``, ``snake1``, ``conv2``."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "block" else parts[0]


def count(codec: CodecDecoder, frames: int) -> dict[str, Any]:
    """FLOPs and leaf-output bytes per frame of the acoustic decoder, by stage."""
    decoder = codec.acoustic_decoder
    codes = torch.randint(0, codec.dims.codebook_size, (1, codec.dims.num_quantizers, frames))
    written: dict[str, int] = defaultdict(int)

    def leaf_output(stage: str) -> Any:
        def hook(_module: nn.Module, _inputs: Any, out: torch.Tensor) -> None:
            written[stage] += out.numel() * out.element_size()

        return hook

    handles = [
        module.register_forward_hook(leaf_output(stage_of(name)))
        for name, module in decoder.named_modules()
        if name and not list(module.children())
    ]
    try:
        with torch.inference_mode():
            latent = codec.acoustic_input(codes)
            with FlopCounterMode(display=False) as counter:
                audio = decoder(latent)
    finally:
        for handle in handles:
            handle.remove()
    flops: dict[str, int] = defaultdict(int)
    for module_name, ops in counter.get_flop_counts().items():
        # the counter keys modules by their path under the outermost one it saw
        path = module_name.split(".", 1)
        if module_name == "Global" or len(path) < 2:
            continue
        stage = stage_of(path[1])
        if stage in ("conv1", "snake1", "conv2") or path[1].count(".") == 1:
            flops[stage] += sum(ops.values())
    total = counter.get_total_flops()
    state = sum(spec.channels * spec.length for spec in CausalDac(decoder).buffers)
    return {
        "frames": frames,
        "samples_per_frame": audio.shape[-1] // frames,
        "gflop_per_frame": total / frames / 1e9,
        "mb_written_per_frame": sum(written.values()) / frames / 1e6,
        "state_mb_per_slot": state * audio.element_size() / 1e6,
        "by_stage": {
            stage: {
                "gflop_per_frame": flops.get(stage, 0) / frames / 1e9,
                "mb_written_per_frame": written[stage] / frames / 1e6,
            }
            for stage in written
        },
    }


# passes over a slot's state in a step: the gather reads and writes it, the layers
# read it, the packing writes the new state, the scatter reads and writes that
STATE_PASSES = 6


def achieved(
    per_frame: dict[str, Any], batch: int, step_ms: float, bandwidth_gbs: float
) -> dict[str, float]:
    """The rates a step of ``batch`` frames in ``step_ms`` achieved, and the
    least time its state's gather and scatter take at ``bandwidth_gbs``."""
    seconds = step_ms / 1000
    state_gb = per_frame["state_mb_per_slot"] * batch * STATE_PASSES / 1000
    return {
        "batch": batch,
        "step_ms": step_ms,
        "tflop_per_s": per_frame["gflop_per_frame"] * batch / seconds / 1000,
        "gb_written_per_s": per_frame["mb_written_per_frame"] * batch / seconds / 1000,
        "audio_s_per_s": batch / FRAMES_PER_SECOND / seconds,
        "state_gb_moved_per_step": state_gb,
        "state_ms_at_bandwidth": state_gb / bandwidth_gbs * 1000,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.codec_flops", description=__doc__)
    ap.add_argument("--frames", type=int, default=25, help="frames decoded whole (1 s)")
    ap.add_argument("--batch", type=int, default=256, help="slots in the measured step")
    ap.add_argument("--step-ms", type=float, help="a measured step, ms (bench.codec_throughput)")
    ap.add_argument(
        "--bandwidth-gbs", type=float, default=4800.0, help="the GPU's memory bandwidth (H200)"
    )
    ap.add_argument("--tiny", action="store_true", help="tiny codec dims (CPU smoke check)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    if (
        args.frames < 1
        or args.batch < 1
        or (args.step_ms is not None and args.step_ms <= 0)
        or args.bandwidth_gbs <= 0
    ):
        ap.error("--frames and --batch must be at least 1, --step-ms and --bandwidth-gbs above 0")
    torch.manual_seed(0)
    dims = CodecDims.tiny() if args.tiny else CodecDims.higgs_v3()
    codec = CodecDecoder(dims).eval()
    report: dict[str, Any] = {"dims": "tiny" if args.tiny else "higgs_v3"}
    report |= count(codec, args.frames)
    if args.step_ms is not None:
        report["achieved"] = achieved(report, args.batch, args.step_ms, args.bandwidth_gbs)
    write_report(args.out, "codec_flops", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
