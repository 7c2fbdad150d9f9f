"""How long a side thread's work waits for the interpreter's lock beside a busy
engine thread, by the interpreter's switch interval.

An engine core's main thread runs vLLM's scheduler and our hooks in Python and
releases the lock only while it waits for the device. Its side threads (the
chunk sender, the first-chunk watcher) take the lock back after each wait of
their own (an event's synchronize, a socket send), and a thread that asks for
the lock gets it when the holder releases it or, at the latest, after the
switch interval (``sys.setswitchinterval``, 5 ms by default). This stands in
for that: each step the main thread does ``--busy-ms`` of Python work (a fixed
amount, calibrated alone, so being preempted lengthens it), queues a batch
``--queued-at`` of the way in, then waits ``--wait-ms`` with the lock
released; the sender thread takes each batch, releases the lock twice as the
real one does, and holds it for ``--sender-ms`` of Python. Reports the step
time and each batch's latency (queued to done).

    python -m bench.gil_handoff --intervals 5,1,0.5,0.2 [--busy-ms 10 --wait-ms 1]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np


def work(n: int) -> int:
    x = 0
    for i in range(n):
        x += i
    return x


def iterations_per_ms() -> float:
    work(50_000)
    start = time.perf_counter()
    work(400_000)
    return 400_000 / ((time.perf_counter() - start) * 1000)


def run_once(interval_ms: float, args: argparse.Namespace, per_ms: float) -> dict[str, Any]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(interval_ms / 1000)
    batches: queue.Queue[float | None] = queue.Queue()
    latencies: list[float] = []

    def sender() -> None:
        while (queued := batches.get()) is not None:
            time.sleep(0)  # the copy's event: the lock released and taken again
            work(int(args.sender_ms * per_ms))  # headers and encoding
            time.sleep(0)  # the socket's send
            latencies.append(time.perf_counter() - queued)

    thread = threading.Thread(target=sender)
    thread.start()
    first, rest = int(args.queued_at * args.busy_ms * per_ms), None
    rest = int((1 - args.queued_at) * args.busy_ms * per_ms)
    try:
        start = time.perf_counter()
        for _ in range(args.steps):
            work(first)
            batches.put(time.perf_counter())
            work(rest)
            time.sleep(args.wait_ms / 1000)  # waiting for the device
        step_ms = 1000 * (time.perf_counter() - start) / args.steps
    finally:
        batches.put(None)
        thread.join()
        sys.setswitchinterval(before)
    ms = 1000 * np.asarray(latencies)
    return {
        "switch_interval_ms": interval_ms,
        "step_ms": round(step_ms, 3),
        "batch_latency_ms": {
            "p50": round(float(np.percentile(ms, 50)), 3),
            "p95": round(float(np.percentile(ms, 95)), 3),
            "max": round(float(ms.max()), 3),
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--intervals", default="5,1,0.5,0.2", help="switch intervals, ms")
    ap.add_argument("--busy-ms", type=float, default=10.0)
    ap.add_argument("--queued-at", type=float, default=0.3)
    ap.add_argument("--wait-ms", type=float, default=1.0)
    ap.add_argument("--sender-ms", type=float, default=0.5)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=2, help="rounds over the intervals")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    per_ms = iterations_per_ms()
    intervals = [float(v) for v in args.intervals.split(",") if v]
    rows = [run_once(v, args, per_ms) for _ in range(args.repeats) for v in intervals]
    report = {
        "busy_ms": args.busy_ms,
        "queued_at": args.queued_at,
        "wait_ms": args.wait_ms,
        "sender_ms": args.sender_ms,
        "steps": args.steps,
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "runs": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gil_handoff.json").write_text(json.dumps(report, indent=2))
    for row in rows:
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
