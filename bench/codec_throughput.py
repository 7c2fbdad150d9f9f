"""How much audio per second the codec decoder can produce, by preset, batch and precision.

The streaming decoder decodes each chunk inside a window of left context +
chunk + right holdback frames, so a preset's steady-state cost is its window
per chunk. This decodes batches of such windows through the real-size codec
(random weights: timing does not depend on weight values) and reports, per
(precision, preset, batch): milliseconds per call and seconds of *emitted*
audio per second of decoding (chunk frames only, context excluded).

Precisions (``--codec-precision`` of ``speech-gateway serve``): ``fp32``
(IEEE, the default: chunked output equals whole decoding), ``tf32`` (TF32
convolutions) and ``bf16`` (autocast). Writes
``$OUT/codec_throughput.json``.

    python -m bench.codec_throughput [--batches 1,16,64,128] [--iters 20]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from realtime_engine.codec.decoder import CODEC_PRECISIONS, CodecDecoder
from realtime_engine.codec.layout import CodecDims
from realtime_engine.codec.presets import PRESETS
from realtime_engine.format import FRAMES_PER_SECOND


def steady_window(preset: str) -> tuple[int, int]:
    """(window frames, emitted frames) of a preset's full-size chunks."""
    p = PRESETS[preset]
    return p.left_context_frames + p.chunk_frames + p.right_holdback_frames, p.chunk_frames


def time_calls(codec: CodecDecoder, codes: torch.Tensor, precision: str, iters: int) -> float:
    """Mean wall seconds per decode call (synchronised), after warm-up."""
    codec.set_precision(precision)
    cuda = codes.device.type == "cuda"
    for _ in range(3):
        codec.decode(codes)
    if cuda:
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        codec.decode(codes)
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batches", default="1,16,64,128")
    ap.add_argument("--presets", default="latency,balanced,exact")
    ap.add_argument("--precisions", default=",".join(CODEC_PRECISIONS))
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--tiny", action="store_true", help="tiny codec dims (CPU smoke check)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dims = CodecDims.tiny() if args.tiny else CodecDims.higgs_v3()
    codec = CodecDecoder(dims).to(device).eval()
    # cuDNN picks algorithms per shape once; the gateway runs with benchmark off too.
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "dims": "tiny" if args.tiny else "higgs_v3",
        "results": [],
    }
    gen = torch.Generator().manual_seed(0)
    for precision in args.precisions.split(","):
        for preset in args.presets.split(","):
            window, emitted = steady_window(preset)
            for batch in (int(b) for b in args.batches.split(",")):
                codes = torch.randint(0, dims.codebook_size, (batch, 8, window), generator=gen)
                seconds = time_calls(codec, codes.to(device), precision, args.iters)
                audio_s = batch * emitted / FRAMES_PER_SECOND
                row = {
                    "precision": precision,
                    "preset": preset,
                    "batch": batch,
                    "window_frames": window,
                    "emitted_frames": emitted,
                    "ms_per_call": round(1000 * seconds, 3),
                    "audio_s_per_s": round(audio_s / seconds, 1),
                }
                report["results"].append(row)
                print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "codec_throughput.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
