"""Write the tiny synthetic Higgs Audio v3 checkpoint.

    python -m realtime_engine.tools.make_tiny_checkpoint OUT_DIR [--seed N] [--with-optional-heads]
        [--shards N]

Same seed → byte-identical files. ``--model tiny`` elsewhere generates the
same checkpoint (seed 0) into the cache on first use. The bundled codec always
carries its encoder side too (tiny HuBERT, DAC and semantic encoders), so
voice cloning works on every variant; ``--with-optional-heads`` only adds the
talker's optional head tensors.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from realtime_engine.model.tiny import write_sharded_copy, write_tiny_checkpoint


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m realtime_engine.tools.make_tiny_checkpoint",
        description="Write a tiny random checkpoint with the real Higgs Audio v3 layout.",
    )
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--with-optional-heads",
        action="store_true",
        help="also write tied.head.text_head.weight and tied.head.modality_heads.0.weight",
    )
    parser.add_argument(
        "--shards",
        type=int,
        default=1,
        help="split the weights into this many files with model.safetensors.index.json",
    )
    args = parser.parse_args(argv)
    if args.shards < 1:
        parser.error("--shards must be >= 1")
    if args.shards == 1:
        write_tiny_checkpoint(
            args.out_dir, seed=args.seed, with_optional_heads=args.with_optional_heads
        )
    else:
        with tempfile.TemporaryDirectory() as scratch:
            write_tiny_checkpoint(
                scratch, seed=args.seed, with_optional_heads=args.with_optional_heads
            )
            write_sharded_copy(scratch, args.out_dir, num_shards=args.shards)
    print(args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
