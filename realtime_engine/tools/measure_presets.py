"""Measure the streaming-codec presets: edge error, first-audio cost, decode time.

For each preset, random code streams are decoded chunk by chunk with the
StreamingDecoder and compared with a whole-utterance decode of the same
frames (max abs error and error relative to the utterance peak). The
first-audio cost is the number of talker rows needed before the first chunk
(7 delay rows + first_chunk_frames + holdback), also in ms at a given row
rate. ``--timing`` times whole decodes of the first and steady-state window
lengths the previous windowed decoder used (for comparison; the stateful
codec's compute is measured by ``realtime_engine.tools.measure_codec_compute``).
The playback table runs each preset's chunk schedule, with and without the
chunk-size ramp, through the client playback simulator at a few talker
speeds (multiples of real time, 25 rows/s).

    python -m realtime_engine.tools.measure_presets --dims tiny --streams 40
    python -m realtime_engine.tools.measure_presets --dims real --streams 3 --timing

Random weights and uniformly random codes are a harsh case: real speech codes
are correlated frame to frame, so edge errors on real audio are expected to
be smaller. The exact presets are exact regardless of weights.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch

from realtime_engine.codec.decoder import CodecDecoder, extract_codec_state, load_codec_decoder
from realtime_engine.codec.delay import apply_delay
from realtime_engine.codec.layout import CODEC_PREFIX, CodecDims, random_codec_state_dict
from realtime_engine.codec.playback import REAL_TIME_ROWS_PER_S, chunk_arrivals, simulate_playback
from realtime_engine.codec.presets import PRESETS, chunk_schedule, first_chunk_rows
from realtime_engine.codec.stream_core import StreamingCodec
from realtime_engine.codec.streaming import StreamingDecoder, rows_to_frames
from realtime_engine.engines.base import ChunkingParams
from realtime_engine.format import DELAY_ROWS

FRAME_MS = 40.0


@dataclass
class EdgeError:
    preset: str
    max_abs: float  # worst over streams
    max_rel_peak: float  # worst over streams, relative to each stream's peak
    median_rel_peak: float
    worst_snr_db: float  # whole-decode power over error power, worst stream


@dataclass
class FirstAudio:
    preset: str
    rows: int
    ms_at_25_rows_per_s: float
    ms_at_step: float


@dataclass
class DecodeTime:
    preset: str
    first_window_frames: int
    first_window_ms: float
    steady_window_frames: int
    steady_window_ms: float
    steady_chunk_audio_ms: float


def random_rows(frames: int, rng: np.random.Generator) -> np.ndarray:
    return apply_delay(rng.integers(0, 1024, size=(frames, 8)))


def edge_error(
    codec: CodecDecoder, name: str, params: ChunkingParams, streams: int, frames: int, seed: int
) -> EdgeError:
    rng = np.random.default_rng(seed)
    streaming = StreamingCodec(codec, max_slots=1)
    abs_errors, rel_errors, snrs = [], [], []
    for _ in range(streams):
        rows = random_rows(frames, rng)
        decoder = StreamingDecoder(streaming, params)
        chunks = [c for row in rows for c in decoder.feed(row)] + decoder.finish()
        streamed = np.concatenate(chunks)
        whole = codec.decode_numpy(rows_to_frames(rows)[None])[0]
        err = float(np.abs(streamed - whole).max())
        abs_errors.append(err)
        rel_errors.append(err / float(np.abs(whole).max()))
        noise = float(np.mean((streamed - whole) ** 2))
        snrs.append(10 * np.log10(float(np.mean(whole**2)) / max(noise, 1e-30)))
    return EdgeError(
        name, max(abs_errors), max(rel_errors), statistics.median(rel_errors), min(snrs)
    )


def holdback_sweep(
    codec: CodecDecoder, holdbacks: list[int], streams: int, frames: int, seed: int
) -> list[EdgeError]:
    return [
        edge_error(codec, f"H={h}", ChunkingParams(1, 10, 10, h), streams, frames, seed)
        for h in holdbacks
    ]


def first_audio(name: str, params: ChunkingParams, step_ms: float) -> FirstAudio:
    rows = first_chunk_rows(params)
    return FirstAudio(name, rows, rows * FRAME_MS, rows * step_ms)


@dataclass
class Stalls:
    longest_ms: float
    total_ms: float
    pauses: int  # underruns after the first chunk


@dataclass
class Playback:
    preset: str
    speed: float  # talker rows per second / 25
    schedule: list[int]  # the preset's ramp, first chunk to steady size
    ramp: Stalls  # the preset's chunk_growth
    matched: Stalls  # chunk_growth = min(speed, the preset's)
    plain: Stalls  # no ramp: first chunk, then chunk_frames at once


def stalls(params: ChunkingParams, speed: float, frames: int) -> Stalls:
    report = simulate_playback(chunk_arrivals(params, frames, speed * REAL_TIME_ROWS_PER_S))
    return Stalls(report.longest_stall_s * 1000, report.stall_s * 1000, report.underruns)


def playback(name: str, params: ChunkingParams, speed: float, frames: int) -> Playback:
    growth = params.chunk_growth or speed
    return Playback(
        name,
        speed,
        chunk_schedule(params),
        stalls(params, speed, frames),
        stalls(dataclasses.replace(params, chunk_growth=min(speed, growth)), speed, frames),
        stalls(dataclasses.replace(params, chunk_growth=None), speed, frames),
    )


# Wall clock by default; with --clock cpu (and one thread) the process CPU
# time, which leaves out time spent waiting for a core on a loaded machine.
CLOCK: Callable[[], float] = time.perf_counter

# Summary of repeated timings: median by default; "min" is the better estimate
# of compute cost on a machine shared with other work.
TIME_STAT: dict[str, Callable[[list[float]], float]] = {
    "median": statistics.median,
    "min": min,
}


def time_window(
    codec: CodecDecoder, frames: int, repeats: int, batch: int = 1, stat: str = "median"
) -> float:
    codes = np.random.default_rng(0).integers(0, 1024, size=(batch, 8, frames))
    codec.decode_numpy(codes)  # warm-up
    samples = []
    for _ in range(repeats):
        start = CLOCK()
        codec.decode_numpy(codes)
        samples.append((CLOCK() - start) * 1000)
    return float(TIME_STAT[stat](samples))


def decode_time(
    codec: CodecDecoder, name: str, params: ChunkingParams, repeats: int, stat: str
) -> DecodeTime:
    first = params.first_chunk_frames + params.right_holdback_frames
    steady = params.left_context_frames + params.chunk_frames + params.right_holdback_frames
    return DecodeTime(
        name,
        first,
        time_window(codec, first, repeats, stat=stat),
        steady,
        time_window(codec, steady, repeats, stat=stat),
        params.chunk_frames * FRAME_MS,
    )


def markdown(results: dict[str, object]) -> str:
    lines = [f"codec: {results['dims']}, {results['streams']} streams x {results['frames']} frames"]
    lines += [
        "",
        "| preset | max abs error | max error / peak | median error / peak | worst SNR (dB) |",
    ]
    lines += ["|---|---|---|---|---|"]
    for e in results["edge_error"] + results.get("holdback_sweep", []):  # type: ignore[operator]
        lines.append(
            f"| {e['preset']} | {e['max_abs']:.2e} | {e['max_rel_peak']:.2e} "
            f"| {e['median_rel_peak']:.2e} | {e['worst_snr_db']:.1f} |"
        )
    step = results["step_ms"]
    lines += ["", f"| preset | rows before first chunk | ms at 25 rows/s | ms at {step} ms/step |"]
    lines += ["|---|---|---|---|"]
    for f in results["first_audio"]:  # type: ignore[attr-defined]
        lines.append(
            f"| {f['preset']} | {f['rows']} | {f['ms_at_25_rows_per_s']:.0f} "
            f"| {f['ms_at_step']:.1f} |"
        )
    if results.get("playback"):
        lines += [
            "",
            "longest / total stall after the first chunk (pauses), 150-frame utterances:",
            "",
            "| preset | ramp | speed | preset ramp | growth = speed | no ramp |",
            "|---|---|---|---|---|---|",
        ]

        def cell(x: dict[str, float]) -> str:
            return f"{x['longest_ms']:.0f} / {x['total_ms']:.0f} ms ({x['pauses']:.0f})"

        for b in results["playback"]:  # type: ignore[attr-defined]
            lines.append(
                f"| {b['preset']} | {', '.join(map(str, b['schedule']))} | {b['speed']:g}x "
                f"| {cell(b['ramp'])} | {cell(b['matched'])} | {cell(b['plain'])} |"
            )
    if results.get("decode_time"):
        lines += [
            "",
            f"decode time ({results['machine']}, {results['threads']} threads, "
            f"{results['clock']} clock, {results['stat']} of {results['repeats']}):",
            "",
        ]
        lines += ["| preset | first window | ms | steady window | ms | audio per chunk (ms) |"]
        lines += ["|---|---|---|---|---|---|"]
        for d in results["decode_time"]:  # type: ignore[attr-defined]
            lines.append(
                f"| {d['preset']} | {d['first_window_frames']} | {d['first_window_ms']:.0f} "
                f"| {d['steady_window_frames']} | {d['steady_window_ms']:.0f} "
                f"| {d['steady_chunk_audio_ms']:.0f} |"
            )
        lines += ["", "| preset | steady window | batch | ms per call | ms per window |"]
        lines += ["|---|---|---|---|---|"]
        for t in results["batch_time"]:  # type: ignore[attr-defined]
            lines.append(
                f"| {t['preset']} | {t['window_frames']} | {t['batch']} | {t['ms']:.1f} "
                f"| {t['ms'] / t['batch']:.2f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dims", choices=["tiny", "real"], default="tiny")
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--frames", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step-ms", type=float, default=3.5, help="talker ms per decode step")
    parser.add_argument("--sweep", action="store_true", help="also sweep holdback 0..10")
    parser.add_argument("--timing", action="store_true", help="time decode per chunk")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--stat", choices=sorted(TIME_STAT), default="median")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    parser.add_argument(
        "--batches",
        type=lambda text: [int(x) for x in text.split(",")],
        default=[1],
        help="batch sizes for steady-window timing, e.g. 1,8,32",
    )
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sweep-streams", type=int, default=5)
    parser.add_argument(
        "--checkpoint",
        help="safetensors file with real codec weights (bundled or talker layout) "
        "instead of random ones",
    )
    parser.add_argument(
        "--speeds",
        type=lambda text: [float(x) for x in text.split(",") if x],
        default=[1.0, 1.25, 1.5, 2.0, 3.0],
        help="talker speeds (x real time) for the playback table; empty: skip",
    )
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    dims = CodecDims.tiny() if args.dims == "tiny" else CodecDims.higgs_v3()
    if args.checkpoint:
        from safetensors.torch import load_file

        state = load_file(args.checkpoint)
        if any(k.startswith(CODEC_PREFIX) for k in state):
            state = extract_codec_state(state)
    else:
        generator = torch.Generator().manual_seed(args.seed)
        state = random_codec_state_dict(dims, generator, include_encoder=False)
    codec = load_codec_decoder(state, device=args.device)

    results: dict[str, object] = {
        "dims": args.checkpoint or args.dims,
        "streams": args.streams,
        "frames": args.frames,
        "step_ms": args.step_ms,
        "delay_rows": DELAY_ROWS,
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "threads": args.threads,
        "stat": args.stat,
        "clock": args.clock,
        "repeats": args.repeats,
    }
    results["edge_error"] = [
        asdict(edge_error(codec, n, p, args.streams, args.frames, args.seed))
        for n, p in PRESETS.items()
        if args.streams > 0  # --streams 0: timing only
    ]
    if args.sweep:
        results["holdback_sweep"] = [
            asdict(e)
            for e in holdback_sweep(codec, list(range(11)), args.streams, args.frames, args.seed)
        ]
    results["first_audio"] = [asdict(first_audio(n, p, args.step_ms)) for n, p in PRESETS.items()]
    results["playback"] = [
        asdict(playback(n, p, speed, frames=150))
        for n, p in PRESETS.items()
        for speed in args.speeds
    ]
    if args.timing:
        results["decode_time"] = [
            asdict(decode_time(codec, n, p, args.repeats, args.stat)) for n, p in PRESETS.items()
        ]
        results["batch_time"] = [
            {
                "preset": n,
                "window_frames": w,
                "batch": b,
                "ms": time_window(codec, w, args.repeats, b, args.stat),
            }
            for n, p in PRESETS.items()
            for w in [p.left_context_frames + p.chunk_frames + p.right_holdback_frames]
            for b in args.batches
        ]
    print(markdown(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
