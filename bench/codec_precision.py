"""How far each codec precision's whole decode is from float64, at real size.

Decodes random utterances with the codec's weights cast to float32, float16
and bfloat16 (the casts ``--codec-precision fp16`` makes on CUDA, and a pure
bfloat16 for comparison) and reports each one's peak-relative error against
the float64 decode of the same codec, with the largest activation seen in
float32 (float16's range ends at 65504). Random weights: the released
weights' activations may be larger. Runs where the codec is (the CPU by
default: float16 convolutions are slow there but exact to their rounding).

    python -m bench.codec_precision [--frames 40] [--utterances 2] [--device cpu]
    python -m bench.codec_precision --tiny --frames 6      # smoke check
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from typing import Any

import torch

from bench.json_out import write_report
from realtime_engine.codec.decoder import CodecDecoder
from realtime_engine.codec.layout import CodecDims

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def whole(codec: CodecDecoder, codes: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return codec.acoustic_decoder(codec.acoustic_input(codes)).double()


def largest_activation(codec: CodecDecoder, codes: torch.Tensor) -> float:
    seen = [0.0]

    def hook(_m: Any, _i: Any, out: torch.Tensor) -> None:
        seen[0] = max(seen[0], float(out.abs().max()))

    leaves = [m for m in codec.acoustic_decoder.modules() if not list(m.children())]
    handles = [m.register_forward_hook(hook) for m in leaves]
    try:
        whole(codec, codes)
    finally:
        for h in handles:
            h.remove()
    return seen[0]


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(args.seed)
    dims = CodecDims.tiny() if args.tiny else CodecDims.higgs_v3()
    codec = CodecDecoder(dims).to(args.device).eval()
    exact = copy.deepcopy(codec).double()
    gen = torch.Generator().manual_seed(args.seed)
    codes = torch.randint(0, dims.codebook_size, (args.utterances, 8, args.frames), generator=gen)
    codes = codes.to(args.device)
    reference = whole(exact, codes)
    peak = float(reference.abs().max())
    errors = {}
    for name, dtype in DTYPES.items():
        got = whole(copy.deepcopy(codec).to(dtype), codes)
        errors[name] = float((got - reference).abs().max()) / peak
    return {
        "dims": "tiny" if args.tiny else "higgs_v3",
        "device": str(args.device),
        "torch": torch.__version__,
        "utterances": args.utterances,
        "frames": args.frames,
        "seed": args.seed,
        "peak": peak,
        "largest_activation_float32": largest_activation(codec, codes),
        "peak_relative_error": errors,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--frames", type=int, default=40)
    ap.add_argument("--utterances", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tiny", action="store_true", help="tiny codec dims (smoke check)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    write_report(args.out, "codec_precision", run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
