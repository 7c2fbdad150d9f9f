"""The served codec path under a long, changing load, without the engine: does it ever stall?

Drives :class:`~realtime_engine.talker.slot_codec.SlotCodec` the way the
engine core does (``realtime_engine/talker/vllm_audio.py``), with random
codes instead of a talker: every step writes one row per active slot into
the row table on the main stream (after a stand-in for the talker's forward
pass: bf16 matrix products of about ``--load-ms``), then feeds the codec,
plans the chunks due and cuts them on the codec stream, copying each batch
to pinned host memory. Streams of random length end and new ones start in
their slots; now and then one is detached and attached again, so its codec
state is replayed from its rows (what preemption does).

A watchdog polls the events of the main stream (one per step, at most two
steps in flight, like vLLM's async scheduling) and of every chunk copy; if
one does not complete within ``--stall-s`` seconds, the run stops and
reports the stall (exit status 3) with what was in flight. Otherwise it
reports steps per second and the chunk latency (enqueue to host) by
percentile. JSON to stdout and ``$OUT/codec_soak.json``.

    python -m bench.gpu.codec_soak --kernels compiled --slots 256 --seconds 120
    python -m bench.gpu.codec_soak --tiny --slots 4 --seconds 2     # CPU smoke check
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from realtime_engine.codec.decoder import CODEC_PRECISIONS, CodecDecoder
from realtime_engine.codec.layout import CodecDims
from realtime_engine.codec.presets import PRESETS, get_preset
from realtime_engine.format import CODEC_KERNELS, DEFAULT_CODEC_PRECISION, DELAY_ROWS
from realtime_engine.talker.slot_codec import SlotCodec


class Stall(RuntimeError):
    """A device event did not complete in time."""


@dataclass
class Stream:
    key: str
    rows: int  # rows written so far
    total: int  # rows of the whole utterance (frames + the delay pattern's tail)


@dataclass
class InFlight:
    what: str
    event: torch.cuda.Event | None
    since: float


class Watchdog:
    """Completion times of device events; a :class:`Stall` when one is late."""

    def __init__(self, stall_s: float) -> None:
        self.stall_s = stall_s
        self.pending: deque[InFlight] = deque()
        self.latencies: list[float] = []

    def add(self, what: str, event: torch.cuda.Event | None) -> None:
        self.pending.append(InFlight(what, event, time.perf_counter()))

    def poll(self) -> None:
        while self.pending:
            item = self.pending[0]
            if item.event is not None and not item.event.query():
                if time.perf_counter() - item.since > self.stall_s:
                    late = [p.what for p in self.pending][:8]
                    waited = f"{self.stall_s:.0f} s"
                    raise Stall(f"{item.what} not done after {waited}; in flight: {late}")
                return
            self.pending.popleft()
            self.latencies.append(time.perf_counter() - item.since)

    def wait_until(self, keep: int) -> None:
        """Block (polling) until at most ``keep`` events are in flight."""
        while len(self.pending) > keep:
            self.poll()


class Load:
    """A stand-in for the talker's forward pass on the main stream (CUDA only)."""

    def __init__(self, device: torch.device, load_ms: float) -> None:
        self.ops = 0
        if device.type != "cuda" or load_ms <= 0:
            return
        self.a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        self.x = torch.randn(64, 8192, device=device, dtype=torch.bfloat16)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            self.x = torch.tanh(self.x @ self.a)
        end.record()
        end.synchronize()
        per_op = start.elapsed_time(end) / 10
        self.ops = max(1, round(load_ms / per_op))

    def run(self) -> None:
        for _ in range(self.ops):
            self.x = torch.tanh(self.x @ self.a)


