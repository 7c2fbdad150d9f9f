"""A 60-second soak of a real server process: 100 sessions, token-streamed text, cancels.

The server's memory must stay flat once warm (RSS growth under 5% from the
end of the warm-up to the end of the run) and no frame may be lost or
arrive after its context's cancel acknowledgement.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

import psutil
import pytest
from server_process import server_process
from websockets.asyncio.client import ClientConnection, connect

from gateway.protocol import unpack_audio_frame

pytestmark = pytest.mark.slow

SESSIONS = 100
SOAK_S = 60.0
WARM_UP_S = 20.0
MAX_RSS_GROWTH = 0.05
CANCEL_SHARE = 0.2
SEED = 1313
# Paced like a real talker (one second of audio per second) so 100 streams fit two cores.
FAKE = {"realtime_factor": 1.0, "chunk_samples": 2880}
OUTPUT = {"output": {"format": "pcm16", "frame_ms": 60}}
WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "owls", "sing")


@dataclass
class Totals:
    contexts: int = 0
    cancelled: int = 0
    frames: int = 0
    problems: list[str] = field(default_factory=list)


async def run_session(url: str, rng: random.Random, deadline: float, totals: Totals) -> None:
    async with connect(url, max_size=None) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        await ws.send(json.dumps({"type": "session.update", "session": OUTPUT}))
        n = 0
        while time.perf_counter() < deadline:
            await one_context(ws, f"c{n}", rng, totals)
            n += 1


async def one_context(
    ws: ClientConnection, context_id: str, rng: random.Random, totals: Totals
) -> None:
    cancel_after = rng.randrange(1, 20) if rng.random() < CANCEL_SHARE else None
    words = [rng.choice(WORDS) for _ in range(rng.randrange(4, 12))]
    for word in words:  # token-streamed text
        event = {"type": "text.append", "context_id": context_id, "text": word + " "}
        await ws.send(json.dumps(event))
    await ws.send(json.dumps({"type": "text.append", "context_id": context_id, "text": "end."}))
    await ws.send(json.dumps({"type": "context.end", "context_id": context_id}))
    stream: int | None = None
    seqs: list[int] = []
    cancel_sent = False
    while True:
        raw = await asyncio.wait_for(ws.recv(), 30)
        if isinstance(raw, bytes):
            frame = unpack_audio_frame(raw)
            if frame.stream != stream:
                totals.problems.append(f"{context_id}: a frame of stream {frame.stream}")
                continue
            seqs.append(frame.seq)
            if cancel_after is not None and len(seqs) == cancel_after and not cancel_sent:
                cancel_sent = True
                await ws.send(json.dumps({"type": "context.cancel", "context_id": context_id}))
            continue
        event = json.loads(raw)
        kind = event["type"]
        if kind == "context.created":
            stream = event["stream"]
        elif kind == "error":
            totals.problems.append(f"{context_id}: {event['error']}")
        elif kind in ("context.done", "context.cancelled"):
            if kind == "context.done" and event["status"] != "completed":
                totals.problems.append(f"{context_id}: {event}")
            totals.cancelled += kind == "context.cancelled"
            break
    if seqs != list(range(len(seqs))):
        totals.problems.append(f"{context_id}: seq gap in {seqs[:50]}")
    totals.contexts += 1
    totals.frames += len(seqs)
    if cancel_sent:
        # Nothing of the cancelled stream may follow its acknowledgement: a ping
        # round trip flushes anything still queued.
        await ws.send(json.dumps({"type": "ping", "event_id": f"after-{context_id}"}))
        while True:
            raw = await asyncio.wait_for(ws.recv(), 30)
            if isinstance(raw, bytes):
                totals.problems.append(f"{context_id}: a frame after the cancel ack")
                continue
            if json.loads(raw).get("reply_to") == f"after-{context_id}":
                return


async def sample_rss(pid: int, every_s: float, samples: list[tuple[float, int]]) -> None:
    process = psutil.Process(pid)
    started = time.perf_counter()
    while True:
        samples.append((time.perf_counter() - started, process.memory_info().rss))
        await asyncio.sleep(every_s)


async def test_soak_memory_is_flat_and_no_frame_is_lost() -> None:
    args = ["--engine", "fake", "--fake-options", json.dumps(FAKE), "--log-level", "warning"]
    async with server_process(args) as server:
        samples: list[tuple[float, int]] = []
        sampler = asyncio.create_task(sample_rss(server.proc.pid, 1.0, samples))
        totals = Totals()
        deadline = time.perf_counter() + SOAK_S
        rng = random.Random(SEED)
        sessions = [
            run_session(server.ws_url, random.Random(rng.random()), deadline, totals)
            for _ in range(SESSIONS)
        ]
        try:
            await asyncio.gather(*sessions)
        finally:
            sampler.cancel()
        assert "Traceback" not in server.output(), server.output()[-3000:]
    warm = [rss for t, rss in samples if t >= WARM_UP_S]
    baseline, final = warm[0], warm[-1]
    growth = (final - baseline) / baseline
    print(
        f"soak: {totals.contexts} contexts ({totals.cancelled} cancelled), {totals.frames} frames;"
        f" RSS {baseline / 2**20:.1f} MiB at {WARM_UP_S:g} s -> {final / 2**20:.1f} MiB"
        f" ({growth:+.2%}), peak {max(r for _, r in samples) / 2**20:.1f} MiB"
    )
    assert not totals.problems, totals.problems[:10]
    assert totals.cancelled >= totals.contexts * CANCEL_SHARE / 2, "cancels were exercised"
    assert totals.contexts >= SESSIONS * 5, "every session kept working"
    assert growth < MAX_RSS_GROWTH
