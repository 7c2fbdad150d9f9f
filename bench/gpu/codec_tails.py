"""The codec's captured tails, eager against compiled: start-up, device time, agreement.

Builds the engine's :class:`~realtime_engine.talker.codec_slots.CodecSlots` twice
over one real-size codec with random weights (TF32), first with
``kernels="compiled"`` then ``"eager"``, each captured as CUDA graphs as the
engine does (``warm_up``); feeds both the same frames, then times each
preset's speculative edge and the whole tail (eager: each captured; compiled:
the start of the compiled whole tail) per batch bucket, with CUDA events,
and checks that the two agree. Writes ``$OUT/codec_tails.txt`` line by line
(a run cut short keeps what it measured). ``--tiny`` runs it on the CPU at
tiny size, uncaptured (a smoke check of the script).

    python -m bench.gpu.codec_tails [--slots 8] [--frames 30] [--reps 50]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TextIO

import torch

from bench.gpu.random_codec import random_codec
from realtime_engine.talker.codec_slots import CodecSlots, tail_lengths


def device_ms(call: Callable[[], object], reps: int, cuda: bool) -> float:
    """Mean milliseconds of ``call()`` on the device (wall time on the CPU)."""
    call()
    if not cuda:
        start = time.perf_counter()
        for _ in range(reps):
            call()
        return (time.perf_counter() - start) * 1000 / reps
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    begin.record()
    for _ in range(reps):
        call()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) / reps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--frames", type=int, default=30)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--precision", default="tf32")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    codec = random_codec(args.precision, args.tiny)
    device, dims = codec.device, codec.dims
    cuda = device.type == "cuda"
    path = Path(args.out) / "codec_tails.txt"
    with path.open("w") as out:
        report(
            out,
            f"device {torch.cuda.get_device_name() if cuda else 'cpu'}, torch {torch.__version__}",
        )
        report(out, f"codec {args.precision}, {args.slots} slots, {args.frames} frames fed")
        table = torch.randint(0, dims.codebook_size, (args.slots, args.frames + 8, 8))
        table = table.to(device=device, dtype=torch.int16)
        built: dict[str, CodecSlots] = {}
        for kernels in ("compiled", "eager"):
            start = time.perf_counter()
            slots = CodecSlots(codec, args.slots, graphs=cuda, kernels=kernels, bucket_tails=True)
            slots.warm_up()
            if cuda:
                torch.cuda.synchronize()
            report(
                out, f"{kernels}: warm-up (compile and capture) {time.perf_counter() - start:.1f} s"
            )
            every = list(range(args.slots))
            slots.reset(every)
            for frame in range(args.frames):
                slots.step(every, [frame] * args.slots, table)
            built[kernels] = slots
            for size in slots._tail_sizes:
                index = torch.arange(size, device=device)
                cells = []
                for samples in tail_lengths(slots.delay, slots.hop):
                    ms = device_ms(partial(slots._peek, index, samples), args.reps, cuda)
                    cells.append(f"{samples}: {ms:.3f} ms")
                report(out, f"{kernels}: tails at batch {size}: " + ", ".join(cells))
        compiled, eager = built["compiled"], built["eager"]
        index = torch.arange(min(args.slots, 2), device=device)
        for samples in tail_lengths(eager.delay, eager.hop):
            a, b = compiled._peek(index, samples).clone(), eager._peek(index, samples).clone()
            peak = float(b.abs().max())
            error = float((a - b).abs().max()) / max(peak, 1e-12)
            report(
                out,
                f"tail {samples}: compiled against eager, max error {error:.2e} of peak {peak:.3g}",
            )
    return 0


def report(out: TextIO, line: str) -> None:
    print(line, flush=True)
    out.write(line + "\n")
    out.flush()


if __name__ == "__main__":
    sys.exit(main())
