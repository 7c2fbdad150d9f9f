"""``bench.gpu.parallel_report`` and ``run_h200_x2.sh``: one GPU vs DP=2 vs TP=2, without a GPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from script_support import dry_run

from bench.gpu.parallel_report import (
    capacity,
    main,
    meets_bound,
    rank_streams,
    read_layout,
    table,
)
from gateway.metrics import GatewayMetrics
from gateway.metrics_merge import merge_expositions


def _level(
    c: int, p95: float, underrun: int = 0, rate: float | None = None, errors: int = 0
) -> dict:
    return {
        "level": c,
        "streams_measured": max(c, 1),
        "errors": errors,
        "ttfa_ms": {"p50": p95 / 2, "p95": p95},
        "streams_with_underrun": underrun,
        "throughput_audio_s_per_s": rate if rate is not None else 2.0 * c,
    }


def _write(folder: Path, presets: dict[str, float], levels: list[dict[str, Any]]) -> Path:
    folder.mkdir()
    preset_levels = [
        {"target": f"gateway {name}", "level": 1, "ttfa_ms": {"p50": ms}}
        for name, ms in presets.items()
    ]
    (folder / "presets.json").write_text(json.dumps({"levels": preset_levels}))
    (folder / "sweep.json").write_text(json.dumps({"levels": levels}))
    return folder


def test_capacity_is_the_largest_level_within_both_bounds() -> None:
    levels = [_level(1, 70), _level(64, 240), _level(128, 260), _level(256, 200, underrun=1)]
    assert [meets_bound(lv) for lv in levels] == [True, True, False, False]
    cap = capacity(levels)
    assert cap is not None and cap["level"] == 64
    assert capacity([_level(64, 100, errors=3)]) is None  # failed streams are not capacity
    assert capacity([]) is None


def test_each_ranks_streams_are_summed_over_the_servers_workers() -> None:
    """A server with several workers labels each worker's own samples (and rank 1 here
    served streams of one worker only)."""
    first, second = GatewayMetrics(), GatewayMetrics()
    first.talker_streams.labels(rank="0").inc(70)
    first.talker_streams.labels(rank="1").inc(64)
    second.talker_streams.labels(rank="0").inc(70)
    merged = merge_expositions([first.render().decode(), second.render().decode()])
    assert 'rank="0",worker="1"' in merged.decode()
    assert rank_streams(merged.decode()) == {0: 140.0, 1: 64.0}
    assert rank_streams(first.render().decode()) == {0: 70.0, 1: 64.0}  # one worker
    assert rank_streams("curl: (7) Failed to connect\n") == {}


def test_the_table_compares_every_layout_with_one_gpu(tmp_path: Path) -> None:
    one = _write(
        tmp_path / "one",
        {"latency": 60.0, "balanced": 70.0, "exact": 95.0},
        [_level(1, 70), _level(64, 240, rate=120.0), _level(128, 600, underrun=9, rate=180.0)],
    )
    dp2 = _write(
        tmp_path / "dp2",
        {"balanced": 69.0},
        [_level(1, 70), _level(64, 150, rate=125.0), _level(128, 230, rate=230.0)],
    )
    scrape = (
        'speech_talker_streams_total{rank="0"} 140.0\nspeech_talker_streams_total{rank="1"} 139.0\n'
    )
    (dp2 / "metrics_sweep_c64.txt").write_text('speech_talker_streams_total{rank="0"} 1.0\n')
    (dp2 / "metrics_sweep_c128.txt").write_text(scrape)
    layouts = [read_layout("one", one), read_layout("dp2", dp2), read_layout("tp2", tmp_path)]
    assert layouts[1].rank_streams == {0: 140.0, 1: 139.0}  # the last level's scrape
    text = table(layouts)
    assert "| one | 60.0 / 70.0 / 95.0 | 120.0 | 64 | 120.0 | 180.0 (128) | — |" in text
    assert "| dp2 | — / 69.0 / — | 125.0 | 128 | 230.0 | 230.0 (128) | 0: 140, 1: 139 |" in text
    assert "| tp2 | — / — / — | — | none | — | — | — |" in text
    # Against one GPU: twice the streams, 230/120 the rate at capacity, 230/180 at the peak.
    assert "| dp2 | 2.00× | 1.92× | 1.28× |" in text
    assert "| tp2 | — | — | — |" in text


def test_the_report_needs_named_folders(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["just-a-folder"]) == 2
    assert "one=DIR" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("layout", "flag", "levels"),
    [
        ("dp2", "--data-parallel-size 2", "1,64,128,256,384,512"),
        ("tp2", "--tensor-parallel-size 2", "1,64,128"),
        ("one", "", "1,64,128,256,384"),
    ],
)
def test_the_two_gpu_script_dry_runs_each_layout(
    tmp_path: Path, layout: str, flag: str, levels: str
) -> None:
    lines = dry_run("bench/gpu/run_h200_x2.sh", tmp_path, LAYOUT=layout)
    out = "\n".join(lines)
    serve = next(line for line in lines if "gateway.cli serve" in line)
    assert serve.split(" > ")[0].endswith(f"--port 8000 {flag}".rstrip())
    for c in levels.split(","):
        assert f"/results_{layout}/sweep_c{c}" in out
    assert f"/sweep_c{int(levels.split(',')[-1]) + 1}" not in out
    assert "bench.gpu.parallel_report" in out
