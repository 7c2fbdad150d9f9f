"""The served codec path under a long, changing load, without the engine: does it ever stall?

Drives :class:`~realtime_engine.talker.slot_codec.SlotCodec` the way the
engine core does (``realtime_engine/talker/vllm_audio.py``), with random
codes instead of a talker: every step writes one row per active slot into
the row table on the main stream (after a stand-in for the talker's forward
pass: bf16 matrix products of about ``--load-ms``) and records an event; the
host learns a step's rows only once its event has completed (polled, never
waited for), and then feeds the codec with ``rows_written``, plans the
chunks due and cuts them on the codec stream, copying each batch to pinned
host memory. Streams of random length end and new ones start in their
slots; now and then one is detached and attached again, so its codec state
is replayed from its rows (what preemption does).

A watchdog polls the events of the main stream (one per step, at most two
steps in flight, like vLLM's async scheduling) and of every chunk copy; if
one does not complete within ``--stall-s`` seconds, the run stops and
reports the stall (exit status 3) with what was in flight. Otherwise it
reports steps per second and the chunk latency (enqueue to host) by
percentile. ``--verify N`` keeps the rows and chunks of the first ``N``
streams and compares each finished stream's audio with the whole-utterance
decode of its frames (exit status 4 past ``--tolerance`` of the peak): the
check that the streams' ordering is right on the device. JSON to stdout and
``$OUT/codec_soak.json``.

    python -m bench.gpu.codec_soak --kernels compiled --slots 256 --seconds 120
    python -m bench.gpu.codec_soak --kernels eager --seconds 60 --verify 64
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

from bench.gpu.random_codec import random_codec
from realtime_engine.codec.decoder import CODEC_PRECISIONS, CodecDecoder
from realtime_engine.codec.delay import revert_delay
from realtime_engine.codec.presets import PRESETS, get_preset
from realtime_engine.format import CODEC_KERNELS, DEFAULT_CODEC_PRECISION, DELAY_ROWS
from realtime_engine.talker.slot_codec import SlotCodec


class Stall(RuntimeError):
    """A device event did not complete in time."""


class Mismatch(RuntimeError):
    """A verified stream's audio is not the whole-utterance decode of its frames."""


@dataclass
class Stream:
    key: str
    rows: int  # rows written so far
    total: int  # rows of the whole utterance (frames + the delay pattern's tail)
    known: int = 0  # rows the host knows are written (their step's event completed)
    history: list[np.ndarray] | None = None  # the rows, for --verify


