"""bench.gpu.fused_unit_bench's smoke check: the tiny codec on the CPU through
Triton's interpreter, every unit and launch checked against the layers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.gpu.fused_unit_bench import main

pytest.importorskip("triton", reason="the kernel is Triton's (a vLLM dependency)")


def test_every_fused_launch_matches_the_layers_and_the_summary_adds_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    argv = ["--tiny", "--batch", "2", "--tiles", "16,64", "--warps", "4", "--out", str(tmp_path)]
    assert main(argv) == 0
    report = json.loads((tmp_path / "fused_unit_bench.json").read_text())
    rows = report["rows"]
    units = {r["unit"] for r in rows}
    assert len(units) == 15  # the tiny codec's units are all narrow enough
    fused = [r for r in rows if r["variant"] == "fused"]
    assert len(fused) == 4 * len(units)  # two launches, each with and without the activation
    launches = {(r["activate"], r["tile"], r["warps"]) for r in fused}
    assert launches == {(a, t, 4) for a in (False, True) for t in (16, 64)}
    assert report["summary"]["worst_error"] < 1e-5
    assert set(report["summary"]["best_launch_by_channels"]) == {"8", "16"}
