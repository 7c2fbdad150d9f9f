"""``bench smoke``: an in-process gateway with the fake engine, a few seconds of load.

Checks the JSON and PNG outputs for structure and for values the fake engine's
configuration bounds: TTFA above its first-chunk delay and not far beyond it,
throughput no higher than the engine's real-time factor allows, no underruns
with a fast engine and underruns with a deliberately slow one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import matplotlib.image
import pytest

from bench.cli import main
from realtime_engine.engines.fake import FakeEngineConfig

FIRST_CHUNK_DELAY_MS = 50.0
# generous: two shared CI cores run the server, the clients and the decoder
TTFA_SLACK_MS = 1500.0


def run_smoke(out: Path, *extra: str) -> dict[str, Any]:
    argv = [
        "--smoke",
        "--out",
        str(out),
        "--no-progress",
        "--warmup",
        "0.3",
        "--duration",
        "2.0",
        "--first-chunk-delay-ms",
        str(FIRST_CHUNK_DELAY_MS),
        *extra,
    ]  # later flags win
    assert main(argv) == 0
    result: dict[str, Any] = json.loads((out / "smoke.json").read_text())
    return result


def check_pngs(out: Path) -> None:
    for name in ("smoke_ttfa_cdf.png", "smoke_vs_load.png", "smoke_gap_hist.png"):
        path = out / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        height, width = matplotlib.image.imread(path).shape[:2]
        assert width >= 300 and height >= 200


def test_smoke_fast_engine(tmp_path: Path) -> None:
    rtf = 0.1
    result = run_smoke(tmp_path, "--levels", "1,3", "--engine-rtf", str(rtf), "--tokens-per-s", "0")
    check_pngs(tmp_path)
    meta, config = result["meta"], result["config"]
    assert meta["kind"] == "smoke" and meta["hardware"]["cpu_cores"] >= 1
    assert "python" in meta["hardware"]["versions"]
    assert config["engine_rtf"] == rtf and config["seed"] == 0
    assert [lv["level"] for lv in result["levels"]] == [1.0, 3.0]
    for level in result["levels"]:
        assert level["errors"] == 0 and level["ok"] >= 1
        ttfa = level["ttfa_ms"]
        assert FIRST_CHUNK_DELAY_MS <= ttfa["min"] <= ttfa["p50"] <= ttfa["max"]
        assert ttfa["p50"] < FIRST_CHUNK_DELAY_MS + TTFA_SLACK_MS
        server = level["server_ttfa_ms"]
        assert server["n"] == level["ok"]
        assert 0 < server["p50"] <= ttfa["p50"] + 1.0  # the server's span sits inside ours
        # every stream generates at most 1/rtf audio-seconds per second
        assert 0 < level["throughput_audio_s_per_s"] <= level["level"] / rtf * 1.05
        assert level["rtf"]["p50"] < 1.0
        assert level["underruns_total"] == 0
        assert len(level["samples"]["ttfa_ms"]) == level["ok"]
    rows = result["streams"]
    assert rows and all(r["target"] == "gateway" for r in rows)
    assert sum(r["ok"] for r in rows) >= sum(lv["ok"] for lv in result["levels"])


def test_smoke_slow_engine_underruns(tmp_path: Path) -> None:
    rtf = 2.5  # 160 ms chunks every 400 ms: each stall ~240 ms, past the 100 ms threshold
    workers, window_s = 2, 2.0
    texts = ("Short and slow.", "Slow, but short.")
    # short texts (~0.8 s of audio, ~2 s to generate) and no warm-up keep this test short
    result = run_smoke(
        tmp_path,
        "--levels",
        str(workers),
        "--engine-rtf",
        str(rtf),
        "--format",
        "pcm16",
        "--tokens-per-s",
        "30",
        "--warmup",
        "0",
        "--duration",
        str(window_s),
        *(arg for text in texts for arg in ("--text", text)),
    )
    (level,) = result["levels"]
    assert level["ok"] >= 1
    assert level["underruns_total"] > 0 and level["streams_with_underrun"] >= 1
    assert level["underrun_s"]["max"] > 0.1
    assert level["gap_ms"]["max"] > 100.0
    # Throughput is bound by the engine. Per worker (streams run one after another) the
    # window holds at most window/rtf of paced audio plus one free first chunk for each
    # stream that starts in it (one per stream's paced time, +2 at the window's edges).
    chunk_s = FakeEngineConfig().chunk_samples / FakeEngineConfig().sample_rate
    audio_s = min(len(t) for t in texts) * FakeEngineConfig().seconds_per_char
    paced_s = (audio_s - chunk_s) * rtf
    bound = workers * (1 / rtf + (1 / paced_s + 2 / window_s) * chunk_s)
    # a busy machine only lowers throughput, hence the loose lower bound
    assert 0.15 * workers / rtf <= level["throughput_audio_s_per_s"] <= bound
    # the fake engine's first chunk is free (only the first-chunk delay): RTF sits a bit under
    # the engine's; a busy machine only raises it
    assert rtf * 0.6 <= level["rtf"]["p50"] <= rtf * 2.0


def test_module_entry_point() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0
    assert "usage:" in proc.stdout and "overhead" in proc.stdout


@pytest.mark.parametrize("argv", [["smoke", "--help"], ["overhead", "--help"], ["run", "--help"]])
def test_subcommand_help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    assert "--out" in capsys.readouterr().out


def test_bad_levels_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--url", "http://127.0.0.1:9", "--levels", "0,-1"])
    assert exit_.value.code == 2
    assert "levels must be positive" in capsys.readouterr().err


def test_overhead_run_measures_lateness(tmp_path: Path) -> None:
    argv = [
        "overhead",
        "--sessions",
        "4",
        "--warmup",
        "1.0",
        "--duration",
        "2.0",
        "--ramp",
        "0.5",
        "--engine-rtf",
        "0.2",  # ~1 s per context: new contexts start inside the window
        "--frame-ms",
        "40",
        "--out",
        str(tmp_path),
        "--no-progress",
    ]
    assert main(argv) == 0
    result = json.loads((tmp_path / "overhead.json").read_text())
    assert result["sessions_ok"] == 4 and result["errors"] == []
    assert result["contexts_ok"] >= 1
    late = result["lateness_ms"]
    # frames cannot arrive before the engine emitted their samples
    assert late["n"] > 100 and late["min"] > 0
    assert result["frames_unmatched"] <= result["frames_in_window"] * 0.05
    assert result["chunk_first_frame_lateness_ms"]["n"] > 0
    assert result["server_rss_mb"]["min"] > 10
    # 4 sessions at 5x real time deliver at most 20 audio-s/s
    assert 0 < result["audio_s_per_s"] <= 4 / 0.2 * 1.05
    assert result["server_cpu_ms_per_audio_s"] > 0
    # the event loop's thread is a part of the process
    loop_ms = result["server_loop_cpu_ms_per_audio_s"]
    assert 0 < loop_ms <= result["server_cpu_ms_per_audio_s"] * 1.2
    # 40 ms frames asked for (a segment's last PCM frame may be shorter)
    audio_ms = result["audio_s_per_s"] * 2.0 * 1000
    assert 30 <= audio_ms / result["frames_in_window"] <= 40.01
    assert (tmp_path / "overhead_lateness.png").read_bytes()[:4] == b"\x89PNG"