def soak(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    cuda = device.type == "cuda"
    dims = CodecDims.tiny() if args.tiny else CodecDims.higgs_v3()
    codec = CodecDecoder(dims).to(device).eval()
    codec.set_precision(args.precision)
    rng = random.Random(args.seed)
    codes = np.random.default_rng(args.seed)
    sc = SlotCodec(codec, slots=args.slots, max_batch=64, graphs=cuda, kernels=args.kernels)
    t = time.perf_counter()
    sc.warm_up()
    warm_s = time.perf_counter() - t
    positions = args.max_frames + DELAY_ROWS + 1
    table = torch.zeros(args.slots, positions, 8, dtype=torch.int16, device=device)
    load = Load(device, args.load_ms)
    chunking = get_preset(args.preset)
    dog = Watchdog(args.stall_s)
    streams: dict[int, Stream] = {}
    counts = {"streams": 0, "ended": 0, "replays": 0, "chunks": 0, "steps": 0}

    def start(slot: int) -> None:
        key = f"s{counts['streams']}"
        counts["streams"] += 1
        frames = rng.randint(args.min_frames, args.max_frames)
        streams[slot] = Stream(key, 0, frames + DELAY_ROWS)
        sc.open(key, slot, 0, chunking)

    for slot in range(args.slots):
        start(slot)
    began = time.perf_counter()
    while time.perf_counter() - began < args.seconds:
        load.run()
        slots = list(streams)  # this step's row of every active stream, in one write
        at = torch.tensor([[slot, streams[slot].rows] for slot in slots], device=device)
        rows = torch.from_numpy(codes.integers(0, 1024, size=(len(slots), 8), dtype=np.int16))
        table[at[:, 0], at[:, 1]] = rows.to(device)
        for s in streams.values():
            s.rows += 1
            sc.advance(s.key, s.rows, s.rows == s.total)
        if cuda:
            step_done = torch.cuda.Event()
            step_done.record()
            dog.add(f"step {counts['steps']}", step_done)
        sc.feed(table)
        for batch in sc.batches(sc.due()):
            pcm = sc.decode(batch)
            with sc.on_codec_stream():
                host = torch.empty(pcm.shape, dtype=pcm.dtype, pin_memory=cuda)
                host.copy_(pcm, non_blocking=cuda)
                event = None
                if cuda:
                    event = torch.cuda.Event()
                    event.record()
            dog.add(f"chunks of {len(batch)} at step {counts['steps']}", event)
            counts["chunks"] += len(batch)
        for slot, s in list(streams.items()):
            if s.rows == s.total:
                sc.detach(s.key)
                counts["ended"] += 1
                start(slot)
            elif rng.random() < args.replay_rate:  # preempted and back: state replayed
                moved = sc.detach(s.key)
                if moved is not None:
                    sc.attach(moved, slot)
                    counts["replays"] += 1
        counts["steps"] += 1
        dog.poll()
        dog.wait_until(keep=2 * (1 + args.slots // 64) + 2)
    dog.wait_until(keep=0)
    elapsed = time.perf_counter() - began
    lat = np.array(dog.latencies) * 1000
    return {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "dims": "tiny" if args.tiny else "higgs_v3",
        "kernels": args.kernels,
        "precision": args.precision,
        "slots": args.slots,
        "warm_up_s": round(warm_s, 2),
        "seconds": round(elapsed, 2),
        **counts,
        "steps_per_s": round(counts["steps"] / elapsed, 1),
        "load_ops_per_step": load.ops,
        "event_latency_ms": {q: round(float(np.percentile(lat, q)), 2) for q in (50, 90, 99, 100)}
        if lat.size
        else {},
        "stall": None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--kernels", choices=CODEC_KERNELS, default="compiled")
    ap.add_argument("--precision", choices=CODEC_PRECISIONS, default=DEFAULT_CODEC_PRECISION)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="exact")
    ap.add_argument("--slots", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--min-frames", type=int, default=25)
    ap.add_argument("--max-frames", type=int, default=250)
    ap.add_argument("--load-ms", type=float, default=4.0, help="main-stream work per step")
    ap.add_argument("--replay-rate", type=float, default=0.002, help="per stream and step")
    ap.add_argument("--stall-s", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="tiny codec on the CPU (smoke check)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    if not 1 <= args.min_frames <= args.max_frames:
        ap.error("need 1 <= --min-frames <= --max-frames")
    status = 0
    try:
        report = soak(args)
    except Stall as e:
        report = {"kernels": args.kernels, "slots": args.slots, "stall": str(e)}
        status = 3
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "codec_soak.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report), flush=True)
    if status:  # a stalled device may hang the interpreter's CUDA teardown
        os._exit(status)
    return status


if __name__ == "__main__":
    sys.exit(main())
