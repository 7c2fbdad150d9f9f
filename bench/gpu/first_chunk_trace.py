"""Where a request's first chunk waits at one stream, from a served engine core's trace.

Reads the engine-core trace of a one-stream level (``SERVED_TRACE=1 bash
bench/gpu/run_h200.sh``: vLLM's torch profiler, no Python stacks needed) and
follows each request from its prefill to its first chunk's PCM on the host:

- its rows: the end of each step's status copy (24 bytes device to pinned,
  one request's valid / done / row index, on the talker's stream), in ms
  after the prefill step started on the GPU;
- after the status copy of the row that makes the first chunk due
  (``--preset``'s first chunk + holdback + the delay, counted from row 0):
  when the host launched the codec's work for it, how long that work kept
  the codec stream busy, when the chunk's PCM copy (device to pinned, a
  multiple of one frame's 3,840 bytes, on the codec stream) ended, and when
  the audio sender's wait for it returned.

A status copy completes when its step's rows are written; the host learns
of it only at a later step's input preparation (``VllmAudio.poll``). So
"host launch" is the engine's learning delay (negative where the chunk was
cut ahead of the status, at small batches), "PCM" adds the codec's GPU work
beside the talker's next forward pass, and "sent" the sender thread's
wake-up. The profiler lengthens host work: read the host columns as upper
bounds.

    python -m bench.gpu.first_chunk_trace served_trace/load_trace.tar.gz --preset latency
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.gpu.trace_steps import load_trace
from realtime_engine.codec.presets import next_chunk_frames
from realtime_engine.format import DELAY_ROWS, FRAME_SAMPLES, NUM_CODEBOOKS, PRESETS

# One request's step status on its way to the host: valid, done, row index (int64).
STATUS_BYTES = 3 * 8
PCM_FRAME_BYTES = FRAME_SAMPLES * 4  # float32
_PREFILL = re.compile(r"execute_context_(\d+)\(")
_DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
_HOST_CATS = {"cuda_runtime", "cuda_driver"}


def chunk_row(preset: str) -> int:
    """Index of the row whose arrival makes ``preset``'s first chunk due."""
    params = PRESETS[preset]
    return next_chunk_frames(params, 0) + params.right_holdback_frames + DELAY_ROWS - 1


@dataclass
class Launch:
    """The device work of one host launch on the codec stream (ms after the row)."""

    name: str
    host_ms: float
    start_ms: float
    end_ms: float
    ops: int
    busy_ms: float


@dataclass
class FirstChunk:
    """One request's way to its first chunk."""

    rows_ms: list[float]  # status copies' ends after the prefill step started
    row: int
    launch_ms: float | None = None  # first codec launch after the row's status
    pcm_ms: float | None = None  # the PCM copy's end
    sent_ms: float | None = None  # the sender's wait for it returned
    pcm_bytes: int = 0
    launches: list[Launch] = field(default_factory=list)

    @property
    def codec_busy_ms(self) -> float:
        return sum(launch.busy_ms for launch in self.launches)


def _is_dtoh(event: dict[str, Any]) -> bool:
    return event.get("cat") == "gpu_memcpy" and event["name"].startswith("Memcpy DtoH")


def _end(event: dict[str, Any]) -> float:
    return float(event["ts"]) + float(event["dur"])


def first_chunks(events: Sequence[dict[str, Any]], row: int) -> list[FirstChunk]:
    """Every request of a one-stream trace whose prefill and first chunk it holds."""
    statuses = sorted(
        (e for e in events if _is_dtoh(e) and e["args"].get("bytes") == STATUS_BYTES),
        key=lambda e: e["ts"],
    )
    if not statuses:
        return []
    talker = statuses[0]["args"].get("stream")
    pcms = sorted(
        (
            e
            for e in events
            if _is_dtoh(e)
            and e["args"].get("stream") != talker
            and e["args"].get("bytes", 0) % PCM_FRAME_BYTES == 0
            and e["args"].get("bytes", 0) > 0
        ),
        key=lambda e: e["ts"],
    )
    codec = pcms[0]["args"].get("stream") if pcms else None
    on_codec = sorted(
        (e for e in events if e.get("cat") in _DEVICE_CATS and e["args"].get("stream") == codec),
        key=lambda e: e["ts"],
    )
    host = {e["args"].get("correlation"): e for e in events if e.get("cat") in _HOST_CATS}
    main_tids = {e.get("tid") for e in events if e.get("cat") == "user_annotation"}
    waits = sorted(
        (
            e
            for e in events
            if e.get("cat") == "cuda_runtime"
            and e["name"] == "cudaEventSynchronize"
            and e.get("tid") not in main_tids
        ),
        key=_end,
    )
    starts = _prefill_starts(events)
    found = []
    for i, start in enumerate(starts):
        later = starts[i + 1] if i + 1 < len(starts) else float("inf")
        mine = [s for s in statuses if start <= s["ts"] < later][: row + 1]
        if len(mine) <= row:
            continue
        chunk = FirstChunk([(_end(s) - start) / 1000 for s in mine], row)
        due = _end(mine[row])
        pcm = next((p for p in pcms if p["ts"] >= due), None)
        if pcm is not None and pcm["ts"] < later:
            chunk.pcm_ms = (_end(pcm) - due) / 1000
            chunk.pcm_bytes = int(pcm["args"]["bytes"])
            chunk.launches = _launches(on_codec, host, due, float(pcm["ts"]))
            if chunk.launches:
                chunk.launch_ms = chunk.launches[0].host_ms
            wait = next((w for w in waits if _end(w) >= _end(pcm)), None)
            if wait is not None:
                chunk.sent_ms = (_end(wait) - due) / 1000
        found.append(chunk)
    return found


