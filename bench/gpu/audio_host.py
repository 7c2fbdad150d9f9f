"""The engine core's audio hooks alone: host time per step, by hook.

At 256 streams the served engine core's main thread is busy nearly all the
time (docs/bench/RESULTS.md sections 22-23: py-spy found it waiting for the
device in 10% of its samples), so every millisecond its hooks spend on the
host is a millisecond of step. This drives
:class:`~realtime_engine.talker.vllm_audio.VllmAudio` (the object the
plugin's hooks call) the way vLLM's engine core does under async scheduling,
with random rows instead of a talker, and times each hook:

1. ``remove`` for the requests whose final row the host has seen (vLLM
   removes them at the start of the next step), then ``fence`` and ``open``
   for the new request in each freed slot;
2. ``poll`` (the plugin's ``prepare_inputs``);
3. a stand-in for vLLM's own host work (``--host-ms`` of Python holding the
   interpreter's lock, as the scheduler does) and for the forward pass on the
   main stream (``--load-ms`` of bf16 products), then the step's rows written
   into the slot table and ``after_step`` with the step's packed status (the
   plugin's ``sample``);
4. a wait for the step before the last (vLLM's ``get_output``: at most two
   steps in flight).

Streams are ``--frames`` long (the first generation shorter, at random, so
that streams end at a steady rate). JSON to stdout and
``$OUT/audio_host.json``: milliseconds per step of host time in each hook,
of the stand-in's launches, and of the wait, the messages and bytes a
reader process received (every chunk goes to it, as to the gateway), and
(``--profile``) the functions with the most own time under cProfile.
``codec_calls`` counts the codec's calls a step by frames a slot
(``--frames-per-call``: with more than one, a step's slots split into a call
per frame count, and every call pays a small batch's fixed cost).

    python -m bench.gpu.audio_host --slots 256 --steps 1500
    python -m bench.gpu.audio_host --tiny --slots 16 --steps 60     # CPU smoke check
    python -m bench.gpu.audio_host --tiny --null-codec --profile 40  # the bookkeeping alone
    python -m bench.gpu.audio_host --tiny --null-codec --frames-per-call 4  # the calls a step
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import random
import subprocess
import sys
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import zmq

from bench.gpu.codec_soak import Load
from bench.gpu.random_codec import random_codec
from bench.json_out import write_report
from realtime_engine.codec.decoder import CODEC_PRECISIONS
from realtime_engine.codec.presets import PRESETS, get_preset
from realtime_engine.format import (
    CODEC_KERNELS,
    DEFAULT_CODEC_FRAMES_PER_CALL,
    DEFAULT_CODEC_PRECISION,
    DELAY_ROWS,
)
from realtime_engine.talker.types import NUM_CODEBOOKS
from realtime_engine.talker.vllm_audio import VllmAudio
from realtime_engine.talker.vllm_protocol import TalkerArgs

HOOKS = ("remove", "open", "poll", "vllm_host", "load", "rows", "after_step", "wait")
PROMPT_LEN = 32


class NullCodecSlots:
    """:class:`~realtime_engine.talker.codec_slots.CodecSlots` without device work:
    steps decode nothing, chunks are silence. With it the hooks' time is the
    host's bookkeeping alone (``--null-codec``)."""

    def __init__(self, real: Any) -> None:
        self.hop, self.delay, self.device = real.hop, real.delay, real.device

    def on_codec_stream(self) -> Any:
        return contextlib.nullcontext()

    def warm_up(self) -> None:
        pass

    def fence(self) -> None:
        pass

    def reset(self, slots: Any) -> None:
        pass

    def replay(self, *args: Any) -> None:
        pass

    def step(self, slots: Any, rows: Any, table: Any, **kwargs: Any) -> None:
        pass

    def chunks(self, slots: Any, starts: Any, ends: Any, fed: Any) -> torch.Tensor:
        length = max(e - s for s, e in zip(starts, ends, strict=True))
        return torch.zeros(len(slots), length, device=self.device)


