"""Gateway overhead: many sessions over the fake engine, frame lateness vs engine emit time.

The gateway runs in a child process around a :class:`StampingEngine`; each
client session streams contexts back to back. A frame's **lateness** is its
arrival at the client minus the moment the engine yielded the PCM chunk that
holds the frame's first sample (both on the machine's monotonic clock, which
``time.perf_counter`` reads in every process). CPU and memory of the gateway
process are sampled once a second.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import multiprocessing
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection as Pipe
from typing import Any

import psutil
from tqdm import tqdm

from bench.stamping import ChunkStamp, text_key
from bench.stats import summarize
from bench.sysinfo import describe
from gateway.client import AudioChunk, ClientError, connect
from gateway.protocol import ContextDone, SegmentStarted
from realtime_engine.format import SAMPLE_RATE


@dataclass
class OverheadConfig:
    sessions: int = 500
    engine_rtf: float = 1.0
    first_chunk_delay_s: float = 0.05
    ramp_s: float = 5.0
    warmup_s: float = 8.0
    duration_s: float = 20.0
    output_format: str = "pcm16"
    sample_rate: int = SAMPLE_RATE
    frame_ms: int = 20
    decode: bool = False
    seed: int = 0
    words_per_text: int = 18  # ~100 characters, ~5 s of fake-engine audio


@dataclass
class ContextTrace:
    segments: list[tuple[int, str]] = field(default_factory=list)
    frames: list[tuple[float, int]] = field(default_factory=list)  # (arrival, pts_ms)
    audio_ms: list[float] = field(default_factory=list)  # duration of each frame
    t_first_text: float = 0.0
    t_first_audio: float | None = None
    server_ttfa_ms: float | None = None
    error: str | None = None


_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def unique_word(n: int) -> str:
    """A letters-only word per integer (so every segment text is unique)."""
    word = ""
    n += 26 * 26  # at least three letters
    while n:
        n, r = divmod(n, 26)
        word = _LETTERS[r] + word
    return word


def unique_text(uid: int, words: int) -> str:
    return " ".join(unique_word(uid * words + k) for k in range(words)) + "."


# --------------------------------------------------------------------------- server process


def _serve_child(pipe: Pipe, engine_rtf: float, first_chunk_delay_s: float) -> None:
    asyncio.run(_serve_async(pipe, engine_rtf, first_chunk_delay_s))


async def _serve_async(pipe: Pipe, engine_rtf: float, first_chunk_delay_s: float) -> None:
    from bench.server import gateway_app, serve
    from bench.stamping import StampingEngine
    from realtime_engine.engines.fake import FakeEngine

    engine = StampingEngine(
        FakeEngine(realtime_factor=engine_rtf, first_chunk_delay_s=first_chunk_delay_s)
    )
    async with serve(gateway_app(engine)) as url:
        pipe.send(url)
        await asyncio.get_running_loop().run_in_executor(None, pipe.recv)  # "stop"
    pipe.send({k: [asdict(s) for s in v] for k, v in engine.stamps.by_text.items()})


# --------------------------------------------------------------------------- client side


async def _session(
    url: str,
    cfg: OverheadConfig,
    worker: int,
    t_stop: float,
    start_at: float,
    traces: list[ContextTrace],
) -> None:
    await asyncio.sleep(max(0.0, start_at - time.perf_counter()))
    patch = {
        "output": {
            "format": cfg.output_format,
            "sample_rate": cfg.sample_rate,
            "frame_ms": cfg.frame_ms,
        },
        "text_buffering": {"mode": "manual"},
    }
    iteration = 0
    try:
        async with connect(url, open_timeout=60.0, request_timeout=60.0) as conn:
            await conn.session.update(patch)
            while time.perf_counter() < t_stop:
                trace = ContextTrace()
                traces.append(trace)
                ctx = conn.context(f"w{worker}-{iteration}")
                trace.t_first_text = time.perf_counter()
                await ctx.append(unique_text(worker * 1000 + iteration, cfg.words_per_text))
                await ctx.end()
                iteration += 1
                async for item in ctx.events():
                    if isinstance(item, SegmentStarted):
                        trace.segments.append((item.start_ms, item.text))
                    elif isinstance(item, ContextDone):
                        trace.server_ttfa_ms = item.metrics.ttfa_ms
                        if item.status != "completed":
                            trace.error = f"context {item.status}"
                    elif isinstance(item, AudioChunk):
                        if trace.t_first_audio is None:
                            trace.t_first_audio = item.received_at
                        if cfg.decode:
                            ctx.decode(item)
                        trace.frames.append((item.received_at, item.pts_ms))
                        trace.audio_ms.append(item.duration_ms)
    except (ClientError, TimeoutError, OSError) as e:
        trace = ContextTrace(error=f"{type(e).__name__}: {e}"[:200])
        traces.append(trace)


def frame_lateness(
    traces: list[ContextTrace],
    stamps: dict[str, list[ChunkStamp]],
    sample_rate: int,
    t0: float,
    t1: float,
) -> tuple[list[float], list[float], int]:
    """(lateness of every matched frame, of each chunk's first frame, unmatched frames)
    for frames arriving in ``[t0, t1)``, in seconds."""
    all_late: list[float] = []
    first_late: list[float] = []
    unmatched = 0
    for trace in traces:
        starts = [s for s, _ in trace.segments]
        for arrival, pts_ms in trace.frames:
            if not t0 <= arrival < t1:
                continue
            i = bisect.bisect_right(starts, pts_ms) - 1
            chunk = None
            if i >= 0:
                seg_stamps = stamps.get(text_key(trace.segments[i][1]), [])
                sample = (pts_ms - starts[i]) * sample_rate // 1000
                j = bisect.bisect_right([s.sample_offset for s in seg_stamps], sample) - 1
                if j >= 0 and sample < seg_stamps[j].sample_offset + seg_stamps[j].samples:
                    chunk = seg_stamps[j]
                    if sample == chunk.sample_offset:
                        first_late.append(arrival - chunk.emitted_at)
            if chunk is None:
                unmatched += 1  # inter-segment silence, or a segment without stamps
                continue
            all_late.append(arrival - chunk.emitted_at)
    return all_late, first_late, unmatched


async def _sample_usage(
    proc: psutil.Process, samples: list[dict[str, float]], stop: asyncio.Event
) -> None:
    proc.cpu_percent(None)
    me = psutil.Process()
    me.cpu_percent(None)
    last_t, last_wait = time.perf_counter(), runqueue_wait_s(proc.pid)
    last_loop = main_thread_cpu_s(proc)
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
        now, wait = time.perf_counter(), runqueue_wait_s(proc.pid)
        loop_cpu = main_thread_cpu_s(proc)
        sample = {
            "t": now,
            "server_cpu_pct": proc.cpu_percent(None),
            "server_rss_mb": proc.memory_info().rss / 2**20,
            "client_cpu_pct": me.cpu_percent(None),
        }
        if wait is not None and last_wait is not None:
            # time the gateway's threads were ready to run but waited for a core
            sample["server_runqueue_wait_pct"] = (wait - last_wait) / (now - last_t) * 100.0
        if loop_cpu is not None and last_loop is not None:
            # the event loop's thread alone: the one core a gateway process cannot spread
            sample["server_loop_cpu_pct"] = (loop_cpu - last_loop) / (now - last_t) * 100.0
        last_t, last_wait, last_loop = now, wait, loop_cpu
        samples.append(sample)


def main_thread_cpu_s(proc: psutil.Process) -> float | None:
    """CPU seconds of the process's main thread (the gateway's event loop)."""
    try:
        for thread in proc.threads():
            if thread.id == proc.pid:
                return float(thread.user_time + thread.system_time)
    except psutil.Error:
        return None
    return None


def runqueue_wait_s(pid: int) -> float | None:
    """Total seconds the threads of ``pid`` spent runnable but not running (Linux
    schedstat); ``None`` where the kernel does not expose it."""
    total_ns = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat", encoding="ascii") as f:
                total_ns += int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return total_ns / 1e9


async def run_overhead(
    cfg: OverheadConfig, argv: list[str] | None = None, progress: bool = True
) -> dict[str, Any]:
    hardware = describe()  # before the load: the load average says how busy the box was
    mp = multiprocessing.get_context("spawn")
    parent, child = mp.Pipe()
    proc = mp.Process(
        target=_serve_child, args=(child, cfg.engine_rtf, cfg.first_chunk_delay_s), daemon=True
    )
    proc.start()
    loop = asyncio.get_running_loop()
    try:
        if not await loop.run_in_executor(None, parent.poll, 120.0):
            raise RuntimeError("the gateway process did not start within 120 s")
        url = parent.recv()
        server = psutil.Process(proc.pid)
        begin = time.perf_counter()
        t_window = (begin + cfg.warmup_s, begin + cfg.warmup_s + cfg.duration_s)
        traces: list[ContextTrace] = []
        usage: list[dict[str, float]] = []
        stop = asyncio.Event()
        sampler = asyncio.create_task(_sample_usage(server, usage, stop))
        rng = random.Random(cfg.seed)
        starts = sorted(begin + rng.uniform(0, cfg.ramp_s) for _ in range(cfg.sessions))
        with tqdm(
            total=cfg.warmup_s + cfg.duration_s,
            desc="overhead",
            unit="s",
            file=sys.stderr,
            disable=not progress,
        ) as bar:

            async def tick() -> None:
                while time.perf_counter() < t_window[1]:
                    await asyncio.sleep(1.0)
                    bar.update(1.0)

            ticker = asyncio.create_task(tick())
            await asyncio.gather(
                *(_session(url, cfg, w, t_window[1], s, traces) for w, s in enumerate(starts))
            )
            ticker.cancel()
        stop.set()
        await sampler
        parent.send("stop")
        raw = await loop.run_in_executor(None, parent.recv)
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.terminate()
    stamps = {k: [ChunkStamp(**s) for s in v] for k, v in raw.items()}
    late, first_late, unmatched = frame_lateness(traces, stamps, cfg.sample_rate, *t_window)
    in_window = [u for u in usage if t_window[0] <= u["t"] < t_window[1]]
    measured = [t for t in traces if t_window[0] <= t.t_first_text < t_window[1]]
    ok = [t for t in measured if t.error is None and t.frames]
    audio_s = audio_seconds_in(traces, *t_window)
    throughput = audio_s / cfg.duration_s
    server_cpu = summarize([u["server_cpu_pct"] for u in in_window], 1)
    client_cpu = summarize([u["client_cpu_pct"] for u in in_window], 1)
    loop_cpu = summarize(
        [u["server_loop_cpu_pct"] for u in in_window if "server_loop_cpu_pct" in u], 1
    )
    return {
        "meta": {
            "kind": "overhead",
            "argv": argv or [],
            "hardware": hardware,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        "config": asdict(cfg),
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "sessions_ok": cfg.sessions - sum(1 for t in traces if t.error and not t.frames),
        "contexts_measured": len(measured),
        "contexts_ok": len(ok),
        "errors": sorted({t.error for t in traces if t.error})[:5],
        "frames_in_window": len(late) + unmatched,
        "frames_unmatched": unmatched,
        "audio_s_per_s": round(throughput, 3),
        # CPU cost of delivering audio: core-seconds per second of audio, the number that
        # survives a busy machine (a starved process delivers less but costs the same)
        "server_cpu_ms_per_audio_s": _cost(server_cpu, throughput),
        "server_loop_cpu_ms_per_audio_s": _cost(loop_cpu, throughput),
        "client_cpu_ms_per_audio_s": _cost(client_cpu, throughput),
        "lateness_ms": summarize([x * 1000 for x in late], 2),
        "chunk_first_frame_lateness_ms": summarize([x * 1000 for x in first_late], 2),
        "client_ttfa_ms": summarize(
            [(t.t_first_audio - t.t_first_text) * 1000 for t in ok if t.t_first_audio], 2
        ),
        "server_ttfa_ms": summarize([t.server_ttfa_ms for t in ok], 2),
        "server_cpu_pct": server_cpu,
        "server_rss_mb": summarize([u["server_rss_mb"] for u in in_window], 1),
        "server_loop_cpu_pct": loop_cpu,
        "client_cpu_pct": client_cpu,
        "server_runqueue_wait_pct": summarize(
            [u["server_runqueue_wait_pct"] for u in in_window if "server_runqueue_wait_pct" in u],
            1,
        ),
        "samples": {
            "lateness_ms": [round(x * 1000, 3) for x in late[:: max(1, len(late) // 20000)]],
            "usage": [{**u, "t": round(u["t"] - begin, 2)} for u in usage],
        },
    }


def audio_seconds_in(traces: list[ContextTrace], t0: float, t1: float) -> float:
    """Seconds of audio whose frames arrived within ``[t0, t1)``."""
    total_ms = 0.0
    for trace in traces:
        for (arrival, _), ms in zip(trace.frames, trace.audio_ms, strict=True):
            if t0 <= arrival < t1:
                total_ms += ms
    return total_ms / 1000.0


def _cost(cpu_pct: dict[str, float | int], audio_s_per_s: float) -> float | None:
    mean = cpu_pct.get("mean")
    if mean is None or audio_s_per_s <= 0:
        return None
    return round(float(mean) / 100.0 / audio_s_per_s * 1000.0, 3)


def summary_line(result: dict[str, Any]) -> str:
    late, cpu, rss = result["lateness_ms"], result["server_cpu_pct"], result["server_rss_mb"]
    return (
        f"[bench] overhead {result['config']['sessions']} sessions: "
        f"{result['contexts_ok']}/{result['contexts_measured']} contexts ok, frame lateness "
        f"p50 {late.get('p50')} p99 {late.get('p99')} max {late.get('max')} ms, "
        f"gateway CPU mean {cpu.get('mean')} % "
        f"({result['server_cpu_ms_per_audio_s']} ms per audio second, "
        f"{result.get('server_loop_cpu_ms_per_audio_s')} ms of it on the event loop thread), "
        f"{result['audio_s_per_s']} audio-s/s, RSS max {rss.get('max')} MB, "
        f"waiting for a core {result['server_runqueue_wait_pct'].get('mean')} % of the time"
    )


def plot_lateness(result: dict[str, Any], path: Any) -> None:
    from bench.plots import plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6), dpi=90)
    sample = sorted(result["samples"]["lateness_ms"])
    if sample:
        ax1.step(sample, [(i + 1) / len(sample) for i in range(len(sample))], where="post")
    ax1.set_xlabel("frame lateness vs engine emit (ms)")
    ax1.set_ylabel("fraction of frames")
    ax1.set_title(f"{result['config']['sessions']} sessions, fake engine")
    usage = result["samples"]["usage"]
    ax2.plot([u["t"] for u in usage], [u["server_cpu_pct"] for u in usage], label="gateway CPU %")
    ax2.plot([u["t"] for u in usage], [u["client_cpu_pct"] for u in usage], label="client CPU %")
    ax2.set_xlabel("time (s)")
    ax2.set_ylabel("CPU % (100 = one core)")
    ax2b = ax2.twinx()
    ax2b.plot(
        [u["t"] for u in usage], [u["server_rss_mb"] for u in usage], "k:", label="gateway RSS MB"
    )
    ax2b.set_ylabel("RSS (MB)")
    ax2.legend(fontsize=7, loc="upper left")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
