"""The compiled codec's start: the engine's warm-up of its codec, from empty caches, then again.

Builds the engine's :class:`~realtime_engine.talker.codec_slots.CodecSlots` over
the real-size codec with random weights (TF32) at the served slot count, with
``kernels="compiled"`` and CUDA graphs, and times its ``warm_up`` (trace the step
and the whole tail, compile, capture every bucket) in a fresh process with
empty Inductor and Triton caches, then in a second fresh process with the
caches the first left (a restart), once per number of compile workers asked
for. Each line gives torch.compile's phases and its caches' hits and misses
(AOTAutograd's, Inductor's FX graphs'): a warm start that misses AOTAutograd's
cache traces the whole step again. Inductor is first pinned to one compile
thread, as importing vLLM leaves it in the engine core; the warm-up then
compiles with the workers given (``--workers``). Writes
``$OUT/codec_warm_up.txt`` line by line. ``--tiny`` runs it on the CPU at tiny
size, uncaptured (a smoke check of the script).

    python -m bench.gpu.codec_warm_up [--slots 256] [--workers 16] [--precision fp16]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def warm_up_once(slots: int, workers: int, precision: str, tiny: bool) -> str:
    """One warm-up, in this process (its caches as the caller set them): its
    seconds, torch.compile's phases and its caches' counters, as a report line."""
    import torch
    from torch._dynamo.utils import counters
    from torch._inductor import config as inductor_config

    from bench.gpu.random_codec import random_codec
    from realtime_engine.talker.codec_slots import CodecSlots
    from realtime_engine.talker.compile_workers import (
        compile_phase_seconds,
        describe_compile_phases,
    )

    torch.manual_seed(0)
    inductor_config.compile_threads = 1  # what importing vLLM leaves
    codec = random_codec(precision, tiny)
    cuda = codec.device.type == "cuda"
    codec_slots = CodecSlots(codec, slots, graphs=cuda, kernels="compiled", compile_workers=workers)
    phases = compile_phase_seconds()
    started = time.perf_counter()
    codec_slots.warm_up()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    counts = ", ".join(
        f"{group}.{name} {count}"
        for group in ("aot_autograd", "inductor")
        for name, count in sorted(counters[group].items())
        if "cache" in name
    )
    phases_line = describe_compile_phases(phases, compile_phase_seconds())
    return f"{seconds:.1f} s ({phases_line}; {counts or 'no cache counters'})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--slots", type=int, default=256)
    ap.add_argument("--workers", default="16", help="comma-separated compile worker counts")
    ap.add_argument("--precision", default="tf32")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        print(warm_up_once(args.slots, args.child, args.precision, args.tiny))
        return 0
    out = Path(args.out) / "codec_warm_up.txt"
    with out.open("w") as report:
        report.write(f"slots {args.slots}, precision {args.precision}, tiny {args.tiny}\n")
        report.write("compile workers | start | warm-up (trace, compile, capture)\n")
        for workers in [int(w) for w in args.workers.split(",")]:
            with tempfile.TemporaryDirectory() as caches:
                env = dict(
                    os.environ,
                    TORCHINDUCTOR_CACHE_DIR=f"{caches}/inductor",
                    TRITON_CACHE_DIR=f"{caches}/triton",
                )
                child = [sys.executable, "-m", "bench.gpu.codec_warm_up", "--child", str(workers)]
                child += ["--slots", str(args.slots), "--precision", args.precision]
                child += ["--tiny"] if args.tiny else []
                for start in ("cold", "warm"):  # empty caches, then the ones it left
                    done = subprocess.run(
                        child, env=env, capture_output=True, text=True, check=False
                    )
                    if done.returncode != 0:
                        failure = done.stderr.strip().splitlines()[-1:]
                        report.write(f"{workers} | {start} | failed: {failure}\n")
                        report.flush()
                        break
                    result = done.stdout.strip().splitlines()[-1]
                    report.write(f"{workers} | {start} | {result}\n")
                    report.flush()
    print(out.read_text(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
