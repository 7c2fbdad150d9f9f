"""Engine counters sampled into Prometheus histograms."""

from __future__ import annotations

import gc
from dataclasses import dataclass

from gateway.metrics import EngineStatsSampler, GatewayMetrics
from gateway.realtime.outbound import Outbound, OutClose


@dataclass(frozen=True)
class Stats:
    steps: int
    rows: int
    mean_step_s: float
    waiting: int


def sample(metrics: GatewayMetrics, name: str) -> float:
    value = metrics.registry.get_sample_value(name)
    assert value is not None, name
    return value


def test_sampler_records_interval_means() -> None:
    metrics = GatewayMetrics()
    sampler = EngineStatsSampler(metrics)
    sampler.observe(Stats(steps=0, rows=0, mean_step_s=0.0, waiting=0))
    assert sample(metrics, "speech_engine_step_seconds_count") == 0
    sampler.observe(Stats(steps=10, rows=40, mean_step_s=0.004, waiting=3))
    sampler.observe(Stats(steps=30, rows=200, mean_step_s=0.007, waiting=1))
    sampler.observe(Stats(steps=30, rows=200, mean_step_s=0.007, waiting=0))  # idle: no sample
    assert sample(metrics, "speech_engine_step_seconds_count") == 2
    # First interval: 10 steps of 4 ms, batch 4; second: 20 steps totalling 170 ms, batch 8.
    assert abs(sample(metrics, "speech_engine_step_seconds_sum") - (0.004 + 0.0085)) < 1e-9
    assert sample(metrics, "speech_engine_batch_size_sum") == 4 + 8
    assert sample(metrics, "speech_engine_waiting_requests") == 0
    assert sample(metrics, "speech_engine_rows_total") == 200
    sampler.observe(Stats(steps=5, rows=20, mean_step_s=0.004, waiting=0))  # a new engine
    sampler.observe(Stats(steps=6, rows=24, mean_step_s=0.004, waiting=0))
    assert sample(metrics, "speech_engine_rows_total") == 204


def test_registries_are_per_instance() -> None:
    first, second = GatewayMetrics(), GatewayMetrics()
    first.error("server_error", "engine_error")
    assert (
        first.registry.get_sample_value(
            "speech_errors_total", {"type": "server_error", "code": "engine_error"}
        )
        == 1
    )
    assert (
        second.registry.get_sample_value(
            "speech_errors_total", {"type": "server_error", "code": "engine_error"}
        )
        is None
    )


async def test_outbound_depth_counts_the_items_of_every_live_queue() -> None:
    metrics = GatewayMetrics()
    first, second = Outbound(8, metrics), Outbound(8, metrics)
    for _ in range(3):
        await first.put(OutClose(1000, "bye"))
    await second.put(OutClose(1000, "bye"))
    assert sample(metrics, "speech_outbound_queue_depth") == 4
    assert await first.get() == OutClose(1000, "bye")
    assert sample(metrics, "speech_outbound_queue_depth") == 3
    first.drain()
    assert sample(metrics, "speech_outbound_queue_depth") == 1
    del second
    gc.collect()
    assert sample(metrics, "speech_outbound_queue_depth") == 0


def test_the_vllm_talkers_engine_cores_fill_the_step_histograms() -> None:
    from realtime_engine.talker.vllm_protocol import StepStats
    from realtime_engine.talker.vllm_runner import sum_step_stats

    metrics = GatewayMetrics()
    metrics.engine_waiting.set(5)
    sampler = EngineStatsSampler(metrics)
    assert sum_step_stats({}) is None  # nothing heard yet
    # two data-parallel cores: 10 steps of batch 4 at 5 ms, 30 of batch 2 at 10 ms
    first = {0: StepStats(10, 40, 10, 0.050), 1: StepStats(30, 60, 30, 0.300)}
    total = sum_step_stats(first)
    assert total is not None and (total.steps, total.rows) == (40, 100)
    assert abs(total.mean_step_s - 0.35 / 40) < 1e-12
    sampler.observe(total)
    assert sample(metrics, "speech_engine_batch_size_sum") == 100 / 40
    assert abs(sample(metrics, "speech_engine_step_seconds_sum") - 0.35 / 40) < 1e-12
    assert sample(metrics, "speech_engine_waiting_requests") == 5  # not known: left alone
