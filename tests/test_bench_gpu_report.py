"""``bench.gpu.report``: per-level results merged into one, and the run's summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.gpu.report import combine, main, merge
from bench.stats import summarize
from bench.sweep import table


def _result(level: float, target: str = "gateway") -> dict:
    summary = {
        "target": target,
        "mode": "closed",
        "level": level,
        "ok": 2,
        "streams_measured": 2,
        "ttfa_ms": {"p50": 100.0, "p90": 120.0, "p99": 130.0},
        "server_ttfa_ms": {"p50": 50.0},
        "rtf": {"p50": 0.3},
        "throughput_audio_s_per_s": 3.0 * level,
        "underruns_total": 0,
        "streams_with_underrun": 0,
        "error_samples": [],
        "samples": {"ttfa_ms": [100.0, 120.0], "gap_ms": [20.0, 20.0]},
    }
    return {
        "meta": {"kind": "run", "argv": ["run", "--levels", str(level)]},
        "config": {"levels": [level], "url": "http://x", "audio_seconds": 10.0},
        "levels": [summary],
        "streams": [{"target": target, "level": level, "stream": 0}],
    }


def test_merge_keeps_order_and_relabels() -> None:
    merged = merge([("latency", _result(1)), (None, _result(16))])
    assert [lv["level"] for lv in merged["levels"]] == [1, 16]
    assert [lv["target"] for lv in merged["levels"]] == ["gateway latency", "gateway"]
    assert merged["streams"][0]["target"] == "gateway latency"
    assert merged["config"]["levels"] == [1, 16] and merged["meta"]["merged_from"] == 2


def test_merge_command_and_summary(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    for level in (1, 16):
        (tmp_path / f"sweep_c{level}.json").write_text(json.dumps(_result(level)))
    parts = [str(tmp_path / "sweep_c1.json"), str(tmp_path / "sweep_c16.json")]
    missing = str(tmp_path / "sweep_c64.json")  # a skipped level is left out
    assert main(["merge", str(tmp_path), "sweep", *parts, missing]) == 0
    merged = json.loads((tmp_path / "sweep.json").read_text())
    assert [lv["level"] for lv in merged["levels"]] == [1, 16]
    assert (tmp_path / "sweep_vs_load.png").stat().st_size > 1000
    (tmp_path / "steps.tsv").write_text("sweep_c64\tskipped\t0\tneeds 50s\n")
    (tmp_path / "cpu.csv").write_text(
        "t_s,role,pid,cpu_pct,rss_mb\n2.0,bench,7,40,90\n4.0,bench,7,99,95\n4.0,gateway,5,120,900\n"
        "4.0,gateway loop thread,5,97,900\n"
    )
    (tmp_path / "gpu.csv").write_text(
        "timestamp, utilization.gpu [%], memory.used [MiB]\nt, 0 %, 10 MiB\nt, 80 %, 10 MiB\n"
    )
    assert main(["summary", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "## Closed-loop concurrency sweep" in text and "| gateway | closed 16 |" in text
    assert "sweep_c64\tskipped" in text
    assert "- bench: CPU % of one core, median 99, max 99" in text
    assert "- gateway: CPU % of one core, median 120, max 120" in text
    assert "- gateway loop thread: CPU % of one core, median 97, max 97" in text
    assert "GPU utilization %: mean while busy 80, max 80" in text
    assert main(["merge", str(tmp_path), "none", missing]) == 1


def _part(level: int, ttfas: list[float], throughput: float, underruns: int) -> dict:
    streams = [
        {
            "target": "gateway",
            "level": level,
            "stream": i,
            "in_window": True,
            "ok": True,
            "ttfa_ms": t,
            "server_ttfa_ms": None,
            "rtf": 0.25,
            "audio_s": 10.0,
            "chunks": 12,
            "max_gap_ms": 90.0,
            "stall_s": 0.0,
            "connect_ms": 3.0,
            "ttfa_decoded_ms": None,
            "first_underrun_audio_s": 0.16 if i < underruns else None,
        }
        for i, t in enumerate(ttfas)
    ]
    streams.append({**streams[0], "in_window": False, "ttfa_ms": 9999.0})  # warm-up stream
    result = _result(level)
    result["levels"][0].update(
        streams_started=len(streams),
        streams_measured=len(ttfas),
        ok=len(ttfas),
        errors=0,
        throughput_audio_s_per_s=throughput,
        audio_s_in_window=throughput * 15,
        underruns_total=underruns,
        streams_with_underrun=min(underruns, 1),
        samples={"ttfa_ms": list(ttfas), "gap_ms": [60.0] * len(ttfas)},
    )
    result["streams"] = streams
    return result


def test_combine_pools_streams_and_sums_rates() -> None:
    a = _part(64, [100.0, 110.0, 300.0], throughput=150.0, underruns=0)
    b = _part(64, [120.0, 500.0], throughput=149.5, underruns=2)
    combined = combine([a, b])
    (level,) = combined["levels"]
    assert level["level"] == 128 and combined["config"]["levels"] == [128]
    assert level["throughput_audio_s_per_s"] == 299.5
    assert (level["streams_measured"], level["ok"], level["streams_started"]) == (5, 5, 7)
    assert (level["underruns_total"], level["streams_with_underrun"]) == (2, 1)
    # percentiles of the pooled in-window streams, not of the parts' summaries
    assert level["ttfa_ms"] == summarize([100.0, 110.0, 300.0, 120.0, 500.0], 2)
    assert level["samples"]["ttfa_ms"] == [100.0, 110.0, 300.0, 120.0, 500.0]
    assert level["client_processes"] == 2 and level["total_ms"]["n"] == 0
    assert [r["stream"] for r in combined["streams"]] == list(range(7))
    assert {r["level"] for r in combined["streams"]} == {128}
    # where the underruns began, pooled over the streams that had one
    assert level["first_underrun_audio_s"] == summarize([0.16, 0.16], 3)
    assert "| 2 (1), first at 0.16 s |" in table([level])


def test_combine_refuses_mixed_inputs(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        combine([])
    two_levels = merge([(None, _result(1)), (None, _result(2))])
    with pytest.raises(ValueError):
        combine([two_levels])
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_part(8, [50.0], 10.0, 0)))
    out = str(tmp_path / "out.json")
    assert main(["combine", out, str(path), str(tmp_path / "gone.json")]) == 1
    assert main(["combine", out, str(path), str(path)]) == 0
    assert json.loads((tmp_path / "out.json").read_text())["levels"][0]["level"] == 16


def test_levels_keeps_each_levels_figures_and_drops_the_streams(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "sweep_c64.json").write_text(json.dumps(_result(64)))
    (tmp_path / "preset_exact.json").write_text(json.dumps(_result(1)))
    (tmp_path / "notes.json").write_text(json.dumps({"not": "a result"}))
    (tmp_path / "broken.json").write_text("{")
    assert main(["levels", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert sorted(out) == ["preset_exact_c1", "sweep_c64"]
    level = out["sweep_c64"]
    assert level["ttfa_ms"] == {"p50": 100.0, "p90": 120.0, "p99": 130.0}
    assert level["throughput_audio_s_per_s"] == 192.0
    # the per-stream lists stay on the machine
    assert "samples" not in level and "error_samples" not in level
