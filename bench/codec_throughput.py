"""How much audio per second the served codec produces, by batch and precision.

The engine steps every slot with a new frame through the streaming codec
(:class:`~realtime_engine.talker.codec_slots.CodecSlots`): one frame per
slot per call, each sample computed once, captured as a CUDA graph per
batch bucket. This times that step through the real-size codec (random
weights: timing does not depend on weight values) and reports, per
(precision, batch): milliseconds per step (CUDA events, graph replays back
to back) and seconds of audio per second of decoding. It also decodes one
utterance through the same path in each precision and reports its error
against the whole-utterance decode computed in float64, relative to the
peak.

Precisions (``--codec-precision`` of ``speech-gateway serve``): ``fp32``
(IEEE convolutions), ``tf32`` (TF32 tensor cores) and ``bf16`` (autocast).
Writes ``$OUT/codec_throughput.json``.

    python -m bench.codec_throughput [--batches 1,16,64,128,256] [--iters 50]
    python -m bench.codec_throughput --tiny --batches 1,4 --iters 2   # CPU smoke check
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from realtime_engine.codec.decoder import CODEC_PRECISIONS, CodecDecoder
from realtime_engine.codec.layout import CodecDims
from realtime_engine.format import FRAMES_PER_SECOND
from realtime_engine.talker.codec_slots import CodecSlots


def step_seconds(slots: CodecSlots, table: torch.Tensor, batch: int, iters: int) -> float:
    """Mean seconds per codec step of ``batch`` slots (graph replays when captured)."""
    index = list(range(batch))
    rows = [0] * batch
    cuda = table.device.type == "cuda"
    for _ in range(3):
        slots.step(index, rows, table)
    if cuda:
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        slots.step(index, rows, table)
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters


def stream_error(codec: CodecDecoder, frames: int, precision: str) -> float:
    """Peak-relative error of one streamed utterance vs the exact whole decode."""
    device = codec.device
    gen = torch.Generator().manual_seed(1)
    codes = torch.randint(0, codec.dims.codebook_size, (1, 8, frames), generator=gen)
    exact_codec = copy.deepcopy(codec).double()
    exact_codec.set_precision("fp32")
    with torch.inference_mode():
        exact = exact_codec.decode(codes.to(device))[0, 0].double()
    codec.set_precision(precision)
    slots = CodecSlots(codec, 1)
    # the table holds the frames in the talker's delay pattern: codebook c of frame t at row t + c
    table = torch.zeros(1, frames + 8, 8, dtype=torch.int16, device=device)
    for c in range(8):
        table[0, c : c + frames, c] = codes[0, c].to(device=device, dtype=torch.int16)
    slots.reset(0)
    for t in range(frames):
        slots.step([0], [t], table)
    end = frames * codec.hop
    with slots.on_codec_stream():
        got = slots.chunks([0], [0], [end], [frames])[0].double()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return float((got - exact).abs().max() / exact.abs().max())


def measure(
    codec: CodecDecoder,
    precision: str,
    batches: list[int],
    args: argparse.Namespace,
    report: dict[str, Any],
    fused: bool | None = None,
) -> None:
    codec.set_precision(precision)
    slots = CodecSlots(codec, max(batches), graphs=True, fused=fused)
    fused = slots.stream_codec.layers.fused
    t = time.perf_counter()
    slots.warm_up()
    capture_s = time.perf_counter() - t
    table = torch.randint(0, codec.dims.codebook_size, (max(batches), 8, 8), device=codec.device)
    table = table.to(torch.int16)
    for batch in batches:
        seconds = step_seconds(slots, table, batch, args.iters)
        row = {
            "precision": precision,
            "fused": fused,
            "batch": batch,
            "ms_per_step": round(1000 * seconds, 3),
            "audio_s_per_s": round(batch / FRAMES_PER_SECOND / seconds, 1),
            "capture_s": round(capture_s, 2),
        }
        report["results"].append(row)
        print(json.dumps(row), flush=True)
    del slots
    if not fused and codec.device.type == "cuda":
        return  # the error is the fused run's (the same arithmetic, one kernel)
    error = stream_error(codec, args.error_frames, precision)
    report["errors"][precision] = error
    print(json.dumps({"precision": precision, "peak_error_vs_float64": error}), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batches", default="1,16,64,128,256")
    ap.add_argument("--precisions", default=",".join(CODEC_PRECISIONS))
    ap.add_argument(
        "--unfused", default="tf32", help="precisions also timed with eager activations (CUDA)"
    )
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--error-frames", type=int, default=75)
    ap.add_argument("--tiny", action="store_true", help="tiny codec dims (CPU smoke check)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dims = CodecDims.tiny() if args.tiny else CodecDims.higgs_v3()
    codec = CodecDecoder(dims).to(device).eval()
    batches = [int(b) for b in args.batches.split(",")]
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "dims": "tiny" if args.tiny else "higgs_v3",
        "path": "CodecSlots.step: one frame per slot, CUDA graph per batch bucket",
        "results": [],
        "errors": {},
    }
    runs: list[tuple[str, bool | None]] = [(p, None) for p in args.precisions.split(",")]
    if device.type == "cuda":
        runs += [(p, False) for p in args.unfused.split(",") if p]
    for precision, fused in runs:
        try:
            measure(codec, precision, batches, args, report, fused)
        except RuntimeError as e:  # one precision failing (say, its capture) loses only itself
            report["errors"][precision] = f"failed: {e}"
            print(json.dumps({"precision": precision, "failed": str(e)}), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "codec_throughput.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
