"""``python -m bench.codec_throughput`` end to end at tiny size (CPU)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.codec_throughput import main, steady_window
from realtime_engine.codec.presets import PRESETS


def test_steady_windows_follow_the_presets() -> None:
    for name, p in PRESETS.items():
        window, emitted = steady_window(name)
        assert emitted == p.chunk_frames
        assert window == p.left_context_frames + p.chunk_frames + p.right_holdback_frames


def test_writes_one_row_per_setting_with_positive_rates(tmp_path: Path) -> None:
    argv = ["--tiny", "--batches", "1,2", "--presets", "latency", "--precisions", "fp32,tf32"]
    assert main([*argv, "--iters", "1", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "codec_throughput.json").read_text())
    rows = report["results"]
    assert [(r["precision"], r["batch"]) for r in rows] == [
        ("fp32", 1),
        ("fp32", 2),
        ("tf32", 1),
        ("tf32", 2),
    ]
    for r in rows:
        assert r["ms_per_call"] > 0
        seconds_emitted = r["batch"] * r["emitted_frames"] / 25
        assert (
            abs(r["audio_s_per_s"] - seconds_emitted / (r["ms_per_call"] / 1000))
            < 0.2 + 0.01 * r["audio_s_per_s"]
        )