@dataclass
class Received:
    """One chunk of a verified stream, on its way to the host."""

    key: str
    first_frame: int
    emit: int
    host: torch.Tensor
    row: int


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
        self.x = torch.tanh(self.x @ self.a)  # the library's set-up, not timed
        torch.cuda.synchronize(device)
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
    codec = random_codec(args.precision, args.tiny)
    device = codec.device
    cuda = device.type == "cuda"
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
    # steps on their way to the host: (event, [(slot, rows written by then)])
    statuses: deque[tuple[torch.cuda.Event | None, list[tuple[int, int]]]] = deque()
    verified: dict[str, Stream] = {}
    received: list[Received] = []
    counts = {"streams": 0, "ended": 0, "replays": 0, "chunks": 0, "steps": 0}

    def start(slot: int) -> None:
        key = f"s{counts['streams']}"
        counts["streams"] += 1
        frames = rng.randint(args.min_frames, args.max_frames)
        stream = Stream(key, 0, frames + DELAY_ROWS)
        if len(verified) < args.verify:
            stream.history = []
            verified[key] = stream
        streams[slot] = stream
        sc.open(key, slot, 0, chunking)

    def settle() -> None:
        """Apply the statuses whose step completed, oldest first (never waits)."""
        while statuses and (statuses[0][0] is None or statuses[0][0].query()):
            _, known = statuses.popleft()
            for slot, rows in known:
                s = streams[slot]
                s.known = rows
                sc.advance(s.key, rows, rows == s.total)

    for slot in range(args.slots):
        start(slot)
    began = time.perf_counter()
    while time.perf_counter() - began < args.seconds:
        load.run()
        # this step's row of every stream still generating, in one write
        slots = [slot for slot, s in streams.items() if s.rows < s.total]
        if slots:
            at = torch.tensor([[slot, streams[slot].rows] for slot in slots], device=device)
            rows = codes.integers(0, 1024, size=(len(slots), 8), dtype=np.int16)
            table[at[:, 0], at[:, 1]] = torch.from_numpy(rows).to(device)
            for slot, row in zip(slots, rows, strict=True):
                s = streams[slot]
                s.rows += 1
                if s.history is not None:
                    s.history.append(row)
        step_done = None
        if cuda:
            step_done = torch.cuda.Event()
            step_done.record()
            dog.add(f"step {counts['steps']}", step_done)
        statuses.append((step_done, [(slot, streams[slot].rows) for slot in slots]))
        settle()
        sc.feed(table, rows_written=True)
        for batch in sc.batches(sc.due()):
            with sc.on_codec_stream():
                pcm = sc.decode(batch)
                host = torch.empty(pcm.shape, dtype=pcm.dtype, pin_memory=cuda)
                host.copy_(pcm, non_blocking=cuda)
                event = None
                if cuda:
                    event = torch.cuda.Event()
                    event.record()
            dog.add(f"chunks of {len(batch)} at step {counts['steps']}", event)
            counts["chunks"] += len(batch)
            for i, plan in enumerate(batch):
                if plan.key in verified:
                    received.append(Received(plan.key, plan.first_frame, plan.emit, host, i))
        for slot, s in list(streams.items()):
            if s.known == s.total:  # the host saw its last row: its audio is planned
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
        "verified": verify(codec, verified, received, sc.hop, args.tolerance),
        "stall": None,
    }


def verify(
    codec: CodecDecoder,
    streams: dict[str, Stream],
    received: list[Received],
    hop: int,
    tolerance: float,
) -> dict[str, Any]:
    """Each finished verified stream's chunks against the whole decode of its frames:
    the worst error of the peak; :class:`Mismatch` past ``tolerance``."""
    audio: dict[str, np.ndarray] = {}
    for r in received:
        stream = streams[r.key]
        pcm = audio.setdefault(r.key, np.full((stream.total - DELAY_ROWS) * hop, np.nan))
        pcm[r.first_frame * hop : (r.first_frame + r.emit) * hop] = r.host[r.row, : r.emit * hop]
    worst, checked = 0.0, 0
    for key, pcm in audio.items():
        stream = streams[key]
        if np.isnan(pcm).any() or stream.history is None:
            continue  # not finished when the run stopped
        frames = revert_delay(np.stack(stream.history))
        want = codec.decode(torch.from_numpy(frames.T[None].astype(np.int64)).to(codec.device))
        want_np = want[0, 0].cpu().numpy()
        error = float(np.abs(pcm - want_np).max()) / max(float(np.abs(want_np).max()), 1e-12)
        worst, checked = max(worst, error), checked + 1
        if error > tolerance:
            raise Mismatch(f"stream {key}: {error:.3g} of the peak off its whole decode")
    return {"streams": checked, "worst_error_of_peak": worst, "tolerance": tolerance}


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
    ap.add_argument("--verify", type=int, default=0, help="streams checked against a whole decode")
    ap.add_argument("--tolerance", type=float, default=2e-3, help="of the peak (TF32: ~4e-4)")
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
    except Mismatch as e:
        report = {"kernels": args.kernels, "slots": args.slots, "mismatch": str(e)}
        status = 4
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "codec_soak.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report), flush=True)
    if status == 3:  # a stalled device may hang the interpreter's CUDA teardown
        os._exit(status)
    return status


if __name__ == "__main__":
    sys.exit(main())