def _prefill_starts(events: Sequence[dict[str, Any]]) -> list[float]:
    """GPU start of each step that prefills (vLLM marks a step twice, nested:
    one start per step)."""
    spans = sorted(
        (float(e["ts"]), _end(e))
        for e in events
        if e.get("cat") == "gpu_user_annotation"
        and (m := _PREFILL.match(e["name"])) is not None
        and int(m.group(1)) > 0
    )
    starts: list[float] = []
    covered = float("-inf")
    for start, end in spans:
        if start >= covered:
            starts.append(start)
        covered = max(covered, end)
    return starts


def _launches(
    on_codec: Sequence[dict[str, Any]], host: dict[Any, dict[str, Any]], due: float, end: float
) -> list[Launch]:
    """The codec stream's device work from ``due`` until ``end`` (the PCM copy), one
    entry per host launch (a graph replay is one launch of many kernels)."""
    launches: list[Launch] = []
    last_key: tuple[str, float] | None = None
    for op in on_codec:
        if op["ts"] < due or op["ts"] >= end:
            continue
        call = host.get(op["args"].get("correlation"))
        key = (call["name"], float(call["ts"])) if call is not None else ("?", float(op["ts"]))
        start, stop, busy = (op["ts"] - due) / 1000, (_end(op) - due) / 1000, op["dur"] / 1000
        if key == last_key:
            launch = launches[-1]
            launch.ops += 1
            launch.end_ms = stop
            launch.busy_ms += busy
        else:
            launches.append(Launch(key[0], (key[1] - due) / 1000, start, stop, 1, busy))
            last_key = key
    return launches


def _median(values: Sequence[float | None], *, signed: bool = False) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    return f"{statistics.median(known):{'+' if signed else ''}.2f}"


def report(chunks: Sequence[FirstChunk], preset: str) -> str:
    if not chunks:
        return "no request with its prefill and first chunk in the trace\n"
    row = chunks[0].row
    lines = [
        f"{len(chunks)} requests; `{preset}`'s first chunk is due at row {row} "
        f"(first full frame at row {NUM_CODEBOOKS - 1})",
        "request | row 0 ms | first frame row ms | due row ms | host launch +ms | codec busy ms"
        " | PCM copied +ms | sent +ms | codec launches (host +ms: GPU span, ops)",
    ]
    for i, c in enumerate(chunks):
        launches = "; ".join(
            f"{la.name} {la.host_ms:+.2f}: {la.start_ms:.2f}..{la.end_ms:.2f}, {la.ops}"
            for la in c.launches
            if la.ops > 2
        )
        lines.append(
            " | ".join(
                [
                    str(i),
                    f"{c.rows_ms[0]:.2f}",
                    f"{c.rows_ms[NUM_CODEBOOKS - 1]:.2f}" if row >= NUM_CODEBOOKS - 1 else "-",
                    f"{c.rows_ms[row]:.2f}",
                    "-" if c.launch_ms is None else f"{c.launch_ms:+.2f}",
                    f"{c.codec_busy_ms:.2f}",
                    "-" if c.pcm_ms is None else f"{c.pcm_ms:.2f}",
                    "-" if c.sent_ms is None else f"{c.sent_ms:.2f}",
                    launches,
                ]
            )
        )
    lines.append(
        f"median: row 0 {_median([c.rows_ms[0] for c in chunks])} ms, due row "
        f"{_median([c.rows_ms[row] for c in chunks])} ms; after it: host launch "
        f"{_median([c.launch_ms for c in chunks], signed=True)}, codec busy "
        f"{_median([c.codec_busy_ms for c in chunks])}, PCM copied "
        f"+{_median([c.pcm_ms for c in chunks])}, sent +{_median([c.sent_ms for c in chunks])} ms"
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path, help="*.pt.trace.json[.gz] or a packed load_trace.tar.gz")
    ap.add_argument("--preset", default="latency", choices=sorted(PRESETS))
    ap.add_argument("--out", type=Path, help="also write the report here")
    args = ap.parse_args(argv)
    text = report(first_chunks(load_trace(args.trace), chunk_row(args.preset)), args.preset)
    sys.stdout.write(text)
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
