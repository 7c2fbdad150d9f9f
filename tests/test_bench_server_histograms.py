"""Per-step digests of the server's cumulative histograms (``bench.gpu.server_histograms``)."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from bench.gpu.server_histograms import (
    audio_digest,
    engine_digest,
    lag_digest,
    read_snapshot,
    stage_digest,
    step_lines,
)
from gateway.metrics import EngineStatsSampler, GatewayMetrics
from gateway.metrics_merge import merge_expositions


def _scrape(metrics: GatewayMetrics) -> str:
    return metrics.render().decode()


def test_each_step_gets_its_own_share_of_the_cumulative_histograms(tmp_path: Path) -> None:
    metrics = GatewayMetrics()
    # step one: two contexts, a quiet loop
    for ttfa in (0.08, 0.10):
        metrics.observe_stages({"queue": 0.001, "first_chunk": ttfa - 0.002, "ttfa": ttfa})
    for _ in range(10):
        metrics.event_loop_lag_seconds.observe(0.0004)
    (tmp_path / "metrics_preset_exact.txt").write_text(_scrape(metrics))
    # step two: one slow context, and a loop that stalled twice
    metrics.observe_stages({"queue": 0.05, "first_chunk": 0.6, "encoded": 0.601, "ttfa": 0.9})
    for lag in [0.0015] * 8 + [0.7, 0.8]:
        metrics.event_loop_lag_seconds.observe(lag)
    (tmp_path / "metrics_sweep_c128.txt").write_text(_scrape(metrics))
    (tmp_path / "steps.tsv").write_text(
        "prep\tok\t10\t\npreset_exact\tok\t16\t\nsweep_c64\tskipped\t0\t\nsweep_c128\tok\t31\t\n"
    )
    first, second = step_lines(tmp_path)
    assert first.startswith("- preset_exact: stages (mean ms) queue 1 / first_chunk 88 / ttfa 90;")
    assert "10 samples, p50 <= 0.5 ms, p99 <= 0.5 ms, 0 over 100 ms" in first
    assert second.startswith(
        "- sweep_c128: stages (mean ms) queue 50 / first_chunk 600 / encoded 601 / ttfa 900;"
    )
    assert "10 samples, p50 <= 2 ms, p99 <= 1000 ms, 2 over 100 ms" in second


def test_nothing_to_digest_gives_no_line(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    Histogram("other_seconds", "unrelated", registry=registry).observe(1.0)
    snapshot = read_snapshot(generate_latest(registry).decode())
    assert snapshot == {}
    assert lag_digest(snapshot) is None and stage_digest(snapshot) is None
    assert step_lines(tmp_path) == []  # no steps.tsv


def test_a_steps_engine_samples_say_how_full_its_batches_were(tmp_path: Path) -> None:
    from realtime_engine.talker.vllm_runner import EngineStepStats

    metrics = GatewayMetrics()
    sampler = EngineStatsSampler(metrics)
    sampler.observe(EngineStepStats(0, 0, 0.0))
    (tmp_path / "metrics_preset_exact.txt").write_text(_scrape(metrics))
    # ten one-second samples: nine of 100 steps of 150 requests at 10 ms, one of
    # 100 steps of 250 requests at 12 ms
    steps = rows = 0
    total_s = 0.0
    for batch, step_s in [(150, 0.010)] * 9 + [(250, 0.012)]:
        steps, rows, total_s = steps + 100, rows + 100 * batch, total_s + 100 * step_s
        sampler.observe(EngineStepStats(steps, rows, total_s / steps))
    (tmp_path / "metrics_sweep_c256.txt").write_text(_scrape(metrics))
    (tmp_path / "steps.tsv").write_text("preset_exact\tok\t16\t\nsweep_c256\tok\t31\t\n")
    (line,) = step_lines(tmp_path)  # the first step had no engine sample, nor anything else
    assert line.startswith("- sweep_c256:")
    assert line.endswith("engine 10 samples, step mean 10.2 ms, batch mean 160, p90 <= 256")
    assert engine_digest(read_snapshot(_scrape(GatewayMetrics()))) is None


def test_a_steps_talker_audio_says_how_much_was_never_sent(tmp_path: Path) -> None:
    """Audio the talker made (summed over its ranks) against audio sent, per step."""
    metrics = GatewayMetrics()
    metrics.talker_audio_seconds.labels(rank="0").inc(10)
    metrics.audio_seconds_out.inc(10)
    metrics.observe_stages({"ttfa": 0.09})
    (tmp_path / "metrics_preset_exact.txt").write_text(_scrape(metrics))
    metrics.talker_audio_seconds.labels(rank="0").inc(600)
    metrics.talker_audio_seconds.labels(rank="1").inc(400)
    metrics.audio_seconds_out.inc(905)  # 95 s made for streams cut first
    metrics.engine_rows.inc(31_250)  # rows for 1,250 s: 250 s never decoded
    metrics.observe_stages({"ttfa": 0.4})
    (tmp_path / "metrics_sweep_c256.txt").write_text(_scrape(metrics))
    (tmp_path / "steps.tsv").write_text("preset_exact\tok\t16\t\nsweep_c256\tok\t31\t\n")
    first, second = step_lines(tmp_path)
    assert first.endswith("; talker audio 10 s made, 0.0% never sent")
    assert second.endswith(
        "; talker audio 1000 s made, 9.5% never sent; rows for 1250 s, 27.6% never sent"
    )
    assert audio_digest(read_snapshot(_scrape(GatewayMetrics()))) is None


def test_several_workers_scrapes_are_summed_over_their_worker_label(tmp_path: Path) -> None:
    """``serve --workers 2``: a merged scrape labels each worker's own samples; a step's
    digests count both workers' contexts, and the shared engine once."""
    from realtime_engine.talker.vllm_runner import EngineStepStats

    workers = [GatewayMetrics(), GatewayMetrics()]
    samplers = [EngineStatsSampler(m) for m in workers]
    for sampler in samplers:
        sampler.observe(EngineStepStats(0, 0, 0.0))

    def scrape(name: str) -> None:
        merged = merge_expositions([_scrape(m) for m in workers]).decode()
        assert 'worker="1"' in merged
        (tmp_path / f"metrics_{name}.txt").write_text(merged)

    scrape("preset_exact")
    # worker 0: two contexts at 100 ms; worker 1: one at 400 ms and a loop that stalled
    for ttfa in (0.1, 0.1):
        workers[0].observe_stages({"ttfa": ttfa})
    workers[1].observe_stages({"ttfa": 0.4})
    for lag in [0.0015] * 8:
        workers[0].event_loop_lag_seconds.observe(lag)
    workers[1].event_loop_lag_seconds.observe(0.7)
    workers[1].event_loop_lag_seconds.observe(0.8)
    for i, metrics in enumerate(workers):
        metrics.audio_seconds_out.inc(300)
        metrics.talker_audio_seconds.labels(rank=str(i)).inc(400)
    # The one engine, seen by both workers: 100 steps of 8 requests at 10 ms; worker 1
    # saw it last, so its one sample is the scrape's.
    samplers[0].observe(EngineStepStats(50, 400, 0.010))
    samplers[1].observe(EngineStepStats(100, 800, 0.010))
    scrape("sweep_c64")
    (tmp_path / "steps.tsv").write_text("preset_exact\tok\t16\t\nsweep_c64\tok\t31\t\n")
    (line,) = step_lines(tmp_path)
    assert line.startswith("- sweep_c64: stages (mean ms) ttfa 200;")
    assert "10 samples, p50 <= 2 ms, p99 <= 1000 ms, 2 over 100 ms" in line
    assert "engine 1 samples, step mean 10.0 ms, batch mean 8, p90 <= 8" in line
    # 800 s made and 600 sent; 800 rows (the engine's, once) stand for 32 s
    assert line.endswith(
        "; talker audio 800 s made, 25.0% never sent; rows for 32 s, 0.0% never sent"
    )
