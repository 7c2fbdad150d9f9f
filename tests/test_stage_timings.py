"""Server-side first-audio stages: engine stamps → context.done metrics → /metrics."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import pytest
from gateway_support import fake_app
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from bench.report import SERVER_STAGES, server_metric_summaries, stage_table
from gateway.app import create_app
from gateway.encode_pool import EncodePool
from gateway.metrics import EngineStatsSampler, GatewayMetrics, batch_bucket
from gateway.realtime import contexts
from gateway.realtime.contexts import ENGINE_STAGES, ContextStats
from gateway.settings import GatewaySettings
from realtime_engine.audio.encoder import AudioEncoder, EncodedFrame
from realtime_engine.engines.base import ChunkingParams, SegmentRequest, SegmentTimings
from realtime_engine.engines.cpu_voice import CpuVoiceEngine
from realtime_engine.engines.fake import FakeEngine
from realtime_engine.engines.higgs import HiggsEngine
from realtime_engine.model.tokenizer import HiggsTokenizer
from realtime_engine.talker.types import PcmChunk, TalkerRequest, TalkerSampling

STAGE_ORDER = ["queue", "prefill", "first_row", "first_frame_row", "first_chunk", "encoded", "ttfa"]
STAGE_FIELDS = [f"{name}_ms" for name in STAGE_ORDER]

T = TypeVar("T")


# --------------------------------------------------------------------------- the record


def test_a_stamp_is_kept_from_its_first_mark() -> None:
    timings = SegmentTimings()
    timings.mark("first_row", 5.0)
    timings.mark("first_row", 7.0)
    before = time.perf_counter()
    timings.mark("submitted")
    assert timings.first_row == 5.0
    assert timings.submitted is not None and before <= timings.submitted <= time.perf_counter()
    assert timings.prefilled is None and timings.first_chunk is None


def test_unknown_stages_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown stage"):
        SegmentTimings().mark("decoded")  # type: ignore[arg-type]


def test_timings_do_not_change_request_equality() -> None:
    plain = SegmentRequest("r", "text")
    measured = SegmentRequest("r", "text", timings=SegmentTimings(submitted=1.0))
    assert plain == measured


# --------------------------------------------------------------------------- stats → metrics

stamp = st.one_of(st.none(), st.floats(0.0, 50.0, allow_nan=False))


@given(
    ready=st.floats(0.0, 1000.0, allow_nan=False),
    engine_at=stamp,
    stamps=st.lists(stamp, min_size=5, max_size=5),
    encoded=stamp,
    sent=stamp,
)
def test_metrics_are_each_stage_after_speakable(
    ready: float,
    engine_at: float | None,
    stamps: list[float | None],
    encoded: float | None,
    sent: float | None,
) -> None:
    def at(offset: float | None) -> float | None:
        return None if offset is None else ready + offset

    timings = SegmentTimings(*(at(s) for s in stamps))
    stats = ContextStats(
        first_ready_at=ready,
        first_engine_at=at(engine_at),
        first_encoded_at=at(encoded),
        first_sent_at=at(sent),
        first_timings=timings,
    )
    expected: dict[str, float | None] = dict(
        zip(STAGE_ORDER, [*stamps, encoded, sent], strict=True)
    )
    if expected["queue"] is None:  # engines that stamp nothing: when the gateway called them
        expected["queue"] = engine_at
    seconds = stats.stage_seconds()
    assert list(seconds) == [n for n in STAGE_ORDER if expected[n] is not None]
    metrics = stats.metrics().model_dump()
    for name, offset in expected.items():
        if offset is None:
            assert name not in seconds and metrics[f"{name}_ms"] is None
        else:
            assert seconds[name] == pytest.approx(offset, abs=1e-9)
            assert metrics[f"{name}_ms"] == pytest.approx(offset * 1000, abs=0.006)


def test_nothing_is_measured_before_a_segment_is_speakable() -> None:
    stats = ContextStats(first_engine_at=1.0, first_timings=SegmentTimings(submitted=1.0))
    assert stats.stage_seconds() == {}
    assert all(stats.metrics().model_dump()[f] is None for f in STAGE_FIELDS)


def test_engine_stages_follow_the_record_fields() -> None:
    assert [field for _, field in ENGINE_STAGES] == list(SegmentTimings.STAGES)


# --------------------------------------------------------------------------- step time by batch


def test_batch_buckets_are_power_of_two_ranges() -> None:
    assert batch_bucket(0) == batch_bucket(1) == batch_bucket(0.4) == "1"
    assert batch_bucket(2) == batch_bucket(1.2) == "2"
    assert batch_bucket(2.01) == "3-4"
    for size in range(3, 513):
        low, high = (int(x) for x in batch_bucket(size).split("-"))
        assert low <= size <= high
        assert high & (high - 1) == 0 and low == high // 2 + 1
    assert batch_bucket(513) == batch_bucket(10_000) == ">512"


@dataclass(frozen=True)
class Stats:
    steps: int
    rows: int
    mean_step_s: float
    waiting: int


def test_step_time_is_recorded_under_its_batch_size() -> None:
    metrics = GatewayMetrics()
    sampler = EngineStatsSampler(metrics)
    # Interval 1: 10 steps of 4 ms at batch 4. Interval 2: 10 steps of 10 ms at batch 7.
    sampler.observe(Stats(steps=10, rows=40, mean_step_s=0.004, waiting=0))
    sampler.observe(Stats(steps=20, rows=110, mean_step_s=0.007, waiting=0))
    value = metrics.registry.get_sample_value
    name = "speech_engine_step_seconds_by_batch"
    assert value(f"{name}_count", {"batch": "3-4"}) == 1
    assert value(f"{name}_sum", {"batch": "3-4"}) == pytest.approx(0.004)
    assert value(f"{name}_count", {"batch": "5-8"}) == 1
    assert value(f"{name}_sum", {"batch": "5-8"}) == pytest.approx(0.010)
    assert value(f"{name}_count", {"batch": "1"}) is None


# --------------------------------------------------------------------------- through the gateway


Scrape = dict[tuple[str, str, float], float]


def scrape(client: TestClient) -> Scrape:
    """``(sample name, stage, bucket bound) → value`` for the stage histogram.

    The bound is ``inf`` for samples other than buckets.
    """
    response = client.get("/metrics")
    assert response.status_code == 200
    out = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            if s.name.startswith("speech_stage_seconds"):
                le = float(s.labels.get("le", "inf"))
                out[(s.name, s.labels["stage"], le)] = s.value
    return out


def count(scraped: Scrape, stage: str) -> float | None:
    return scraped.get(("speech_stage_seconds_count", stage, float("inf")))


def speak(client: TestClient, text: str, session: dict[str, Any] | None = None) -> dict[str, Any]:
    """One context over a WebSocket; its ``context.done`` metrics."""
    with client.websocket_connect("/v1/realtime") as ws:
        assert json.loads(ws.receive_text())["type"] == "session.created"
        if session is not None:
            ws.send_text(json.dumps({"type": "session.update", "session": session}))
            assert json.loads(ws.receive_text())["type"] == "session.updated"
        ws.send_text(json.dumps({"type": "text.append", "context_id": "c", "text": text}))
        ws.send_text(json.dumps({"type": "context.end", "context_id": "c"}))
        while True:
            message = ws.receive()
            if message.get("text") is None:
                continue
            event = json.loads(message["text"])
            assert event["type"] != "error", event
            if event["type"] == "context.done":
                assert event["status"] == "completed"
                metrics: dict[str, Any] = event["metrics"]
                return metrics


def assert_ordered(metrics: dict[str, Any], present: list[str]) -> None:
    values = [metrics[f"{name}_ms"] for name in present]
    assert all(v is not None and v >= 0 for v in values), metrics
    assert values == sorted(values), metrics


def test_fake_engine_stages_reach_done_and_metrics() -> None:
    delay_s = 0.08
    engine = FakeEngine(first_chunk_delay_s=delay_s)
    with TestClient(fake_app(engine)) as client:
        metrics = speak(client, "Hello there. ")
        scraped = scrape(client)
    assert_ordered(metrics, ["queue", "first_chunk", "encoded", "ttfa"])
    assert metrics["first_chunk_ms"] >= delay_s * 1000
    # The fake has no talker: no prefill or rows to report.
    assert metrics["prefill_ms"] is None
    assert metrics["first_row_ms"] is None and metrics["first_frame_row_ms"] is None
    for stage in ("queue", "first_chunk", "encoded", "ttfa"):
        assert count(scraped, stage) == 1
        assert scraped[("speech_stage_seconds_sum", stage, float("inf"))] == pytest.approx(
            metrics[f"{stage}_ms"] / 1000, abs=1e-4
        )
    assert count(scraped, "prefill") is None
    # The first chunk lands above every bucket bound below the configured delay.
    buckets = {
        le: value
        for (name, stage, le), value in scraped.items()
        if name == "speech_stage_seconds_bucket" and stage == "first_chunk"
    }
    assert buckets[float("inf")] == 1
    assert [le for le, value in buckets.items() if le < delay_s and value != 0] == []
    assert any(le < delay_s for le in buckets)


HIGGS_SESSION = {
    "output": {"format": "pcm_f32"},
    "latency_preset": "exact",
    "sampling": {"seed": 3},
    "max_audio_seconds": 0.5,
}


def test_higgs_engine_fills_every_stage_in_order(tiny_checkpoint: Path) -> None:
    engine = HiggsEngine.from_pretrained(str(tiny_checkpoint), "cpu")
    with TestClient(create_app(GatewaySettings(), engine)) as client:
        metrics = speak(client, "Hello world.", HIGGS_SESSION)
        scraped = scrape(client)
    assert_ordered(metrics, STAGE_ORDER)
    for stage in STAGE_ORDER:
        assert count(scraped, stage) == 1


async def test_cpu_voice_stamps_submission_and_first_chunk() -> None:
    engine = CpuVoiceEngine()
    await engine.start()
    timings = SegmentTimings()
    called = time.perf_counter()
    try:
        stream = engine.synthesize(SegmentRequest("r", "Yes, of course.", timings=timings))
        first = await anext(stream)
        received = time.perf_counter()
        await stream.aclose()  # type: ignore[attr-defined]
    finally:
        await engine.close()
    assert first.size > 0
    assert timings.submitted is not None and timings.first_chunk is not None
    assert called <= timings.submitted < timings.first_chunk <= received
    assert timings.prefilled is None and timings.first_row is None
    assert timings.first_frame_row is None


# --------------------------------------------------------------------------- bench report


def test_bench_tabulates_the_stages_it_received() -> None:
    assert list(SERVER_STAGES) == STAGE_FIELDS
    ttfa = [45.0 + 2 * i for i in range(11)]
    rows: list[dict[str, Any]] = [
        {"queue_ms": 0.5, "first_chunk_ms": t - 5, "ttfa_ms": t, "prefill_ms": None} for t in ttfa
    ]
    level = {"target": "gateway", "mode": "concurrency", "level": 4.0}
    levels = [{**level, "server_metrics": server_metric_summaries(rows)}]
    lines = stage_table(levels).splitlines()
    assert len(lines) == 3 and lines[0].count("p50 / p90") == len(STAGE_ORDER)
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[:2] == ["gateway", "concurrency 4"]
    by_stage = dict(zip(STAGE_ORDER, cells[2:], strict=True))
    assert by_stage["ttfa"] == f"{np.percentile(ttfa, 50)} / {np.percentile(ttfa, 90)}"
    assert by_stage["queue"] == "0.5 / 0.5"
    assert by_stage["prefill"] == by_stage["first_row"] == by_stage["first_frame_row"] == "-"
    # A target without server metrics (HTTP, a peer) gets no table.
    assert stage_table([{**level, "server_metrics": {}}]) == ""


# --------------------------------------------------------------------------- talker stamps


class ScriptedRunner:
    """A ``TalkerRunner`` that stamps its stages at logged times, then plays fixed chunks."""

    def __init__(self, chunks: list[np.ndarray], prefill_s: float) -> None:
        self.chunks = chunks
        self.prefill_s = prefill_s
        self.stamped: dict[str, float] = {}
        self.sent_at: list[float] = []

    def submit(self, request: TalkerRequest) -> AsyncIterator[np.ndarray]:
        raise NotImplementedError("this runner only speaks")

    def speak(self, request: TalkerRequest, chunking: ChunkingParams) -> AsyncIterator[PcmChunk]:
        return self._chunks(request)

    async def _chunks(self, request: TalkerRequest) -> AsyncIterator[PcmChunk]:
        await asyncio.sleep(self.prefill_s)
        timings = request.timings
        assert timings is not None
        for stage in ("prefilled", "first_row", "first_frame_row"):
            await asyncio.sleep(0.002)  # distinct clock readings per stage
            self.stamped[stage] = time.perf_counter()
            setattr(timings, stage, self.stamped[stage])
        frame = 0
        for i, pcm in enumerate(self.chunks):
            self.sent_at.append(time.perf_counter())
            yield PcmChunk(frame, pcm, final=i == len(self.chunks) - 1)
            frame += pcm.size // 960

    async def abort(self, request_id: str) -> None:
        return None

    async def close(self) -> None:
        return None


@pytest.fixture
def tokenizer(tiny_checkpoint: Path) -> Iterator[HiggsTokenizer]:
    yield HiggsTokenizer.from_dir(tiny_checkpoint)


async def test_higgs_passes_the_talkers_stamps_and_stamps_the_first_chunk(
    tokenizer: HiggsTokenizer,
) -> None:
    # an empty chunk first: the first chunk with audio is what counts
    chunks = [np.zeros(0, np.float32), np.ones(960, np.float32), np.ones(1920, np.float32)]
    runner = ScriptedRunner(chunks, prefill_s=0.01)
    engine = HiggsEngine(runner, tokenizer)
    timings = SegmentTimings()
    request = SegmentRequest(
        "r", "hi", sampling=TalkerSampling(temperature=0.0), fixed_rows=3, timings=timings
    )
    got = [chunk async for chunk in engine.synthesize(request)]
    first_chunk_seen = time.perf_counter()
    await engine.close()
    assert [c.size for c in got] == [960, 1920]
    assert timings.submitted is not None
    assert timings.submitted + 0.01 <= runner.stamped["prefilled"]
    for stage in ("prefilled", "first_row", "first_frame_row"):
        assert getattr(timings, stage) == runner.stamped[stage]
    assert timings.first_chunk is not None
    assert runner.sent_at[1] <= timings.first_chunk <= first_chunk_seen


async def test_the_reference_runner_stamps_row_zero_and_the_row_completing_frame_zero(
    tiny_checkpoint: Path,
) -> None:
    from realtime_engine.model.loader import load_talker
    from realtime_engine.model.prompts import build_zero_shot_prompt
    from realtime_engine.talker.reference_runner import ReferenceRunner
    from realtime_engine.talker.types import TalkerTimings

    tiny = load_talker(tiny_checkpoint)
    runner = ReferenceRunner(tiny.model, codec=tiny.codec)
    timings = TalkerTimings()
    prompt = build_zero_shot_prompt(tiny.tokenizer, "hi")
    request = TalkerRequest("t", prompt, TalkerSampling(temperature=0.0), 64, 12, timings)
    submitted = time.perf_counter()
    try:
        stream = runner.speak(request, ChunkingParams(1, 1, 0, 0))
        first = await anext(stream)
        received = time.perf_counter()
        rest = [chunk async for chunk in stream]
    finally:
        await runner.close()
    assert first.start_frame == 0 and first.pcm.size == 960
    assert [c.start_frame for c in rest] == [1, 2, 3, 4]  # 12 rows: 5 frames
    assert rest[-1].final
    assert timings.prefilled is not None and timings.first_row is not None
    assert timings.first_frame_row is not None
    # one step per row: frame 0 needs 7 steps after the first row
    assert submitted < timings.prefilled <= timings.first_row < timings.first_frame_row < received


class RecordingPool(EncodePool):
    """The gateway's encode pool, noting where each stream's timeline stood at each
    hand-over and the deadline it was given."""

    def __init__(self) -> None:
        super().__init__(threads=1)
        self.pts_at_submit: list[int] = []
        self.deadlines: list[float] = []
        self.submitted_at: list[float] = []

    def submit(self, deadline: float, fn: Callable[..., T], /, *args: Any) -> Future[T]:
        self.pts_at_submit.append(fn.__self__.next_pts_ms)  # type: ignore[attr-defined]
        self.deadlines.append(deadline)
        self.submitted_at.append(time.perf_counter())
        return super().submit(deadline, fn, *args)


def speak_opus_through_a_recording_pool(
    engine: FakeEngine, text: str
) -> tuple[RecordingPool, dict[str, Any]]:
    app = fake_app(engine)
    pool = RecordingPool()
    app.state.gateway.encode_pool = pool
    with TestClient(app) as client:
        metrics = speak(client, text, session={"output": {"format": "opus"}})
    return pool, metrics


def test_first_audio_is_encoded_on_the_loop_and_later_chunks_on_the_pool() -> None:
    pool, metrics = speak_opus_through_a_recording_pool(
        FakeEngine(), "Hello there, this sentence is long enough for several chunks. "
    )
    # Opus chunks longer than the inline limit go to the pool, but never the
    # context's first one: every hand-over finds frames already made.
    assert len(pool.pts_at_submit) >= 3
    assert all(pts > 0 for pts in pool.pts_at_submit), pool.pts_at_submit
    assert_ordered(metrics, ["first_chunk", "encoded", "ttfa"])
    # Each hand-over's deadline is when the listener would run dry: the
    # first packet's departure plus the audio queued before it, so it moves
    # on by exactly the audio queued in between. (A chunk handed over before
    # the first packet left, read ahead from the engine, is due at once.)
    after = [d > at for d, at in zip(pool.deadlines, pool.submitted_at, strict=True)]
    assert after == sorted(after)  # due at once only until the first packet left
    pairs = zip(pool.deadlines, pool.pts_at_submit, after, strict=True)
    departed = [(d, pts) for d, pts, late in pairs if late]
    assert len(departed) >= 2
    gaps_s = np.diff([deadline for deadline, _ in departed])
    queued_s = np.diff([pts for _, pts in departed]) / 1000
    np.testing.assert_allclose(gaps_s, queued_s, atol=1e-3)


def test_a_first_chunk_longer_than_a_second_is_encoded_on_the_pool() -> None:
    # encoding it on the loop would hold every other session for its duration;
    # only its first packet is, so that it leaves at once
    pool, metrics = speak_opus_through_a_recording_pool(
        FakeEngine(chunk_samples=2 * 24_000), "A sentence long enough for two seconds. "
    )
    assert pool.pts_at_submit[0] == 20  # all but the first 20 ms packet went to the pool
    assert_ordered(metrics, ["first_chunk", "encoded", "ttfa"])


def test_the_first_packet_is_encoded_before_the_rest_of_its_chunk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fed: list[int] = []

    class RecordingEncoder(AudioEncoder):
        def feed(self, pcm: npt.ArrayLike) -> list[EncodedFrame]:
            fed.append(len(np.asarray(pcm)))
            return super().feed(pcm)

    monkeypatch.setattr(contexts, "AudioEncoder", RecordingEncoder)
    with TestClient(fake_app(FakeEngine())) as client:  # 160 ms chunks
        metrics = speak(
            client, "Hello there, this is a test. ", session={"output": {"format": "opus"}}
        )
    # one 20 ms packet's worth first (24 kHz in), then the rest of that chunk,
    # then the following chunks whole
    assert fed[:3] == [480, 3840 - 480, 3840]
    assert_ordered(metrics, ["first_chunk", "encoded", "ttfa"])
