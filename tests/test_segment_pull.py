"""A context's next segment goes to the engine when the engine is done with the
last one, not when the last one's audio has been encoded and sent."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest

from gateway.metrics import GatewayMetrics
from gateway.protocol import SessionConfig, unpack_audio_frame
from gateway.realtime.actions import EndContext, OpenContext, Speak
from gateway.realtime.contexts import ContextWorker
from gateway.realtime.outbound import Outbound, OutClose
from gateway.realtime.segment_pull import Inbox
from realtime_engine.engines.base import SegmentRequest
from realtime_engine.engines.fake import FakeEngine


class WatchedEngine(FakeEngine):
    """A fake engine that says when each request starts and ends on its side;
    self-paced, like the Higgs engine's talkers (realtime_engine/engines/base.py)."""

    self_paced = True

    def __init__(self, **overrides: Any) -> None:
        super().__init__(**overrides)
        self.began: dict[str, asyncio.Event] = {}
        self.ended: dict[str, asyncio.Event] = {}

    def event(self, events: dict[str, asyncio.Event], index: int) -> asyncio.Event:
        return events.setdefault(f"s:1:{index}", asyncio.Event())

    async def synthesize(self, request: SegmentRequest) -> AsyncIterator[np.ndarray]:
        self.event(self.began, int(request.request_id.rsplit(":", 1)[1])).set()
        try:
            async for chunk in super().synthesize(request):
                yield chunk
        finally:
            self.event(self.ended, int(request.request_id.rsplit(":", 1)[1])).set()


# What a server started with ``--read-ahead 3`` gives its contexts.
READ_AHEAD_S = 3.0


def started_worker(
    engine: FakeEngine, outbound: Outbound, *texts: str, read_ahead_s: float = READ_AHEAD_S
) -> tuple[ContextWorker, list[str]]:
    """A context worker (PCM out) given ``texts`` as its first segments, and the
    statuses it closed with."""
    config = SessionConfig.model_validate({"output": {"format": "pcm16"}})
    closed: list[str] = []
    worker = ContextWorker(
        OpenContext(key=1, context_id="c", stream=0, config=config),
        "s",
        engine,
        outbound,
        max_lead_s=60.0,
        encode_inline_max_ms=1e9,
        read_ahead_s=read_ahead_s,
        on_closed=lambda worker, status: closed.append(status),
    )
    worker.start()
    now = time.perf_counter()
    for index, text in enumerate(texts):
        worker.submit(Speak(1, index, text, now))
    return worker, closed


async def drain(outbound: Outbound) -> list[str | bytes]:
    """Everything the client gets, up to and including ``context.done``."""
    got: list[str | bytes] = []
    while True:
        message = await asyncio.wait_for(outbound.get(), timeout=10)
        assert not isinstance(message, OutClose)
        got.append(message)
        if isinstance(message, str) and json.loads(message)["type"] == "context.done":
            return got