class CallCensus:
    """What the codec's steps are, step by step: how many calls, of how many frames a
    slot, over how many slots. With several frames a call, a step's slots split into
    a call per frame count, and each call pays a small batch's fixed cost."""

    def __init__(self) -> None:
        self.on = False
        self.calls: Counter[int] = Counter()  # by frames a slot
        self.slots: Counter[int] = Counter()
        self.calls_in_step: Counter[int] = Counter()  # steps by how many calls they made
        self._this_step = 0

    def wrap(self, device_codec: Any) -> None:
        inner = device_codec.step

        def counted(slots: Any, rows: Any, table: Any, **kwargs: Any) -> Any:
            if self.on:
                frames = kwargs.get("frames", 1)
                self.calls[frames] += 1
                self.slots[frames] += len(slots)
                self._this_step += 1
            return inner(slots, rows, table, **kwargs)

        device_codec.step = counted

    def end_step(self) -> None:
        if self.on:
            self.calls_in_step[self._this_step] += 1
        self._this_step = 0

    def report(self, steps: int) -> dict[str, Any]:
        return {
            "calls_per_step": round(sum(self.calls.values()) / steps, 3),
            "steps_by_calls": {str(k): v for k, v in sorted(self.calls_in_step.items())},
            "by_frames": {
                str(n): {
                    "calls_per_step": round(self.calls[n] / steps, 3),
                    "slots_per_call": round(self.slots[n] / self.calls[n], 1),
                }
                for n in sorted(self.calls)
            },
        }


