"""The preset measurement script runs end to end and its numbers hang together."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from realtime_engine.tools.measure_presets import main


def test_measure_presets_tiny(tmp_path: Path) -> None:
    out = tmp_path / "presets.json"
    threads = torch.get_num_threads()
    try:
        main(["--streams", "1", "--frames", "25", "--threads", "1", "--json", str(out)])
    finally:
        torch.set_num_threads(threads)
    results = json.loads(out.read_text())
    errors = {e["preset"]: e for e in results["edge_error"]}
    assert errors["exact"]["max_rel_peak"] < 1e-5
    assert errors["latency"]["max_rel_peak"] > errors["exact"]["max_rel_peak"]
    assert errors["latency"]["worst_snr_db"] < errors["exact"]["worst_snr_db"]
    first = {f["preset"]: f for f in results["first_audio"]}
    # latency: 7 delay rows + 1 frame + 2 holdback = 10 rows = 400 ms at 25 rows/s
    assert first["latency"]["rows"] == 10
    assert first["latency"]["ms_at_25_rows_per_s"] == 400
    assert first["exact"]["rows"] == 7 + 4 + 10
    playback = results["playback"]
    assert {(b["preset"], b["speed"]) for b in playback} >= {("balanced", 1.0), ("balanced", 3.0)}
    for b in playback:
        assert b["matched"]["pauses"] == 0  # growth <= speed never pauses
        assert b["plain"]["longest_ms"] > 0  # jumping to chunk_frames always pauses here
        if b["speed"] >= 1.5:
            assert b["ramp"]["pauses"] == 0
        else:  # below the default growth the ramp only splits the stall
            assert 0 < b["ramp"]["longest_ms"] < b["plain"]["longest_ms"]