async def test_the_next_segment_starts_while_the_last_ones_audio_waits_to_be_sent() -> None:
    engine = WatchedEngine(chunk_samples=960)
    outbound = Outbound(1, GatewayMetrics())  # a client that reads nothing yet: one item fits
    texts = ("The first of two segments.", "And the second one.")
    worker, closed = started_worker(engine, outbound, *texts)
    worker.submit(EndContext(1, None))
    # The engine got the second request while the first one's audio is still
    # held in the gateway: the client has read nothing.
    await asyncio.wait_for(engine.event(engine.began, 1).wait(), timeout=10)
    assert engine.event(engine.ended, 0).is_set()
    assert outbound.qsize() == 1 and worker.busy
    got = await drain(outbound)
    events = [json.loads(m)["type"] for m in got if isinstance(m, str)]
    assert events == [
        "segment.started",
        "segment.done",
        "segment.started",
        "segment.done",
        "context.done",
    ]
    audio = sum(len(unpack_audio_frame(m).payload) // 2 for m in got if isinstance(m, bytes))
    want = sum(engine.length(r) for r in engine.log.requests)
    assert audio == want and closed == ["completed"]
    assert [r.request_id for r in engine.log.requests] == ["s:1:0", "s:1:1"]
    assert list(engine.log.finished) == ["s:1:0", "s:1:1"] and not engine.log.aborted
    assert worker.task is not None
    await asyncio.wait_for(worker.task, timeout=10)


async def test_one_engine_request_at_a_time_whatever_arrives_meanwhile() -> None:
    engine = WatchedEngine(chunk_samples=960, realtime_factor=0.05)
    outbound = Outbound(64, GatewayMetrics())
    text = "A segment long enough to still be running."
    worker, closed = started_worker(engine, outbound, text)
    await asyncio.wait_for(engine.event(engine.began, 0).wait(), timeout=10)
    for index in (1, 2):  # text the client streams while the first one is spoken
        worker.submit(Speak(1, index, f"Segment number {index}.", time.perf_counter()))
    worker.submit(EndContext(1, None))
    order: list[str] = []
    for index in range(3):
        await asyncio.wait_for(engine.event(engine.began, index).wait(), timeout=10)
        # the one before it had ended on the engine's side
        assert index == 0 or engine.event(engine.ended, index - 1).is_set()
        order.append(f"s:1:{index}")
    await drain(outbound)
    assert [r.request_id for r in engine.log.requests] == order
    assert closed == ["completed"]


async def test_a_cancel_aborts_the_request_read_ahead_for_a_later_segment() -> None:
    engine = WatchedEngine(chunk_samples=960, realtime_factor=0.05)
    outbound = Outbound(1, GatewayMetrics())  # the client reads nothing
    long = "A second segment that is long enough to still be running."
    worker, _ = started_worker(engine, outbound, "Short.", long)
    await asyncio.wait_for(engine.event(engine.began, 1).wait(), timeout=10)
    assert worker.current_request == "s:1:1"  # read ahead, while segment 0 waits to be sent
    # what the session does on context.cancel
    worker.cancelled = True
    worker.discard_queued()
    await engine.abort(worker.current_request)
    assert worker.task is not None
    worker.task.cancel()
    await asyncio.gather(worker.task, return_exceptions=True)
    await asyncio.wait_for(engine.event(engine.ended, 1).wait(), timeout=10)
    assert "s:1:1" in engine.log.stopped and "s:1:1" not in engine.log.finished
    assert worker.current_request is None and not worker.busy


async def settle(condition: Callable[[], bool]) -> bool:
    """Let the loop run until ``condition`` holds (at most 10,000 turns)."""
    for _ in range(10_000):
        if condition():
            return True
        await asyncio.sleep(0)
    return condition()


async def test_a_reader_that_stops_holds_the_engine_once_the_read_ahead_is_full() -> None:
    engine = WatchedEngine(chunk_samples=960)  # as fast as it is read
    outbound = Outbound(1, GatewayMetrics())  # the client reads nothing
    worker, _ = started_worker(engine, outbound, "x" * 400)  # 20 s of audio
    limit = READ_AHEAD_S * engine.sample_rate
    assert await settle(lambda: worker._unsent >= limit)
    assert worker._unsent < limit + 960  # it stopped reading at the bound
    assert engine.running == ["s:1:0"] and not engine.log.finished  # held, not done
    worker.cancelled = True
    worker.discard_queued()
    await engine.abort("s:1:0")
    assert worker.task is not None
    worker.task.cancel()
    await asyncio.gather(worker.task, return_exceptions=True)


@pytest.mark.parametrize(
    ("engine_kind", "read_ahead_s"),
    [
        # not self-paced: it makes audio as it is read, so reading ahead is never on
        (FakeEngine, READ_AHEAD_S),
        # self-paced, on a server with the default read-ahead (none)
        (WatchedEngine, 0.0),
    ],
)
async def test_a_context_reads_in_step_unless_both_engine_and_server_read_ahead(
    engine_kind: type[FakeEngine], read_ahead_s: float
) -> None:
    engine = engine_kind(chunk_samples=960)
    outbound = Outbound(1, GatewayMetrics())  # the client reads nothing yet
    worker, closed = started_worker(
        engine, outbound, "First.", "Second.", read_ahead_s=read_ahead_s
    )
    worker.submit(EndContext(1, None))
    assert await settle(lambda: outbound.qsize() == 1 and bool(engine.running))
    for _ in range(100):  # held: the engine is read no further than what was sent
        await asyncio.sleep(0)
    assert [r.request_id for r in engine.log.requests] == ["s:1:0"]
    assert engine.running == ["s:1:0"]
    got = await drain(outbound)
    assert [r.request_id for r in engine.log.requests] == ["s:1:0", "s:1:1"]
    assert sum(isinstance(m, bytes) for m in got) > 0 and closed == ["completed"]


async def test_the_inbox_shows_what_waits_behind_its_head() -> None:
    inbox: Inbox[int] = Inbox()
    waiter = asyncio.ensure_future(inbox.get())
    await asyncio.sleep(0)
    assert not waiter.done()
    for i in (1, 2, 3):
        inbox.put_nowait(i)
    assert await waiter == 1
    assert inbox.waiting() == (2, 3) and not inbox.empty()
    assert inbox.get_nowait() == 2 and await inbox.get() == 3
    assert inbox.empty() and inbox.waiting() == ()
    with pytest.raises(IndexError):
        inbox.get_nowait()