class Breakdown:
    """Inclusive host time of chosen methods (``--breakdown``): each is replaced,
    on its instance or class, by a wrapper that times it. Nested entries
    overlap; a wrapper costs about a microsecond a call."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)
        self.calls: Counter[str] = Counter()
        self.on = False

    def wrap(self, owner: Any, name: str, label: str) -> None:
        fn = getattr(owner, name)
        clock = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if clock.on:
                    clock.spent[label] += time.perf_counter() - start
                    clock.calls[label] += 1

        setattr(owner, name, timed)

    def report(self, steps: int) -> dict[str, tuple[float, float]]:
        """Per label: (ms per step, calls per step), the costliest first."""
        return {
            label: (round(1000 * s / steps, 3), round(self.calls[label] / steps, 2))
            for label, s in sorted(self.spent.items(), key=lambda item: -item[1])
        }


def instrument(audio: VllmAudio, breakdown: Breakdown) -> None:
    for name in ("_settle", "_decode_due", "_feed", "_decode", "_queue", "_count_step"):
        breakdown.wrap(audio, name, f"VllmAudio.{name}")
    for name in ("feed", "due", "batches", "decode"):
        breakdown.wrap(audio.codec, name, f"SlotCodec.{name}")
    device_codec = audio.codec.device_codec
    for name in ("step", "chunks", "_peek", "_host_index", "_gather_on_side", "reset", "fence"):
        if hasattr(device_codec, name):
            breakdown.wrap(device_codec, name, f"CodecSlots.{name}")
    if torch.cuda.is_available():
        breakdown.wrap(torch.cuda.CUDAGraph, "replay", "CUDAGraph.replay")
        breakdown.wrap(torch.cuda.Event, "record", "Event.record")
        breakdown.wrap(torch.cuda.Event, "query", "Event.query")
    breakdown.wrap(torch.Tensor, "pin_memory", "Tensor.pin_memory")


class HookClock:
    """Host seconds spent in each hook, counted from ``--warmup`` steps on."""

    def __init__(self) -> None:
        self.spent = dict.fromkeys(HOOKS, 0.0)
        self.on = False

    def timed(self, hook: str, fn: Callable[..., Any], *args: Any) -> Any:
        start = time.perf_counter()
        out = fn(*args)
        if self.on:
            self.spent[hook] += time.perf_counter() - start
        return out


def talker_args(key: str, preset: str, endpoint: str) -> TalkerArgs:
    return TalkerArgs(
        correlation_id=key,
        endpoint=endpoint,
        audio_token_id=1,
        eos_token_id=2,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        ras_window=0,
        ras_max_repeat=0,
        seed=0,
        eoc_not_before=0,
        eoc_at=0,
        chunking=TalkerArgs.chunking_fields(get_preset(preset)),
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1000)
    codec = random_codec(args.precision, args.tiny)
    device = codec.device
    cuda = device.type == "cuda"
    rng = random.Random(args.seed)
    positions = PROMPT_LEN + args.frames + DELAY_ROWS + 1
    table = torch.zeros(args.slots, positions, NUM_CODEBOOKS, dtype=torch.int16, device=device)
    audio = VllmAudio(
        codec,
        table,
        max_batch=64,
        keep=2 * args.slots,
        graphs=cuda,
        kernels=args.kernels,
        decode_thread=args.decode_thread,
        frames_per_call=args.frames_per_call,
    )
    if args.null_codec:
        audio.codec.device_codec = NullCodecSlots(audio.codec.device_codec)  # type: ignore[assignment]
    census = CallCensus()
    census.wrap(audio.codec.device_codec)
    began = time.perf_counter()
    audio.warm_up()
    warm_s = time.perf_counter() - began
    load = Load(device, args.load_ms)
    breakdown = Breakdown()
    if args.breakdown:
        instrument(audio, breakdown)
    # Every chunk goes to a process that reads and discards it, as the gateway's
    # receiver reads it: unread, the PUSH socket would queue every chunk (a
    # megabyte a step at 256 slots) and the sender would pay for the growth.
    endpoint = f"ipc:///tmp/audio_host_{os.getpid()}"
    drain = Drain(endpoint)
    codes = torch.randint(0, 1024, (args.slots, NUM_CODEBOOKS), device=device)
    clock = HookClock()
    total = [0] * args.slots  # rows each slot's request will have
    rows = [0] * args.slots  # rows written so far
    keys: list[str | None] = [None] * args.slots
    finished_known: list[int] = []  # slots whose final row the host has seen
    in_flight: deque[tuple[torch.cuda.Event | None, list[int]]] = deque()
    counts = {"streams": 0, "ended": 0}

    def start(slot: int, frames: int) -> None:
        key = f"r{counts['streams']}"
        counts["streams"] += 1
        keys[slot], rows[slot], total[slot] = key, 0, frames + DELAY_ROWS
        clock.timed("open", audio.fence)
        clock.timed("open", audio.open, talker_args(key, args.preset, endpoint), slot, PROMPT_LEN)

    for slot in range(args.slots):
        start(slot, rng.randint(1, args.frames))
    profiler = cProfile.Profile() if args.profile else None
    measured_from = 0.0
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            clock.on = breakdown.on = census.on = True
            measured_from = time.perf_counter()
            if profiler is not None:
                profiler.enable()
        for slot in finished_known:
            key = keys[slot]
            assert key is not None
            clock.timed("remove", audio.remove, key)
            counts["ended"] += 1
            start(slot, args.frames)
        finished_known.clear()
        clock.timed("poll", audio.poll)
        clock.timed("vllm_host", spin, args.host_ms / 1000)
        clock.timed("load", load.run)
        live = [s for s in range(args.slots) if rows[s] < total[s]]
        clock.timed("rows", write_rows, table, codes, live, rows, device)
        packed = clock.timed("rows", pack_status, live, rows, total, device)
        clock.timed("after_step", audio.after_step, packed, [keys[s] for s in live])
        census.end_step()
        for s in live:
            rows[s] += 1
        event = None
        if cuda:
            event = torch.cuda.Event()
            event.record()
        in_flight.append((event, [s for s in live if rows[s] == total[s]]))
        while len(in_flight) > 1:  # vLLM's get_output: the step before this one
            done_event, ended = in_flight.popleft()
            if done_event is not None:
                clock.timed("wait", done_event.synchronize)
            finished_known.extend(ended)
    if profiler is not None:
        profiler.disable()
    elapsed = time.perf_counter() - measured_from
    if cuda:
        torch.cuda.synchronize()
    audio._outgoing.join()  # the sender thread has sent every batch (CUDA)
    # the stop message behind the last chunk, on the pusher's own socket (one pipe, in order)
    received = drain.stop(audio._pusher._socket(endpoint))
    audio._pusher.close()
    per_step = {hook: round(1000 * s / args.steps, 3) for hook, s in clock.spent.items()}
    hooks_ms = sum(per_step[h] for h in ("remove", "open", "poll", "after_step"))
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "dims": "tiny" if args.tiny else "higgs_v3",
        "kernels": "none" if args.null_codec else args.kernels,
        "decode_thread": args.decode_thread,
        "frames_per_call": args.frames_per_call,
        "switch_interval_ms": round(1000 * sys.getswitchinterval(), 3),
        "slots": args.slots,
        "preset": args.preset,
        "frames": args.frames,
        "steps": args.steps,
        "warm_up_s": round(warm_s, 1),
        "messages_received": received["messages"],
        "bytes_received": received["bytes"],
        "load_ops_per_step": load.ops,
        "step_ms": round(1000 * elapsed / args.steps, 3),
        "host_ms_per_step": per_step,
        "audio_hooks_ms_per_step": round(hooks_ms, 3),
        "codec_calls": census.report(args.steps),
        **counts,
    }
    if args.replay_probe and cuda:
        report["replay_host_us"] = replay_probe(audio)
    if args.breakdown:
        report["breakdown_ms_and_calls_per_step"] = breakdown.report(args.steps)
    if profiler is not None:
        report["profile"] = top_functions(profiler, args.profile)
    return report


_DRAIN = """
import json, sys, zmq
ctx = zmq.Context()
pull = ctx.socket(zmq.PULL)
pull.bind(sys.argv[1])
print("ready", flush=True)
messages = size = 0
while True:
    frames = pull.recv_multipart(copy=False)
    if len(frames) == 1:
        break
    messages += 1
    size += sum(len(f.buffer) for f in frames)
