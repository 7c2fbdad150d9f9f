"""Codec compute per audio second: the stateful streaming codec against
re-decoding overlapping windows.

For each preset, one utterance of ``--frames`` random frames is decoded
three ways, with the preset's chunk plan:

- ``windows``: the previous design: every chunk decodes the frames
  ``[emitted - L, available)`` from scratch (``L`` = left context), so each
  frame is decoded about ``(L + chunk + H) / chunk`` times;
- ``stateful``: ``StreamingDecoder`` on ``StreamingCodec``: each frame is
  stepped once, in one call per chunk; a holdback under 10 frames adds a
  speculative edge per chunk (``peek``: the right edge decoded as if the
  utterance ended at the last frame, up to the chunk's end: 10 - H frames);
- ``per row``: the same, one frame per call (the shape a talker step gives).

Convolution multiply-accumulates are counted with
``torch.utils.flop_counter`` (convolutions are nearly all of the work); time
is process CPU time on one thread, the minimum of ``--repeats`` runs.

    python -m realtime_engine.tools.measure_codec_compute --dims real --frames 150
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from realtime_engine.codec.decoder import CodecDecoder, load_codec_decoder
from realtime_engine.codec.delay import apply_delay
from realtime_engine.codec.layout import CodecDims, random_codec_state_dict
from realtime_engine.codec.presets import PRESETS
from realtime_engine.codec.stream_core import StreamingCodec
from realtime_engine.codec.streaming import DecodeJob, StreamingDecoder, rows_to_frames
from realtime_engine.format import FRAMES_PER_SECOND, ChunkingParams


def plan(core: StreamingCodec, params: ChunkingParams, rows: np.ndarray) -> list[DecodeJob]:
    decoder = StreamingDecoder(core, params)
    jobs = [job for row in rows for job in decoder.plan_feed(row)] + decoder.plan_finish()
    decoder.close()
    return jobs


def windows(codec: CodecDecoder, frames: np.ndarray, jobs: list[DecodeJob], left: int) -> int:
    decoded = 0
    for job in jobs:
        start, end = max(0, job.emit_start - left), job.first_frame + job.new_frames
        codec.decode(torch.from_numpy(frames[None, :, start:end]))
        decoded += end - start
    return decoded


def stateful(core: StreamingCodec, params: ChunkingParams, rows: np.ndarray) -> int:
    decoder = StreamingDecoder(core, params)
    for row in rows:
        decoder.feed(row)
    decoder.finish()
    return decoder.frames_available


def per_row(core: StreamingCodec, jobs: list[DecodeJob]) -> int:
    core.reset([0])
    for job in jobs:
        for t in range(job.new_frames):
            core.step([0], torch.from_numpy(job.codes[None, :, t : t + 1]))
        if job.final:
            core.flush([0])
        elif job.speculative:
            core.peek([0], job.edge_samples)
    return sum(job.new_frames for job in jobs)


def measure(run: Callable[[], int], repeats: int) -> tuple[int, float, float]:
    """(frames decoded, conv MACs, min CPU seconds)."""
    with FlopCounterMode(display=False) as counter:
        decoded = run()
    seconds = []
    for _ in range(repeats):
        start = time.process_time()
        run()
        seconds.append(time.process_time() - start)
    return decoded, counter.get_total_flops() / 2, min(seconds)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dims", choices=["tiny", "real"], default="tiny")
    parser.add_argument("--frames", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--presets", default=",".join(PRESETS))
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    dims = CodecDims.tiny() if args.dims == "tiny" else CodecDims.higgs_v3()
    state = random_codec_state_dict(
        dims, torch.Generator().manual_seed(args.seed), include_encoder=False
    )
    codec = load_codec_decoder(state)
    core = StreamingCodec(codec, max_slots=1)
    rows = apply_delay(np.random.default_rng(args.seed).integers(0, 1024, (args.frames, 8)))
    frames = rows_to_frames(rows)
    audio_s = args.frames / FRAMES_PER_SECOND
    print(f"codec: {args.dims}, {args.frames} frames ({audio_s:.1f} s), one thread, CPU time")
    print()
    print("| preset | scheme | frames decoded | conv GMAC per audio s | CPU ms per audio s |")
    print("|---|---|---|---|---|")
    for name in args.presets.split(","):
        params = PRESETS[name]
        jobs = plan(core, params, rows)
        runs: dict[str, Callable[[], int]] = {
            "windows": partial(windows, codec, frames, jobs, params.left_context_frames),
            "stateful": partial(stateful, core, params, rows),
            "per row": partial(per_row, core, jobs),
        }
        base = None
        for scheme, run in runs.items():
            decoded, macs, seconds = measure(run, args.repeats)
            base = base or (macs, seconds)
            ratio = f" ({base[0] / macs:.2f}x / {base[1] / seconds:.2f}x less)" if base else ""
            print(
                f"| {name} | {scheme} | {decoded} | {macs / 1e9 / audio_s:.2f} "
                f"| {1000 * seconds / audio_s:.0f}{ratio if scheme != 'windows' else ''} |"
            )


if __name__ == "__main__":
    main()