print(json.dumps({"messages": messages, "bytes": size}), flush=True)
"""


class Drain:
    """A process that binds ``endpoint``, reads every message and drops it; on
    :meth:`stop`, how many it read and their bytes."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _DRAIN, endpoint], stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the drain process did not start")

    def stop(self, sender: zmq.Socket[bytes]) -> dict[str, int]:
        """Ends the drain with a one-frame message through ``sender``, the socket
        that sent the rest, so that it comes after all of them."""
        sender.send(b"stop")
        out, _ = self.proc.communicate(timeout=120)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.endpoint[len("ipc://") :])
        counts: dict[str, int] = json.loads(out.strip().splitlines()[-1])
        return counts


def spin(seconds: float) -> None:
    """Busy Python for ``seconds``: the lock held, as vLLM's scheduler holds it."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def replay_probe(audio: VllmAudio, repeats: int = 20) -> dict[str, float]:
    """Host time of one replay of each captured codec graph with the device idle
    (median microseconds): what launching it costs the engine's thread."""
    device_codec = audio.codec.device_codec
    graphs = {
        f"step {size}" + (f" of {n} frames" if n > 1 else ""): g
        for (n, size), g in device_codec._graphs.items()
    }
    graphs |= {f"tail {size}x{n}": g for (size, n), g in device_codec._tail_graphs.items()}
    out = {}
    with device_codec.on_codec_stream():
        for name, graph in sorted(graphs.items()):
            times = []
            for _ in range(repeats):
                torch.cuda.synchronize()
                start = time.perf_counter()
                graph.replay()
                times.append(time.perf_counter() - start)
            out[name] = round(1e6 * float(np.median(times)), 1)
    torch.cuda.synchronize()
    return out


def write_rows(
    table: torch.Tensor, codes: torch.Tensor, live: list[int], rows: list[int], device: Any
) -> None:
    """The step's row of every live slot, in one write (the sampler's graph does
    the same on the device)."""
    if not live:
        return
    at = torch.tensor([[s, PROMPT_LEN + rows[s]] for s in live], device=device)
    table[at[:, 0], at[:, 1]] = codes[at[:, 0]].to(table.dtype)


def pack_status(live: list[int], rows: list[int], total: list[int], device: Any) -> torch.Tensor:
    """``[batch, N + 3]`` as the sampler packs it, a batch row per live slot: codes
    (unused here), then valid, done and row index."""
    status = np.zeros((len(live), NUM_CODEBOOKS + 3), dtype=np.int64)
    for i, s in enumerate(live):
        status[i, NUM_CODEBOOKS:] = (1, int(rows[s] + 1 == total[s]), rows[s])
    return torch.from_numpy(status).to(device)


def top_functions(profiler: cProfile.Profile, n: int) -> list[str]:
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(n)
    return [line for line in out.getvalue().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--kernels", choices=CODEC_KERNELS, default="compiled")
    ap.add_argument("--precision", choices=CODEC_PRECISIONS, default=DEFAULT_CODEC_PRECISION)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="exact")
    ap.add_argument("--slots", type=int, default=256)
    ap.add_argument("--frames", type=int, default=250, help="frames per stream (10 s)")
    ap.add_argument(
        "--frames-per-call",
        type=int,
        default=DEFAULT_CODEC_FRAMES_PER_CALL,
        help="the most frames a slot takes in one codec call (the engine option)",
    )
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--warmup", type=int, default=300, help="steps before timing")
    ap.add_argument("--load-ms", type=float, default=3.5, help="main-stream work per step")
    ap.add_argument(
        "--host-ms", type=float, default=6.0, help="vLLM's own host work per step (busy Python)"
    )
    ap.add_argument("--profile", type=int, default=0, help="cProfile: list this many functions")
    ap.add_argument("--breakdown", action="store_true", help="time the hooks' parts")
    ap.add_argument("--replay-probe", action="store_true", help="time each graph's launch")
    ap.add_argument("--null-codec", action="store_true", help="no codec work: bookkeeping alone")
    ap.add_argument(
        "--decode-thread",
        action="store_true",
        help="large steps decoded on the watcher thread (the hooks then time the engine's share)",
    )
    ap.add_argument(
        "--switch-interval-ms",
        type=float,
        default=None,
        help="the interpreter's switch interval (the engine option switch_interval_ms)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="tiny codec on the CPU (smoke check)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    write_report(args.out, "audio_host", run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
